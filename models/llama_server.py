"""llama.cpp's own `llama-server` and a supervised server subprocess: what `forge serve` runs on CPU, and what the Q&A
stage starts for a local teacher model (pretrain/qa/teacher.py).

A server is started, judged ready only after a REAL chat completion succeeds (vLLM with a bad head dim passes
/health and fails on the first request), and stopped cleanly (SIGTERM to its process group, then SIGKILL).

llama-server is compiled from the llama.cpp that the pinned llama-cpp-python vendors (docker/llama-server.sh;
`make install` links it into the venv): FORGE_LLAMA_SERVER names another binary.

    with ServerProcess(llama_server_command(gguf, alias="teacher", n_ctx=4096) + ["--port", "8090"], 8090,
                       "teacher") as server:
        print(server.base_url)   # http://127.0.0.1:8090/v1
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.machine import usable_cores

log = logging.getLogger("forge.serve")


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
    return threads or usable_cores()


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


def build_dir(command: list[str]) -> Path | None:
    """The directory of the llama-server build that `command` runs (itself, or behind the gateway), else None.
    ggml loads every libggml-cpu-*.so it finds in the working directory as well as beside the binary: started
    anywhere else, a stray or older build there would be loaded too."""
    binary = next((arg for arg in command if Path(arg).name == "llama-server"), None)
    return Path(os.path.realpath(binary)).parent if binary else None


class ServerProcess:
    """A server subprocess: start() waits until a real completion succeeds; stop() terminates it and its children.

    env: added to this process's environment (where an API key goes: never in `command`, which `ps` shows to every
    user). cwd: where it runs; by default the directory of the llama-server build the command runs (see
    `build_dir`)."""

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
        cwd: Path | None = None,
    ) -> None:
        self.command, self.port, self.alias, self.host = command, port, alias, host
        self.api_key, self.log_path, self.env, self.ready_timeout = api_key, log_path, env, ready_timeout
        self.cwd = cwd or build_dir(command)
        self.proc: subprocess.Popen | None = None
        self._log: Any = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> ServerProcess:
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
            cwd=self.cwd,
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

    def __enter__(self) -> ServerProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
