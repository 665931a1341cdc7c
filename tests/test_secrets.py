"""No secret on a command line or in a log: the API key reaches every server `forge serve` starts (serve.gateway and
llama-server, llama-cpp-python's server, vLLM) through its environment. The integration tests start the real
servers with a key set, read /proc/<pid>/cmdline of every process in the tree (what `ps` shows every user) and the
server log, and check that the key is still enforced."""

from __future__ import annotations

import logging
import secrets
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port

from forge import ForgeError
from forge.config import ForgeConfig

ALIAS = "forge-secret-test"


def _cfg() -> ForgeConfig:
    return ForgeConfig.model_validate({"registry": {"model_name": ALIAS}, "serve": {"n_ctx": 512, "parallel": 1}})


def _process_tree(pid: int) -> list[int]:
    import psutil

    root = psutil.Process(pid)
    return [root.pid, *(child.pid for child in root.children(recursive=True))]


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def _status(url: str, key: str | None) -> int:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
    request = urllib.request.Request(url + "/chat/completions", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.integration
@pytest.mark.parametrize("backend, programs", [("llamacpp", {"serve.gateway", "llama-server"}),
                                               ("llama-cpp-python", {"llama_cpp.server"})])  # fmt: skip
def test_the_key_is_in_no_command_line_and_no_log(smollm2_gguf, monkeypatch, caplog, backend, programs):
    from serve.stage import _log_path, plan_server

    key = "forge-secret-" + secrets.token_hex(12)
    monkeypatch.setenv("FORGE_API_KEY", key)
    cfg = _cfg()
    caplog.set_level(logging.INFO, logger="forge")
    server, _ = plan_server(cfg, backend=backend, gguf=smollm2_gguf, port=free_port())
    with server:
        cmdlines = [_cmdline(pid) for pid in _process_tree(server.proc.pid)]
        # the tree holds what we mean to check (else the test would pass on nothing)
        assert all(any(program in line for line in cmdlines) for program in programs), cmdlines
        assert not [line for line in cmdlines if key in line]
        assert _status(server.base_url, None) == 401  # still enforced
        assert _status(server.base_url, "wrong") == 401
        assert _status(server.base_url, key) == 200
    assert key not in _log_path(cfg).read_text(errors="replace")
    assert key not in caplog.text


def test_each_backend_gets_its_key_from_its_own_variable():
    from serve.backends import api_key_env

    # serve.gateway (in front of every backend) and llama-server: LLAMA_API_KEY; vLLM: VLLM_API_KEY (vllm/envs.py);
    # llama-cpp-python's pydantic settings read `api_key` from $API_KEY
    assert api_key_env("llamacpp", "k") == {"LLAMA_API_KEY": "k"}
    assert api_key_env("vllm", "k") == {"LLAMA_API_KEY": "k", "VLLM_API_KEY": "k"}
    assert api_key_env("llama-cpp-python", "k") == {"LLAMA_API_KEY": "k", "API_KEY": "k"}
    assert api_key_env("vllm", None) is None and api_key_env("llamacpp", "") is None
    with pytest.raises(ForgeError, match="backend 'tgi'"):
        api_key_env("tgi", "k")


def test_llama_cpp_python_reads_its_key_from_the_environment(monkeypatch):
    """What api_key_env relies on, asked of the installed llama-cpp-python (its server parses argv into these)."""
    from llama_cpp.server.settings import ServerSettings

    monkeypatch.setenv("API_KEY", "from-env")
    assert ServerSettings(host="127.0.0.1").api_key == "from-env"


def test_no_command_builder_takes_a_key(monkeypatch):
    from serve.backends import llamacpp_python_command, vllm_command

    monkeypatch.delenv("FORGE_VLLM_ARGS", raising=False)
    with pytest.raises(TypeError):
        vllm_command(Path("/m"), 8000, "a", api_key="k")  # type: ignore[call-arg]
    with pytest.raises(TypeError):  # a stale positional call fails instead of landing the key in another flag
        llamacpp_python_command(Path("/m.gguf"), 9000, "a", 256, "127.0.0.1", "k")  # type: ignore[misc]
    monkeypatch.setenv("FORGE_VLLM_ARGS", "--enforce-eager --api-key=k")
    with pytest.raises(ForgeError, match="--api-key in FORGE_VLLM_ARGS"):
        vllm_command(Path("/m"), 8000, "a", python="/usr/bin/python3")
    monkeypatch.delenv("FORGE_VLLM_ARGS")
    with pytest.raises(ForgeError, match="--api-key"):
        vllm_command(Path("/m"), 8000, "a", python="/usr/bin/python3", extra=["--api-key", "k"])
