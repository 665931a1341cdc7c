"""OpenAI-compatible model servers as supervised subprocesses: llama.cpp's own `llama-server` on CPU (parallel slots
with continuous batching, /health, /metrics), vLLM on GPU, and llama-cpp-python's server as a fallback (one request
at a time; what the bench compares against). Each backend is started, judged ready only after a REAL chat
completion succeeds (vLLM with a bad head dim passes /health and fails on the first request), and stopped cleanly
(SIGTERM, then SIGKILL).

llama-server is compiled from the llama.cpp that the pinned llama-cpp-python vendors (docker/llama-server.sh;
`make install` links it into the venv): FORGE_LLAMA_SERVER names another binary. `forge serve` runs it behind
serve.gateway, which turns the malformed requests llama-server answers with a 500 into 400s.

vLLM pins its own torch and transformers, so it usually lives in a venv of its own: FORGE_VLLM_PYTHON names that
venv's python (`make test-vllm` builds one), FORGE_VLLM_ARGS adds server flags (on the CPU build:
`--enforce-eager --dtype float32 --gpu-memory-utilization 0.2`, with VLLM_CPU_KVCACHE_SPACE=1).

    cmd = gateway_command(llama_server_command(gguf, alias="forge-model", n_ctx=2048, parallel=4), port=8080)
    with ServerProcess(cmd, port=8080, alias="forge-model") as b:  # models/llama_server.py
        print(b.base_url)   # http://127.0.0.1:8080/v1
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

from forge import ForgeError
from forge.config import ServeConfig
from models.llama_server import (  # noqa: F401 - the serving side of these lives in serve/
    LLAMA_API_KEY_ENV,
    LLAMA_SERVER_ENV,
    ServerProcess,
    llama_server_binary,
    llama_server_command,
    serving_threads,
)

log = logging.getLogger("forge.serve")


BACKENDS = ("llamacpp", "llama-cpp-python", "vllm")


def select_backend(requested: str = "auto") -> str:
    """`auto`: vllm when CUDA is available and vllm imports, else llamacpp; an explicit choice wins."""
    if requested in BACKENDS:
        return requested
    if requested != "auto":
        raise ForgeError(f"--backend {requested!r}: expected auto, {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}")
    return "vllm" if _cuda_available() and _vllm_importable() else "llamacpp"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # the slim CPU bundle image has no torch
        return False
    return bool(torch.cuda.is_available())


VLLM_PYTHON_ENV = "FORGE_VLLM_PYTHON"
VLLM_ARGS_ENV = "FORGE_VLLM_ARGS"
_FIND_VLLM = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"


def vllm_python() -> str:
    """The python that runs the vLLM server: $FORGE_VLLM_PYTHON (a venv of its own), else this one."""
    python = os.environ.get(VLLM_PYTHON_ENV)
    if not python:
        return sys.executable
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise ForgeError(f"{VLLM_PYTHON_ENV}={python} is not an executable python (`make test-vllm` builds one)")
    return python


def _vllm_importable() -> bool:
    """Whether vllm_python() can import vllm (asked without importing it: that takes seconds)."""
    if not os.environ.get(VLLM_PYTHON_ENV):
        import importlib.util

        return importlib.util.find_spec("vllm") is not None
    try:
        found = subprocess.run([vllm_python(), "-c", _FIND_VLLM], capture_output=True, timeout=60)
    except (ForgeError, OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0


def gateway_command(
    server: list[str],
    port: int,
    host: str = "127.0.0.1",
    python: str | None = None,
    serve: ServeConfig | None = None,
    n_ctx: int | None = None,
) -> list[str]:
    """serve.gateway on host:port in front of `server` (any backend's command), which it starts on loopback (a
    --host/--port in it is replaced); the limits of `serve` (its defaults when None) and n_ctx go as flags (no
    secret among them: the key stays in the environment)."""
    from serve.gateway import settings_flags

    flags = settings_flags(serve, n_ctx) if serve is not None else []
    gateway = [python or sys.executable, "-m", "serve.gateway", "--host", host, "--port", str(port)]
    return [*gateway, *flags, "--", *server]


# Where each server reads its API key, so that none goes on a command line (every user's `ps` shows those, and vLLM
# logs its non-default arguments): serve.gateway and llama-server read LLAMA_API_KEY; vLLM reads VLLM_API_KEY
# (vllm/envs.py); llama-cpp-python's server settings are pydantic BaseSettings, so its `api_key` comes from $API_KEY.
# Each list names LLAMA_API_KEY: the gateway in front of every backend reads that one.
VLLM_API_KEY_ENV = "VLLM_API_KEY"
LLAMA_CPP_PYTHON_API_KEY_ENV = "API_KEY"
API_KEY_ENVS = {
    "llamacpp": (LLAMA_API_KEY_ENV,),
    "vllm": (LLAMA_API_KEY_ENV, VLLM_API_KEY_ENV),
    "llama-cpp-python": (LLAMA_API_KEY_ENV, LLAMA_CPP_PYTHON_API_KEY_ENV),
}


def api_key_env(backend: str, key: str | None) -> dict[str, str] | None:
    """The environment that hands `key` to `backend`'s server (ServerProcess(env=...)); None without a key."""
    if backend not in API_KEY_ENVS:
        raise ForgeError(f"backend {backend!r}: expected one of {', '.join(API_KEY_ENVS)}")
    return {name: key for name in API_KEY_ENVS[backend]} if key else None


def llamacpp_python_command(
    gguf: Path,
    port: int,
    alias: str,
    n_ctx: int | None = None,
    host: str = "127.0.0.1",
    *,
    threads: int | None = None,
    python: str | None = None,
) -> list[str]:
    """llama-cpp-python's server: one request at a time behind a lock, no /health or /metrics, HTTP 500 for
    malformed requests. Kept as a fallback (it needs no compiled binary besides the bindings). Its key goes in the
    environment: api_key_env("llama-cpp-python", key)."""
    cmd = [
        python or sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--host",
        host,
        "--port",
        str(port),
        "--model_alias",
        alias,
    ]
    cmd += ["--n_threads", str(serving_threads(threads))]
    if n_ctx:
        cmd += ["--n_ctx", str(n_ctx)]
    return cmd


def vllm_command(
    model_dir: Path,
    port: int,
    alias: str,
    host: str = "127.0.0.1",
    *,
    max_model_len: int | None = None,
    fp8: bool = False,
    python: str | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The vLLM OpenAI server (the module form: the `vllm` CLI breaks when the dist is named vllm-cpu), run by
    `python`, else vllm_python(); $FORGE_VLLM_ARGS (shell-quoted) goes after the flags built here, then `extra`.
    Its key goes in the environment: api_key_env("vllm", key)."""
    cmd = [
        python or vllm_python(),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        alias,
        "--host",
        host,
        "--port",
        str(port),
    ]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if fp8:
        cmd += ["--quantization", "fp8"]
    added = shlex.split(os.environ.get(VLLM_ARGS_ENV, "")) + list(extra or [])
    if any(arg.split("=", 1)[0] == "--api-key" for arg in added):
        raise ForgeError(
            f"--api-key in {VLLM_ARGS_ENV} or the extra flags would show the key in `ps`: drop it and set the "
            "variable serve.api_key_env names (the key reaches vLLM as VLLM_API_KEY)"
        )
    return cmd + added
