"""The verbs `forge serve`, `forge chat` and `forge bundle`.

    forge serve                        # @production's GGUF (llama.cpp) on CPU, its HF directory (vLLM) on a GPU
    forge serve --bundle dist/bundle   # a deploy bundle, after checking every sha256
    forge chat --api-base http://127.0.0.1:8080/v1
    forge bundle --out dist/bundle     # @production -> dist/bundle/ and dist/bundle.tar.gz

By default only `registry.serving.servable` chooses what is served, so a model the gate refused is never served;
`--gguf` serves a file directly and says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.config import ForgeConfig
from forge.io import atomic_write_json, read_json_object
from forge.paths import run_dir
from models.gguf import check_gguf, context_length
from serve.backends import (
    ServerProcess,
    api_key_env,
    gateway_command,
    llama_server_command,
    llamacpp_python_command,
    select_backend,
    vllm_command,
)

log = logging.getLogger("forge.serve")


def api_key(cfg: ForgeConfig) -> str | None:
    return os.environ.get(cfg.serve.api_key_env) or None


def plan_server(
    cfg: ForgeConfig,
    bundle: Path | None = None,
    backend: str | None = None,
    gguf: Path | None = None,
    port: int | None = None,
) -> tuple[ServerProcess, dict[str, Any]]:
    """Decide what to serve and how; returns the (not started) ServerProcess and what it serves. Every file served is
    checked first: a GGUF's header, and the sha256 of a bundle's or a registry version's files."""
    s = cfg.serve
    port = port or s.port
    requested = backend or s.backend
    chosen = select_backend(requested)
    if bundle is not None:
        from serve.bundle import SERVER, verify_bundle

        if chosen == "vllm" and requested == "vllm":
            raise ForgeError("a bundle holds a GGUF for llama.cpp: drop --backend vllm")
        manifest = verify_bundle(Path(bundle))
        path = Path(bundle) / manifest["gguf"]
        n_ctx = s.n_ctx or manifest["serve"].get("n_ctx") or context_length(path)
        binary = str(Path(bundle).resolve() / SERVER)  # the bundle's own llama-server, checked with the rest
        return _gguf_server(cfg, chosen, path, manifest["alias"], n_ctx, port, manifest["source"], binary)
    if gguf is not None:
        check_gguf(Path(gguf))
        log.warning("serving %s directly: it did not come through the registry gate", gguf)
        return _gguf_server(cfg, chosen, Path(gguf), cfg.registry.model_name, s.n_ctx, port, {"file": str(gguf)})
    from registry.serving import servable

    alias = cfg.registry.model_name
    key = api_key(cfg)
    if chosen == "vllm":
        model_dir, source = servable(cfg, "model")
        info = {"backend": "vllm", "model": str(model_dir), "alias": alias, "source": source}
        # vLLM checks a key only under /v1 and answers its other paths to anyone: the gateway is its front door
        # too, and puts it on a loopback port of its own. Without serve.n_ctx the gateway leaves max_tokens to vLLM
        # (it refuses a prompt plus max_tokens over max_model_len itself).
        server = vllm_command(model_dir, port, alias, max_model_len=s.n_ctx)
        return ServerProcess(
            gateway_command(server, port, s.host, serve=s, n_ctx=s.n_ctx),
            port,
            alias,
            s.host,
            key,
            _log_path(cfg),
            env=api_key_env("vllm", key),
            ready_timeout=600,
        ), info
    path, source = servable(cfg, f"gguf/model-{s.gguf_type}.gguf")
    check_gguf(path)
    return _gguf_server(cfg, chosen, path, alias, s.n_ctx, port, source)


def _gguf_server(
    cfg: ForgeConfig,
    chosen: str,
    path: Path,
    alias: str,
    n_ctx: int | None,
    port: int,
    source: dict[str, Any],
    binary: str | None = None,
) -> tuple[ServerProcess, dict[str, Any]]:
    """llama-server (or llama-cpp-python's server) for a checked GGUF; n_ctx per slot, default the model's."""
    s = cfg.serve
    key = api_key(cfg)
    n_ctx = n_ctx or context_length(path) or 2048
    info = {"backend": chosen, "model": str(path), "alias": alias, "n_ctx": n_ctx, "source": source}
    if chosen == "llama-cpp-python":
        server = llamacpp_python_command(path, port, alias, n_ctx, threads=s.threads)
    else:
        info["backend"] = "llamacpp"  # the vllm default on a machine without CUDA lands here too
        info["parallel"] = s.parallel
        server = llama_server_command(path.absolute(), alias, n_ctx, s.parallel, s.threads, binary)
    command = gateway_command(server, port, s.host, serve=s, n_ctx=n_ctx)  # every backend behind the gateway
    env = api_key_env(info["backend"], key)
    return ServerProcess(command, port, alias, s.host, key, _log_path(cfg), env=env), info


def _log_path(cfg: ForgeConfig) -> Path:
    return run_dir(cfg) / "serve" / "server.log"


