"""A thin validating gateway in front of llama-server: it owns the public port, passes every request through
unchanged (streams included) and answers only what llama-server gets wrong itself.

    python -m serve.gateway --host 127.0.0.1 --port 8080 -- llama-server --model m.gguf ...   # --port is added

llama-server (measured on the pinned build, tests/test_serve.py pins each case) already answers a wrong field type,
an over-long prompt or a bad sampler value with a 4xx and an OpenAI-style error body, but answers HTTP 500 to a body
that is not JSON (malformed, binary, empty, a lone surrogate), to a message whose role is not a string, to an image
part without a vision projector and to a malformed `tools` list; it stays up either way. The gateway refuses those
with a 400 before they reach it, and refuses an empty `messages` (llama-server would generate until its context is
full). Its own endpoints besides the OpenAI ones, /health and /metrics (tokenize, slots, props, infill...) are not
exposed: 404.

The gateway starts llama-server as its child on a free loopback port and exits with the child's exit code; `kill`
of the process group (ServerProcess.stop, models/llama_server.py) stops both. The API key stays llama-server's to
check: a request whose Authorization header is not the key is passed through unread, so an unauthenticated caller
learns nothing from the gateway's answers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from typing import Any

# Requests bigger than this are refused (413) before they are read whole: the longest prompt a slot takes is a few
# hundred KB of text even at 128k tokens, and JSON of images is not served.
MAX_BODY_BYTES = 8 * 1024 * 1024
ROLES = ("system", "developer", "user", "assistant", "tool")
JSON_ENDPOINTS = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions")
PASSED = (*JSON_ENDPOINTS, "/health", "/metrics", "/v1/models", "/models")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "host"}


def error_body(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> bytes:
    """The OpenAI error object (and llama-server's own shape: code is the HTTP status)."""
    return json.dumps({"error": {"code": status, "message": message, "type": kind, "param": param}}).encode()


def check_request(path: str, body: bytes) -> tuple[str, str | None] | None:
    """(message, param) of why llama-server would answer this body with a 5xx (or generate unbounded), else None."""
    try:
        request = json.loads(body.decode("utf-8"))  # JSON on the wire is UTF-8 (RFC 8259), never UTF-16 guessed at
    except UnicodeDecodeError:
        return "the request body is not UTF-8 text: send a JSON object", None
    except ValueError as exc:  # malformed JSON, empty body, a lone surrogate (json accepts it, check below)
        return f"the request body is not valid JSON ({exc})", None
    except RecursionError:
        return "the request body nests arrays or objects too deeply", None
    if not isinstance(request, dict):
        return f"the request body must be a JSON object, not {type(request).__name__}", None
    try:
        json.dumps(request, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return "the request body holds an unpaired surrogate (\\ud800-\\udfff): not valid Unicode", None
    if "chat/completions" in path:
        return _check_chat(request)
    return None


def _check_chat(request: dict[str, Any]) -> tuple[str, str | None] | None:
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array of message objects", "messages"
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            return f"{where} must be an object with 'role' and 'content'", where
        if message.get("role") not in ROLES:
            return f"{where}.role must be one of {', '.join(ROLES)}, not {message.get('role')!r}", f"{where}.role"
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") not in ("text", None):
                return f"{where}.content[{j}]: only text parts are served, not {part.get('type')!r}", where
    tools = request.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return "'tools' must be an array of {type: function, function: {name, parameters}}", "tools"
        for i, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                return f"tools[{i}] must be {{type: function, function: {{name, parameters}}}}", f"tools[{i}]"
    return None


def build_app(upstream: str, api_key: str | None = None):
    """The Starlette app forwarding to `upstream` (http://127.0.0.1:PORT)."""
    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(None), limits=limits)

    def refuse(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> Response:
        return Response(error_body(status, message, param, kind), status, media_type="application/json")

    async def forward(request: Request) -> Response:
        path = request.url.path
        if path not in PASSED:
            return refuse(404, f"{path} is not served: use the OpenAI API under /v1", kind="not_found_error")
        size = request.headers.get("content-length")
        if size and size.isdigit() and int(size) > MAX_BODY_BYTES:
            return refuse(413, f"the request body is {int(size):,} bytes, more than {MAX_BODY_BYTES:,}")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                return refuse(413, f"the request body is more than {MAX_BODY_BYTES:,} bytes")
        authorized = not api_key or request.headers.get("authorization") == f"Bearer {api_key}"
        if request.method == "POST" and path in JSON_ENDPOINTS and authorized:
            problem = check_request(path, body)
            if problem:
                return refuse(400, *problem)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        query = request.url.query
        upstream_request = client.build_request(
            request.method, path + (f"?{query}" if query else ""), headers=headers, content=body
        )
        try:
            response = await client.send(upstream_request, stream=True)
        except httpx.TransportError:
            return refuse(503, "the model server is starting or has stopped", kind="unavailable_error")
        out_headers = {k: v for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(
            response.aiter_raw(), response.status_code, out_headers, background=BackgroundTask(response.aclose)
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        await client.aclose()

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def serve(host: str, port: int, command: list[str]) -> int:
    """Run `command --port P` (llama-server on loopback) and the gateway on host:port until either stops."""
    import uvicorn

    upstream_port = free_port()
    child = subprocess.Popen([*command, "--host", "127.0.0.1", "--port", str(upstream_port)])
    app = build_app(f"http://127.0.0.1:{upstream_port}", os.environ.get("LLAMA_API_KEY") or None)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)

    async def watch_child() -> None:
        while child.poll() is None and not server.should_exit:
            await asyncio.sleep(0.5)
        server.should_exit = True

    watcher = asyncio.create_task(watch_child())
    try:
        await server.serve()
    finally:
        watcher.cancel()
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
    code = child.wait()
    return code if code > 0 else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- llama-server and its flags, no --host/--port")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the llama-server command after --")
    sys.exit(asyncio.run(serve(args.host, args.port, command)))


if __name__ == "__main__":
    main()
