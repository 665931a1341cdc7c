"""Quantization, serving (llama.cpp on CPU, vLLM on GPU), the chat UI and CPU deploy bundles."""
