"""The one way Forge opens and uses a model: a Hugging Face directory or a GGUF file, and the model families.

    from models.access import open_model
    model = open_model("runs/tiny-cpu/sft/model")            # or "model-q4_k_m.gguf" (llama.cpp)
    ids = model.encode("What does len() return?")            # the model's own tokenizer
    model.perplexity(ids, window=256, stride=128).ppl        # sliding-window perplexity (models/perplexity.py)
    model.generate(ids, 32)                                  # greedy; sampling with temperature/top_k/seed

  access.py      open_model, Backend (HFBackend, GGUFBackend): tokenize, logits, scores, generation, chat template
  perplexity.py  the sliding-window perplexity both backends share
  gguf.py        GGUF integrity check, metadata, loading through llama.cpp
  families.py    one architecture spec per model family (llama, gpt2): HF config, feed-forward rule, memory terms,
                 decoder-layer path, GGUF hyperparameters and tensor transforms

Evaluation, quantization and serving all go through here; nothing else loads a model for inference.
"""
