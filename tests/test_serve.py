"""`forge serve`: the real llama-server (behind serve.gateway) and the official `openai` client (streamed and not),
readiness by a real completion, malformed requests answered with a 4xx while the server stays up, /health and
/metrics, clean shutdown, the registry cache re-verified on every start, backend selection, the llama-server, vLLM
and llama-cpp-python command lines and a bounded loopback load test.

The helpers here (a tiny random Llama GGUF built in a few seconds, a started server) are shared with
test_bundle.py and test_chat.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

from forge import ForgeError
from forge.config import ForgeConfig

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

ALIAS = "forge-tiny"
FORGE = str(Path(sys.executable).with_name("forge"))


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


def _post(backend, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    url = backend.base_url.removesuffix("/v1") + path
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _get(backend, path: str) -> tuple[int, str]:
    import urllib.request

    with urllib.request.urlopen(backend.base_url.removesuffix("/v1") + path, timeout=30) as resp:
        return resp.status, resp.read().decode()


HI = [{"role": "user", "content": "hi"}]
LONG = [{"role": "user", "content": "word " * 3000}]  # ~3000 tokens, over the 512-token slot
MALFORMED = {
    # body: (HTTP status, a fragment of the error message); what llama-server answers with 500 the gateway refuses
    "json cut short": (b'{"messages": [', 400, "not valid JSON"),
    "empty body": (b"", 400, "not valid JSON"),
    "binary body": (bytes(range(256)) * 4, 400, "not UTF-8"),
    "lone surrogate": (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "surrogate"),
    "body is an array": (b"[1, 2]", 400, "must be a JSON object"),
    "messages not a list": (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
    "messages empty": (json.dumps({"messages": []}).encode(), 400, "non-empty"),
    "message not an object": (json.dumps({"messages": [5]}).encode(), 400, "messages[0]"),
    "role a number": (json.dumps({"messages": [{"role": 5, "content": "hi"}]}).encode(), 400, "role"),
    "content a number": (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400, "content"),
    "image part": (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(), 400,
                   "only text"),
    "tools not a list": (json.dumps({"messages": HI, "tools": "x"}).encode(), 400, "tools"),
    "max_tokens a string": (json.dumps({"messages": HI, "max_tokens": "ten"}).encode(), 400, "max_tokens"),
    "temperature a string": (json.dumps({"messages": HI, "temperature": "hot"}).encode(), 400, "temperature"),
    "stream a string": (json.dumps({"messages": HI, "stream": "yes"}).encode(), 400, "stream"),
    "negative max_tokens": (json.dumps({"messages": HI, "max_tokens": -5}).encode(), 400, "max_tokens"),
    "over-long prompt": (json.dumps({"messages": LONG, "max_tokens": 2}).encode(), 400, "context size"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_request_gets_a_4xx_and_the_server_answers_the_next(server, case):
    backend, _ = server
    body, status, fragment = MALFORMED[case]
    code, answer = _post(backend, "/v1/chat/completions", body)
    assert code == status, answer
    assert set(answer) == {"error"} and isinstance(answer["error"]["type"], str)
    assert fragment in answer["error"]["message"], answer
    assert backend.proc.poll() is None
    code, answer = _post(backend, "/v1/chat/completions", json.dumps({"messages": HI, "max_tokens": 2}).encode())
    assert code == 200 and answer["choices"][0]["message"]["role"] == "assistant"


def test_malformed_completion_and_unserved_endpoints(server):
    backend, _ = server
    code, answer = _post(backend, "/v1/completions", b'{"prompt": ')
    assert code == 400 and "not valid JSON" in answer["error"]["message"]
    code, answer = _post(backend, "/v1/completions", json.dumps({"prompt": "word " * 3000, "max_tokens": 2}).encode())
    assert code == 400 and answer["error"]["type"] == "exceed_context_size_error"
    for path in ("/tokenize", "/slots", "/props", "/completion"):  # llama-server's own API is not exposed
        code, answer = _post(backend, path, b"{}")
        assert code == 404 and answer["error"]["type"] == "not_found_error"
    code, answer = _post(backend, "/v1/completions", json.dumps({"prompt": "def", "max_tokens": 3}).encode())
    assert code == 200 and 1 <= answer["usage"]["completion_tokens"] <= 3


def test_health_and_metrics(server):
    backend, info = server
    assert _get(backend, "/health") == (200, '{"status":"ok"}')
    code, metrics = _get(backend, "/metrics")  # Prometheus text format
    assert code == 200
    assert "# TYPE llamacpp:prompt_tokens_total counter" in metrics
    assert "llamacpp:requests_processing" in metrics
    generated = float(next(line.split()[1] for line in metrics.splitlines()
                           if line.startswith("llamacpp:tokens_predicted_total ")))  # fmt: skip
    assert generated >= 1  # the readiness probe's token at least
    assert info["parallel"] == 4 and info["backend"] == "llamacpp"


def test_api_key_is_required_when_set(gguf_path, monkeypatch):
    from openai import AuthenticationError, OpenAI

    from serve.stage import plan_server

    monkeypatch.setenv("FORGE_API_KEY", "s3cret")
    backend, _ = plan_server(serve_cfg(), gguf=gguf_path, port=free_port())
    assert "s3cret" not in " ".join(backend.command)  # never in the command line (`ps` shows it to everyone)
    assert backend.env == {"LLAMA_API_KEY": "s3cret"}
    with backend:
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=backend.base_url, api_key="wrong", max_retries=0).chat.completions.create(
                model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        # without the key even a malformed body is refused as unauthorised, not inspected
        assert _post(backend, "/v1/chat/completions", b"{")[0] == 401
        assert _post(backend, "/v1/chat/completions", b"{", {"Authorization": "Bearer s3cret"})[0] == 400
        resp = OpenAI(base_url=backend.base_url, api_key="s3cret", max_retries=0).chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert resp.choices[0].message.role == "assistant"
        assert _get(backend, "/health")[0] == 200  # the load balancer's probe needs no key
        proc = backend.proc
    assert proc.poll() is not None, "the server must be stopped on exit"


def test_server_dying_before_ready_is_reported(tmp_path):
    from serve.backends import ServerProcess

    cmd = [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    with pytest.raises(ForgeError, match="(?s)exited with code 3.*boom"):
        ServerProcess(cmd, free_port(), "x", log_path=tmp_path / "log").start()


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
    assert backends.select_backend("llama-cpp-python") == "llama-cpp-python"
    with pytest.raises(ForgeError, match="auto, llamacpp, llama-cpp-python or vllm"):
        backends.select_backend("tgi")


def test_vllm_command_line(monkeypatch):
    from serve.backends import vllm_command

    monkeypatch.delenv("FORGE_VLLM_PYTHON", raising=False)
    monkeypatch.delenv("FORGE_VLLM_ARGS", raising=False)
    cmd = vllm_command(Path("/m/model"), 8000, "forge-model", max_model_len=2048, fp8=True)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args == {
        "--model": "/m/model",
        "--served-model-name": "forge-model",
        "--host": "127.0.0.1",
        "--port": "8000",
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


def test_llama_server_command_line(monkeypatch, tmp_path):
    from models.llama_server import ServerProcess
    from serve.backends import gateway_command, llama_server_command

    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("FORGE_LLAMA_SERVER", str(binary))
    cmd = llama_server_command(Path("/m.gguf"), "a", n_ctx=256, parallel=3, threads=2)
    assert cmd[0] == str(binary)
    flags = cmd[1:]
    pairs = zip(flags, flags[1:], strict=False)
    args = {flag: value for flag, value in pairs if flag.startswith("--") and not value.startswith("--")}
    # the total KV cache is slots x n_ctx, split per slot so one long conversation cannot take another's room
    assert args == {"--model": "/m.gguf", "--alias": "a", "--ctx-size": "768", "--parallel": "3", "--threads": "2"}
    assert {"--no-kv-unified", "--cont-batching", "--jinja", "--metrics", "--no-webui"} <= set(flags)
    assert "--host" not in cmd and "--port" not in cmd and "--api-key" not in cmd
    gateway = gateway_command(cmd, 9000)
    assert gateway[:8] == [sys.executable, "-m", "serve.gateway", "--host", "127.0.0.1", "--port", "9000", "--"]
    assert gateway[8:] == cmd
    # run in its build's directory (ggml loads libggml-cpu-*.so from the working directory too), behind the
    # gateway or not, through a link as `make install` makes one; other commands keep the caller's directory
    link = tmp_path / "bin" / "llama-server"
    link.parent.mkdir()
    link.symlink_to(binary)
    assert ServerProcess([str(link), "--jinja"], 9000, "a").cwd == tmp_path
    assert ServerProcess(gateway_command([str(link)], 9000), 9000, "a").cwd == tmp_path
    assert ServerProcess([sys.executable, "-m", "http.server"], 9000, "a").cwd is None
    monkeypatch.setenv("FORGE_LLAMA_SERVER", str(tmp_path / "missing"))
    with pytest.raises(ForgeError, match="FORGE_LLAMA_SERVER=.* is not an executable llama-server"):
        llama_server_command(Path("/m.gguf"), "a", 256)


def test_llamacpp_python_command_line():
    from serve.backends import llamacpp_python_command

    cmd = llamacpp_python_command(Path("/m.gguf"), 9000, "a", n_ctx=256, threads=2)
    assert cmd[1:3] == ["-m", "llama_cpp.server"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args == {"--model": "/m.gguf", "--host": "127.0.0.1", "--port": "9000", "--model_alias": "a",
                    "--n_threads": "2", "--n_ctx": "256"}  # fmt: skip


def _promoted(isolated_runs: Path, gguf: Path) -> ForgeConfig:
    """A version registered (embedded store) and promoted through the gate, its Q4_K_M file a real GGUF."""
    from test_registry import POLICY, _manifest, make_candidate, tiny_model_dir

    from forge.config import load_config
    from forge.hashing import sha256_tree
    from registry import promote, register

    root = make_candidate(isolated_runs, "served", tiny_model_dir(isolated_runs.parent / "src" / "model"))
    shutil.copy(gguf, root / "quantize" / "model-q4_k_m.gguf")
    _manifest(root / "quantize", "quantize", {"model": sha256_tree(root / "pretrain" / "model")})
    cfg = load_config(None, ["run_name=served", f"registry.gate_policy={POLICY}", f"registry.model_name={ALIAS}"])
    register.run(cfg)
    assert promote.promote_run(cfg)["version"] == "1"
    return cfg


def test_serve_defaults_to_production_and_reverifies_the_cache(isolated_runs, gguf_path, monkeypatch):
    """Without --gguf/--bundle the served file is @production's; its cached copy is hashed again on every start."""
    import registry.serving
    from serve.stage import bundle_run, plan_server

    cfg = _promoted(isolated_runs, gguf_path)
    backend, info = plan_server(cfg, backend="llamacpp")
    cached = isolated_runs / ".registry" / ALIAS / "v1" / "gguf" / "model-q4_k_m.gguf"
    assert info["model"] == str(cached) and info["source"]["version"] == "1"
    assert str(cached) in backend.command
    _flip_one_byte(cached)  # the cache was verified once, at download; a later change must still be caught
    assert (cached.parent.parent / ".verified").is_file()
    cli = [FORGE, "serve", "--run", "served", "--set", f"registry.model_name={ALIAS}", "--set",
           f"registry.gate_policy={cfg.registry.gate_policy}", "--port", str(free_port())]  # fmt: skip
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"refusing to serve {ALIAS} v1" in proc.stderr and "gguf/model-q4_k_m.gguf (sha256 differs)" in proc.stderr
    with pytest.raises(ForgeError, match="sha256 differs"):
        plan_server(cfg, backend="llamacpp")
    with pytest.raises(ForgeError, match="sha256 differs"):  # nor bundled: the bundle's checksums start from it
        bundle_run(cfg, out=isolated_runs / "bundle")
    assert not (isolated_runs / "bundle").exists()

    def refused(cfg, part):
        raise ForgeError("refusing to serve")

    monkeypatch.setattr(registry.serving, "servable", refused)
    with pytest.raises(ForgeError, match="refusing"):
        plan_server(cfg, backend="llamacpp")


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_stop_signal_is_held_until_the_caller_looks_then_the_handlers_are_restored():
    """SIGTERM and Ctrl-C inside stop_requested set its event and raise nothing, so a signal during a start that
    must finish (the chat UI's) cannot leave half of it running; outside it, the previous handlers are back."""
    import os
    import signal

    from serve.stage import stop_requested

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for signum in (signal.SIGTERM, signal.SIGINT):
        with stop_requested() as stop:
            assert not stop.is_set()
            os.kill(os.getpid(), signum)
            started = sum(range(100_000))  # work after the signal goes on
            assert stop.wait(5) and started == 4_999_950_000
        assert {s: signal.getsignal(s) for s in before} == before