def _serving_path(cfg: ForgeConfig) -> Path:
    return run_dir(cfg) / "serve" / "serving.json"


def serving_info(cfg: ForgeConfig, api_base: str) -> dict[str, Any]:
    """Name, version, alias and backend of the model `forge serve` last started at api_base (empty if unknown)."""
    served = read_json_object(_serving_path(cfg)) or {}
    if served.get("base_url", "").rstrip("/") != api_base.rstrip("/"):
        return {}
    source = served.get("source") or {}
    return {
        "name": source.get("name") or served.get("alias"),
        "version": source.get("version"),
        "alias": source.get("alias"),
        "backend": served.get("backend"),
    }


def run(
    cfg: ForgeConfig,
    force: bool = False,
    bundle: Path | None = None,
    backend: str | None = None,
    gguf: Path | None = None,
    port: int | None = None,
    block: bool = True,
    chat: bool = False,
) -> dict[str, Any]:
    """`forge serve`: start the backend, wait for a real completion, serve until SIGTERM or Ctrl-C; with `chat`, the
    chat UI in front of it too (its URL is the last line printed). The server is stopped either way."""
    server, info = plan_server(cfg, bundle, backend, gguf, port)
    server.start()
    info["base_url"] = server.base_url
    atomic_write_json(_serving_path(cfg), info)  # what `forge chat` shows: name, version, alias, backend
    serving = f"serving {info['alias']} ({info['backend']}) at {server.base_url}  [Ctrl-C stops]"
    if not block:
        print(serving, flush=True)
        info["server"] = server
        return info
    try:
        with stop_requested() as stop:  # before the line that tells a caller the server is up
            print(serving, flush=True)
            ui = chat_run(cfg, api_base=server.base_url, model=info["alias"], block=False)["ui"] if chat else None
            try:
                code = serve_until(server, stop)
            finally:
                if ui is not None:
                    ui.close()
    finally:
        server.stop()
    if code:
        raise ForgeError(f"the server exited with code {code}; see {_log_path(cfg)}")
    return info


@contextlib.contextmanager
def stop_requested() -> Iterator[threading.Event]:
    """SIGTERM (`kill`) and Ctrl-C set the event instead of raising wherever the main thread happens to be (halfway
    through starting the chat UI, say, which left a server thread keeping the process alive): what is starting
    finishes, then the caller sees the event and stops everything in order."""
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda signum, frame: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def serve_until(server: ServerProcess, stop: threading.Event) -> int | None:
    """Wait for the stop signal or the server's own exit; its exit code if it exited, None when stopped."""
    while not stop.wait(0.5):
        code = server.poll()
        if code is not None:
            return code
    return None


def chat_run(
    cfg: ForgeConfig, force: bool = False, api_base: str | None = None, model: str | None = None, block: bool = True
) -> dict[str, Any]:
    """`forge chat`: the Gradio UI on 127.0.0.1:serve.ui_port in front of api_base."""
    from serve.chat_ui import build_ui, launch

    s = cfg.serve
    api_base = api_base or f"http://{s.host}:{s.port}/v1"
    key = api_key(cfg)
    model = model or _served_model(api_base, key) or cfg.registry.model_name
    info = serving_info(cfg, api_base) or {"name": model, "backend": api_base}
    user, password = os.environ.get("FORGE_UI_USER"), os.environ.get("FORGE_UI_PASSWORD")
    auth = (user, password) if user and password else None
    ui = build_ui(api_base, model, s, key, info)
    print(f"chat UI on http://{s.host}:{s.ui_port} -> {api_base} ({model})", flush=True)
    launch(ui, s.host, s.ui_port, auth=auth, block=block)
    return {"ui": ui, "api_base": api_base, "model": model, "url": f"http://{s.host}:{s.ui_port}"}


def _served_model(api_base: str, key: str | None) -> str | None:
    from openai import OpenAI

    try:
        models = OpenAI(base_url=api_base, api_key=key or "none", timeout=5.0, max_retries=0).models.list()
        return models.data[0].id if models.data else None
    except Exception:  # noqa: BLE001 - the UI still starts; the chat shows the backend error
        return None


def bundle_run(cfg: ForgeConfig, force: bool = False, out: Path | None = None) -> dict[str, Any]:
    """`forge bundle`: @production's GGUF (serve.gguf_type) -> a checksummed bundle directory and tarball."""
    from registry.serving import servable
    from serve.bundle import build_bundle

    # re-verified now: the bundle's checksums start from these bytes
    path, source = servable(cfg, f"gguf/model-{cfg.serve.gguf_type}.gguf")
    out = Path(out) if out else run_dir(cfg) / "bundle"
    source |= {"gguf_type": cfg.serve.gguf_type, "run": cfg.run_name}
    n_ctx = cfg.serve.n_ctx or context_length(path) or 2048
    manifest = build_bundle(path, out, source, cfg.serve, n_ctx)
    manifest["dir"] = str(out)
    return manifest
