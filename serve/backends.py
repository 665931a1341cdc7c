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
    with Backend(cmd, port=8080, alias="forge-model") as b:
        print(b.base_url)   # http://127.0.0.1:8080/v1
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from forge import ForgeError

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


LLAMA_SERVER_ENV = "FORGE_LLAMA_SERVER"
# llama-server reads its key from this variable too: a key in the command line shows in every user's `ps`.
LLAMA_API_KEY_ENV = "LLAMA_API_KEY"


def llama_server_binary() -> str:
    """$FORGE_LLAMA_SERVER, else `llama-server` beside this python (where `make install` links the build of
    docker/llama-server.sh), else on PATH (the serve-cpu image)."""
    path = os.environ.get(LLAMA_SERVER_ENV)
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ForgeError(f"{LLAMA_SERVER_ENV}={path} is not an executable llama-server")
        return path
    found = shutil.which("llama-server", path=str(Path(sys.executable).parent)) or shutil.which("llama-server")
    if not found:
        raise ForgeError(
            "llama-server not found: `make install` builds it (docker/llama-server.sh, cached in ~/.cache/forge) and "
            f"links it beside {sys.executable}; or set {LLAMA_SERVER_ENV}=PATH, or serve with --backend "
            "llama-cpp-python"
        )
    return found


def serving_threads(threads: int | None = None) -> int:
    """serve.threads, else the cores this process may run on (a container's cpuset, not the host's count)."""
    return threads or len(os.sched_getaffinity(0)) or 1


def llama_server_command(
    gguf: Path,
    alias: str,
    n_ctx: int,
    parallel: int = 4,
    threads: int | None = None,
    binary: str | None = None,
) -> list[str]:
    """llama-server with `parallel` slots of n_ctx tokens each, decoded together (continuous batching), without
    --host/--port (the gateway, or run.sh, adds them). The KV cache is split per slot (-c is the total), so one long
    conversation cannot take another's room. The chat template is the GGUF's own (tokenizer.chat_template, rendered
    with jinja); no built-in web UI. The API key goes in the environment (LLAMA_API_KEY_ENV), never in the command
    line."""
    return [
        binary or llama_server_binary(),
        "--model", str(gguf),
        "--alias", alias,
        "--ctx-size", str(n_ctx * parallel),
        "--parallel", str(parallel),
        "--no-kv-unified",
        "--cont-batching",
        "--threads", str(serving_threads(threads)),
        "--jinja",
        "--metrics",
        "--no-webui",
    ]  # fmt: skip


def gateway_command(server: list[str], port: int, host: str = "127.0.0.1", python: str | None = None) -> list[str]:
    """serve.gateway on host:port in front of `server` (llama_server_command), which it starts on loopback."""
    return [python or sys.executable, "-m", "serve.gateway", "--host", host, "--port", str(port), "--", *server]


def llamacpp_python_command(
    gguf: Path,
    port: int,
    alias: str,
    n_ctx: int | None = None,
    host: str = "127.0.0.1",
    api_key: str | None = None,
    threads: int | None = None,
    python: str | None = None,
) -> list[str]:
    """llama-cpp-python's server: one request at a time behind a lock, no /health or /metrics, HTTP 500 for
    malformed requests. Kept as a fallback (it needs no compiled binary besides the bindings)."""
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
    if api_key:
        cmd += ["--api_key", api_key]
    return cmd


def vllm_command(
    model_dir: Path,
    port: int,
    alias: str,
    host: str = "127.0.0.1",
    api_key: str | None = None,
    max_model_len: int | None = None,
    fp8: bool = False,
    python: str | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The vLLM OpenAI server (the module form: the `vllm` CLI breaks when the dist is named vllm-cpu), run by
    `python`, else vllm_python(); $FORGE_VLLM_ARGS (shell-quoted) goes after the flags built here, then `extra`."""
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
    if api_key:
        cmd += ["--api-key", api_key]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if fp8:
        cmd += ["--quantization", "fp8"]
    return cmd + shlex.split(os.environ.get(VLLM_ARGS_ENV, "")) + list(extra or [])


class Backend:
    """A server subprocess: start() waits until a real completion succeeds; stop() terminates it and its children."""

    def __init__(
        self,
        command: list[str],
        port: int,
        alias: str,
        host: str = "127.0.0.1",
        api_key: str | None = None,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        ready_timeout: float = 120.0,
    ) -> None:
        self.command, self.port, self.alias, self.host = command, port, alias, host
        self.api_key, self.log_path, self.env, self.ready_timeout = api_key, log_path, env, ready_timeout
        self.proc: subprocess.Popen | None = None
        self._log: Any = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> Backend:
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        out = self._log or subprocess.DEVNULL
        log.info("starting %s", " ".join(c if c != self.api_key else "***" for c in self.command))
        self.proc = subprocess.Popen(
            self.command,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(self.env or {})},
        )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> None:
        """Poll until a one-token chat completion comes back; fail early if the process dies."""
        from openai import OpenAI

        client = OpenAI(base_url=self.base_url, api_key=self.api_key or "none", timeout=10.0, max_retries=0)
        deadline = time.monotonic() + self.ready_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ForgeError(
                    f"the {self.alias} server exited with code {self.proc.returncode} before it was ready{self._tail()}"
                )
            try:
                resp = client.chat.completions.create(
                    model=self.alias, messages=[{"role": "user", "content": "ping"}], max_tokens=1
                )
                if resp.choices:
                    log.info("%s ready on %s", self.alias, self.base_url)
                    return
            except Exception as exc:  # noqa: BLE001 - connection refused while loading, 503, bad model...
                last = exc
            time.sleep(0.5)
        raise ForgeError(
            f"the {self.alias} server did not answer a completion within {self.ready_timeout:.0f}s "
            f"(last error: {last}){self._tail()}"
        )

    def _tail(self) -> str:
        if self.log_path and self.log_path.is_file():
            if self._log:
                self._log.flush()
            return ":\n" + self.log_path.read_text(errors="replace")[-2000:]
        return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout)
            except ProcessLookupError:
                pass
        if self._log:
            self._log.close()
            self._log = None

    def poll(self) -> int | None:
        """The exit code once the process has ended, None while it runs."""
        assert self.proc is not None
        return self.proc.poll()

    def __enter__(self) -> Backend:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
