"""`forge serve`: the real llama.cpp server behind the official `openai` client (streamed and not), readiness by a
real completion, clean shutdown, backend selection, the vLLM command line and a bounded loopback load test.

The helpers here (a tiny random Llama GGUF built in a few seconds, a started server) are shared with
test_bundle.py and test_chat.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import free_port

from forge import ForgeError
from forge.config import ForgeConfig

ALIAS = "forge-tiny"


def tiny_gguf(base: Path) -> Path:
    """A random-init Llama (hidden 256, 2 layers, context 512) with our BPE and chat template, as an f16 GGUF.
    Built once per test session under `base`."""
    from test_gguf_export import make_model_dir, make_tokenizer_dir

    from serve.gguf_export import export_gguf

    out = base / "tiny-serve" / "model-f16.gguf"
    if not out.is_file():
        root = out.parent
        tok = make_tokenizer_dir(root / "tokenizer")
        model_dir = make_model_dir(root / "model", "llama", tok, context_length=512)
        export_gguf(model_dir, root / "tmp.gguf", name=ALIAS)
        (root / "tmp.gguf").rename(out)
    return out


def serve_cfg(**serve) -> ForgeConfig:
    return ForgeConfig.model_validate({"registry": {"model_name": ALIAS}, "serve": {"n_ctx": 512, **serve}})


@pytest.fixture(scope="session")
def gguf_path(tmp_path_factory) -> Path:
    return tiny_gguf(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def server(gguf_path):
    from serve.stage import plan_server

    backend, info = plan_server(serve_cfg(), gguf=gguf_path, port=free_port())
    with backend:
        yield backend, info


def _client(server):
    from openai import OpenAI

    backend, _ = server
    return OpenAI(base_url=backend.base_url, api_key="none", timeout=60, max_retries=0)


def test_non_streamed_chat_completion(server):
    resp = _client(server).chat.completions.create(
        model=ALIAS,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a list?"}],
        max_tokens=12,
        temperature=0.8,
        seed=1,
    )
    assert len(resp.choices) == 1
    assert isinstance(resp.choices[0].message.content, str)
    assert resp.choices[0].message.role == "assistant"
    assert 1 <= resp.usage.completion_tokens <= 12
    assert resp.usage.prompt_tokens > 5  # the chat template wrapped the two messages
    assert resp.choices[0].finish_reason in ("stop", "length")


def test_streamed_chat_completion(server):
    stream = _client(server).chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "Hi"}], max_tokens=16, stream=True, temperature=1.0, seed=2
    )
    deltas, finish = [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        if chunk.choices[0].delta.content:
            deltas.append(chunk.choices[0].delta.content)
        finish = chunk.choices[0].finish_reason or finish
    assert len(deltas) >= 2, "expected the answer in several chunks"
    assert finish in ("stop", "length")


def test_models_lists_the_alias(server):
    ids = [m.id for m in _client(server).models.list().data]
    assert ids == [ALIAS]


def test_load_burst_of_8_concurrent_chats(server):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from serve_load import load_test

    backend, _ = server
    report = load_test(backend.base_url, ALIAS, n=8, concurrency=8, max_tokens=24)
    print("\nload test:", report)
    assert report["errors"] == 0, report["error_messages"]
    assert report["completion_tokens"] >= 8
    assert 0 < report["p50_s"] <= report["p95_s"]
    assert report["tokens_per_s"] > 0
    assert backend.proc.poll() is None  # still up after the burst


def test_load_test_refuses_non_loopback():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from serve_load import load_test

    with pytest.raises(SystemExit, match="loopback"):
        load_test("http://10.0.0.1:8080/v1", ALIAS)


def test_api_key_is_required_when_set(gguf_path, monkeypatch):
    from openai import AuthenticationError, OpenAI

    from serve.stage import plan_server

    monkeypatch.setenv("FORGE_API_KEY", "s3cret")
    backend, _ = plan_server(serve_cfg(), gguf=gguf_path, port=free_port())
    assert "--api_key" in backend.command
    with backend:
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=backend.base_url, api_key="wrong", max_retries=0).chat.completions.create(
                model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        proc = backend.proc
    assert proc.poll() is not None, "the server must be stopped on exit"


def test_server_dying_before_ready_is_reported(tmp_path):
    from serve.backends import Backend

    cmd = [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    with pytest.raises(ForgeError, match="(?s)exited with code 3.*boom"):
        Backend(cmd, free_port(), "x", log_path=tmp_path / "log").start()


def test_refuses_a_damaged_gguf(tmp_path):
    from serve.stage import plan_server

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ForgeError, match="refusing GGUF"):
        plan_server(serve_cfg(), gguf=bad)


def test_backend_selection(monkeypatch):
    from serve import backends

    monkeypatch.setattr(backends, "_cuda_available", lambda: True)
    monkeypatch.setattr(backends, "_vllm_importable", lambda: True)
    assert backends.select_backend("auto") == "vllm"
    assert backends.select_backend("llamacpp") == "llamacpp"
    monkeypatch.setattr(backends, "_vllm_importable", lambda: False)
    assert backends.select_backend("auto") == "llamacpp"
    monkeypatch.setattr(backends, "_cuda_available", lambda: False)
    monkeypatch.setattr(backends, "_vllm_importable", lambda: True)
    assert backends.select_backend("auto") == "llamacpp"
    assert backends.select_backend("vllm") == "vllm"
    with pytest.raises(ForgeError, match="auto, llamacpp or vllm"):
        backends.select_backend("tgi")


def test_vllm_command_line(monkeypatch):
    from serve.backends import vllm_command

    monkeypatch.delenv("FORGE_VLLM_PYTHON", raising=False)
    monkeypatch.delenv("FORGE_VLLM_ARGS", raising=False)
    cmd = vllm_command(Path("/m/model"), 8000, "forge-model", api_key="k", max_model_len=2048, fp8=True)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args == {
        "--model": "/m/model",
        "--served-model-name": "forge-model",
        "--host": "127.0.0.1",
        "--port": "8000",
        "--api-key": "k",
        "--max-model-len": "2048",
        "--quantization": "fp8",
    }
    assert cmd[0] == sys.executable
    plain = vllm_command(Path("/m"), 8000, "a")
    assert "--api-key" not in plain and "--quantization" not in plain and "bitsandbytes" not in plain


def test_vllm_runs_in_its_own_venv(monkeypatch, tmp_path):
    """FORGE_VLLM_PYTHON: the python of vLLM's own venv (make test-vllm); FORGE_VLLM_ARGS: extra server flags."""
    from serve import backends

    python = tmp_path / "vllm-venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 1\n")  # a python that cannot import vllm
    python.chmod(0o755)
    monkeypatch.setenv("FORGE_VLLM_PYTHON", str(python))
    monkeypatch.setenv("FORGE_VLLM_ARGS", "--enforce-eager --dtype float32")
    cmd = backends.vllm_command(Path("/m"), 8000, "a", extra=["--seed", "1"])
    assert cmd[0] == str(python) and cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[-5:] == ["--enforce-eager", "--dtype", "float32", "--seed", "1"]
    assert backends.vllm_command(Path("/m"), 8000, "a", python="/other/python")[0] == "/other/python"
    assert not backends._vllm_importable()  # asked of FORGE_VLLM_PYTHON, not of this interpreter
    monkeypatch.setattr(backends, "_cuda_available", lambda: True)
    assert backends.select_backend("auto") == "llamacpp"
    python.write_text("#!/bin/sh\nexit 0\n")  # now it finds vllm
    assert backends._vllm_importable() and backends.select_backend("auto") == "vllm"
    monkeypatch.setenv("FORGE_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    assert not backends._vllm_importable()
    with pytest.raises(ForgeError, match="FORGE_VLLM_PYTHON=.* is not an executable python"):
        backends.vllm_command(Path("/m"), 8000, "a")


def test_llamacpp_command_line():
    from serve.backends import llamacpp_command

    cmd = llamacpp_command(Path("/m.gguf"), 9000, "a", n_ctx=256, api_key="k")
    assert cmd[1:3] == ["-m", "llama_cpp.server"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args == {"--model": "/m.gguf", "--host": "127.0.0.1", "--port": "9000", "--model_alias": "a",
                    "--n_ctx": "256", "--api_key": "k"}  # fmt: skip


def test_serve_defaults_to_production_only(monkeypatch, tmp_path, gguf_path):
    """Without --gguf/--bundle the served file is @production's, chosen by resolve_production."""
    import shutil

    import serve.registry
    from serve.stage import plan_server

    prod = tmp_path / "v7"
    (prod / "gguf").mkdir(parents=True)
    shutil.copy(gguf_path, prod / "gguf" / "model-q4_k_m.gguf")
    monkeypatch.setattr(serve.registry, "resolve_production", lambda cfg, name=None: prod)
    backend, info = plan_server(serve_cfg(), backend="llamacpp")
    assert info["model"] == str(prod / "gguf" / "model-q4_k_m.gguf")
    assert info["source"]["version"] == "7"

    def refused(cfg, name=None):
        raise ForgeError("refusing to serve")

    monkeypatch.setattr(serve.registry, "resolve_production", refused)
    with pytest.raises(ForgeError, match="refusing"):
        plan_server(serve_cfg(), backend="llamacpp")
