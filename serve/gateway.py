"""The one front door of every backend: a validating gateway that owns the public port, starts the model server
(llama-server, vLLM, llama-cpp-python's server: whatever command it is given) as its child on a free loopback port,
and passes each admitted request through (streams included).

    python -m serve.gateway --host 127.0.0.1 --port 8080 --parallel 4 --n-ctx 2048 -- llama-server --model m.gguf
    # the child gets --host 127.0.0.1 --port P (replacing any it had); settings: the serve: section, below

Before a request reaches the backend the gateway refuses, each time in the OpenAI error shape (gateway_rules.py):
- a Host that is not a name of this server (421: DNS rebinding) and a page's Origin not in serve.cors_origins (403,
  preflight included); upstream CORS headers are dropped, listed origins get the gateway's own;
- without the key (401) when LLAMA_API_KEY is set (the environment, never the command line; the backend behind
  checks it too, from the variable it reads: serve/backends.py api_key_env); /health needs none;
- a body over serve.max_body_bytes (413, answered before the rest is read: uvicorn discards what the client still
  sends), nested deeper than serve.max_json_depth, malformed in the ways llama-server answers with a 500, or asking
  for more tokens than the context or more than serve.max_n choices (400);
- beyond `parallel` requests at the backend and `queue` waiting for one, 503 with Retry-After at once;
- past serve.request_timeout_s (queue included) 504, or an error event ending a stream already begun.
A client that disconnects has its upstream connection closed, which makes the backend stop generating and free
the slot; a non-streamed completion is asked of the backend as a stream for that (gateway_stream.py: llama-server
notices a closed connection only when a write fails). The backends' own endpoints besides the OpenAI ones, /health
and /metrics are not exposed: 404 (vLLM answers /invocations, /tokenize... without its key).
/metrics gets the gateway's own gauges and counters appended (forge_gateway_*).

The gateway exits with the child's exit code; `kill` of the process group (ServerProcess.stop) stops both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import logging
import os
import socket
import subprocess
import sys
import time
from typing import Any

from forge.config import ServeConfig
from models.llama_server import LLAMA_API_KEY_ENV
from serve.gateway_rules import (
    JSON_ENDPOINTS,
    PASSED,
    WILDCARD_HOSTS,
    check_request,
    cors_headers,
    error_body,
    host_name,
    host_refusal,
    origin_refusal,
)
from serve.gateway_stream import EventReader, as_stream, assemble

log = logging.getLogger("forge.gateway")

# The serve: settings the gateway takes as flags (--queue 16, --cors-origins URL repeated); n_ctx comes resolved.
SETTINGS = ("parallel", "queue", "request_timeout_s", "max_body_bytes", "max_json_depth", "max_n")
LIST_SETTINGS = ("cors_origins", "allowed_hosts")
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade", b"proxy-connection",
              b"host"}  # fmt: skip
OWN = (b"server", b"date")  # uvicorn writes its own
# A refused request may come back after this many seconds: a slot frees every (generation time / parallel), and
# clients back off further on a second 503 (the openai client does).
RETRY_AFTER_S = 1


def settings_flags(serve: ServeConfig, n_ctx: int | None = None) -> list[str]:
    """The gateway's command-line flags for a serve: section (the inverse of parse_settings)."""
    flags = ["--n-ctx", str(n_ctx)] if n_ctx else []
    for name in SETTINGS:
        flags += [f"--{name.replace('_', '-')}", str(getattr(serve, name))]
    for name in LIST_SETTINGS:
        for value in getattr(serve, name):
            flags += [f"--{name.replace('_', '-')}", value]
    return flags


class Admission:
    """At most `parallel` requests at the backend and `queue` more waiting for a slot; the rest refused at once.
    The backend has its own queue, unbounded: this one is what keeps a flood from piling up there."""

    def __init__(self, parallel: int, queue: int) -> None:
        self.parallel, self.queue = parallel, queue
        self.slots = asyncio.Semaphore(parallel)
        self.in_flight = self.waiting = 0
        self.counts = {"refused": 0, "timed_out": 0, "clients_gone": 0}

    def full(self) -> bool:
        return self.in_flight + self.waiting >= self.parallel + self.queue

    @contextlib.asynccontextmanager
    async def slot(self):
        self.waiting += 1
        try:
            await self.slots.acquire()
        finally:
            self.waiting -= 1
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self.slots.release()

    def prometheus(self) -> bytes:
        lines = []
        for name, value, kind in (
            ("requests_in_flight", self.in_flight, "gauge"),
            ("requests_waiting", self.waiting, "gauge"),
            *((f"requests_{what}_total", n, "counter") for what, n in self.counts.items()),
        ):
            lines += [f"# TYPE forge_gateway_{name} {kind}", f"forge_gateway_{name} {value}"]
        return ("\n".join(lines) + "\n").encode()


class Reply:
    """One response to one client: the status and headers once, then the body; an error after a stream began
    becomes its last event."""

    def __init__(self, send: Any, cors: list) -> None:
        self.send, self.cors = send, cors
        self.started = self.stream = self.finished = False

    async def start(self, status: int, headers: list) -> None:
        self.started = True
        self.stream = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
        await self.send({"type": "http.response.start", "status": status, "headers": [*headers, *self.cors]})

    async def body(self, data: bytes, more: bool = True) -> None:
        self.finished = not more
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def error(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                    headers: tuple = ()) -> None:  # fmt: skip
        body = error_body(status, message, param, kind)
        if not self.started:
            length = str(len(body)).encode()
            await self.start(status, [(b"content-type", b"application/json"), (b"content-length", length), *headers])
            await self.body(body, more=False)
        elif self.stream:
            await self.body(b"data: " + body + b"\n\n", more=False)
        else:
            await self.body(b"", more=False)  # a plain body already begun: cut short


class ClientGone(Exception):
    """The client closed its connection."""


async def read_body(receive: Any, limit: int) -> bytes | None:
    """The whole request body, or None as soon as it passes `limit` bytes (the rest is never read)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return None
        if not message.get("more_body", False):
            return b"".join(chunks)


async def wait_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Gateway:
    """The ASGI app forwarding to `upstream` (http://127.0.0.1:PORT) under the limits of `serve`; `bound` is the
    address the gateway listens on (what Host must name)."""

    def __init__(self, upstream: str, serve: ServeConfig, n_ctx: int | None = None, api_key: str | None = None,
                 bound: str = "127.0.0.1") -> None:  # fmt: skip
        import httpx

        self.serve, self.n_ctx, self.api_key, self.bound = serve, n_ctx, api_key, bound
        # No keep-alive to the backend: a connection it closes as idle just as a request goes out on it fails that
        # request (seen under load as a 503); a new loopback connection per request costs well under a millisecond.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        self.client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(None), limits=limits)
        self.admission = Admission(serve.parallel, serve.queue)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            await self.handle(scope, receive, send)

    async def lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Refuse what the headers alone condemn, read the body (up to the cap), check it, then forward it."""
        s = self.serve
        deadline = time.monotonic() + s.request_timeout_s
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        reply = Reply(send, cors_headers(origin, s.cors_origins))
        refusal = self.refuse_early(scope, headers)
        if refusal is not None:
            await reply.error(*refusal)
            return
        if scope["method"] == "OPTIONS":
            await self.preflight(send, origin, headers.get("access-control-request-headers"))
            return
        try:
            body = await asyncio.wait_for(read_body(receive, s.max_body_bytes), deadline - time.monotonic())
        except ClientGone:
            return
        except TimeoutError:
            await reply.error(408, f"the request body did not arrive within {s.request_timeout_s:g}s")
            return
        if body is None:
            await reply.error(413, f"the request body is more than {s.max_body_bytes:,} bytes (serve.max_body_bytes)")
            return
        if scope["method"] == "POST" and scope["path"] in JSON_ENDPOINTS:
            check = (check_request, scope["path"], body, s.max_json_depth, self.n_ctx, s.max_n)
            # a big body takes a few hundred ms to scan and parse: off the event loop, which other requests share
            problem = await asyncio.to_thread(*check) if len(body) > 256 * 1024 else check[0](*check[1:])
            if problem:
                await reply.error(400, *problem)
                return
            request = json.loads(body)  # valid: checked above
            # a non-streamed answer is asked for as a stream, so that hanging up stops it (gateway_stream.py)
            collect = not request.get("stream")
            upstream = as_stream(request) if collect else body
            await self.until_done(self.admitted(scope, upstream, reply, collect), receive, reply, deadline)
        else:
            await self.until_done(self.forward(scope, body, reply), receive, reply, deadline)

    def refuse_early(self, scope: dict[str, Any], headers: dict[str, str]) -> tuple | None:
        """(status, message, param, kind) for what is refused from the request line and headers alone."""
        s, path = self.serve, scope["path"]
        why = host_refusal(headers.get("host"), self.bound, s.allowed_hosts)
        if why:
            return 421, why, None, "invalid_request_error"
        if path not in PASSED:
            return 404, f"{path} is not served: use the OpenAI API under /v1", None, "not_found_error"
        why = origin_refusal(headers.get("origin"), s.cors_origins)
        if why:
            return 403, why, None, "permission_error"
        if self.api_key and path != "/health" and scope["method"] != "OPTIONS":
            given = headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, f"Bearer {self.api_key}".encode()):
                return 401, "a valid API key is required: Authorization: Bearer KEY", None, "authentication_error"
        size = headers.get("content-length", "")
        if size.isdigit() and int(size) > s.max_body_bytes:
            why = f"the request body is {int(size):,} bytes, more than {s.max_body_bytes:,} (serve.max_body_bytes)"
            return 413, why, None, "invalid_request_error"
        return None

    async def preflight(self, send: Any, origin: str | None, requested: str | None) -> None:
        """A listed origin's preflight (an unlisted one was refused by refuse_early): 204 and the grant."""
        grant = cors_headers(origin, self.serve.cors_origins, requested or "")
        await send({"type": "http.response.start", "status": 204, "headers": grant})
        await send({"type": "http.response.body", "body": b""})

    async def until_done(self, work: Any, receive: Any, reply: Reply, deadline: float) -> None:
        """Run `work` until it ends, the client disconnects (the backend's connection is closed with it, which
        stops the generation) or the deadline passes (504, or the stream's last event)."""
        task, gone = asyncio.ensure_future(work), asyncio.ensure_future(wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({task, gone}, timeout=max(deadline - time.monotonic(), 0),
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            for pending in (task, gone):
                pending.cancel()
            await asyncio.gather(task, gone, return_exceptions=True)
        failure = task.exception() if task in done else None
        if failure is not None:  # the backend went away mid-answer, say
            log.error("forwarding failed: %r", failure)
            if not reply.finished:
                await reply.error(502, "the model server failed while answering; see its log", kind="server_error")
            return
        if task in done or reply.finished:
            return
        counts = self.admission.counts
        if gone in done:
            counts["clients_gone"] += 1
            return
        counts["timed_out"] += 1
        await reply.error(504, f"no complete answer within {self.serve.request_timeout_s:g}s "
                          "(serve.request_timeout_s)", kind="timeout_error")  # fmt: skip

    async def admitted(self, scope: dict[str, Any], body: bytes, reply: Reply, collect: bool) -> None:
        """Forward once a slot is free; refused at once when the slots and the queue are full."""
        s, admission = self.serve, self.admission
        if admission.full():  # checked and entered in one step of this task: no other request comes between
            admission.counts["refused"] += 1
            await reply.error(503, f"the server is busy ({s.parallel} requests running, {s.queue} waiting): retry "
                              "later", kind="overloaded_error",
                              headers=((b"retry-after", str(RETRY_AFTER_S).encode()),))  # fmt: skip
            return
        async with admission.slot():
            await self.forward(scope, body, reply, collect)

    async def forward(self, scope: dict[str, Any], body: bytes, reply: Reply, collect: bool = False) -> None:
        """The request to the backend and its answer back; with `collect`, the answer is a stream to be put
        together into one JSON answer."""
        import httpx

        dropped = (*HOP_BY_HOP, b"content-length", b"content-type")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in dropped]
        if scope["method"] == "POST" and scope["path"] in JSON_ENDPOINTS:  # checked JSON: vLLM wants it said
            headers.append((b"content-type", b"application/json"))
        else:
            headers += [(k, v) for k, v in scope["headers"] if k.lower() == b"content-type"]
        query = scope["query_string"].decode("latin-1")
        path = scope["path"] + (f"?{query}" if query else "")
        request = self.client.build_request(scope["method"], path, headers=headers, content=body)
        try:
            response = await self.client.send(request, stream=True)
        except httpx.TransportError:
            await reply.error(503, "the model server is starting or has stopped", kind="unavailable_error",
                              headers=((b"retry-after", str(RETRY_AFTER_S).encode()),))  # fmt: skip
            return
        try:
            out = [(k, v) for k, v in response.headers.raw if not _dropped(k)]
            if scope["path"] == "/metrics" and response.status_code == 200:
                await self.reply_metrics(reply, out, await response.aread())
                return
            if collect and response.headers.get("content-type", "").startswith("text/event-stream"):
                await self.reply_collected(reply, response)
                return
            await reply.start(response.status_code, out)
            async for chunk in response.aiter_raw():
                await reply.body(chunk)
            await reply.body(b"", more=False)
        finally:
            await response.aclose()  # before the end of a stream: closes the connection, the backend stops

    async def reply_collected(self, reply: Reply, response: Any) -> None:
        """The stream's chunks as one answer (or the error event it ended with, with its status)."""
        reader = EventReader()
        async for chunk in response.aiter_bytes():
            reader.feed(chunk)
        failed = next((event for event in reader.events if "error" in event), None)
        if failed is None and not reader.events:
            await reply.error(502, "the model server ended its answer without a token", kind="server_error")
            return
        status, answer = 200, failed or assemble(reader.events)
        if failed is not None:
            code = failed["error"].get("code") if isinstance(failed["error"], dict) else None
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
        text = json.dumps(answer, ensure_ascii=False).encode()
        length = str(len(text)).encode()
        await reply.start(status, [(b"content-type", b"application/json"), (b"content-length", length)])
        await reply.body(text, more=False)

    async def reply_metrics(self, reply: Reply, headers: list, text: bytes) -> None:
        """The backend's Prometheus text with the gateway's own lines after it."""
        text = text.rstrip(b"\n") + b"\n" + self.admission.prometheus()
        headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        await reply.start(200, [*headers, (b"content-length", str(len(text)).encode())])
        await reply.body(text, more=False)


def _dropped(header: bytes) -> bool:
    """Hop-by-hop headers, and the backend's CORS grants (llama-server echoes any origin): the gateway's own
    decide."""
    header = header.lower()
    return header in HOP_BY_HOP or header in OWN or header.startswith(b"access-control-")


# ----------------------------------------------------------------------------------------------------------------
# the process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def on_loopback(command: list[str], port: int) -> list[str]:
    """The server command with --host 127.0.0.1 --port `port` in place of any --host/--port it had."""
    kept, skip = [], False
    for word in command:
        if skip:
            skip = False
        elif word in ("--host", "--port"):
            skip = True
        elif not word.startswith(("--host=", "--port=")):
            kept.append(word)
    return [*kept, "--host", "127.0.0.1", "--port", str(port)]


async def serve(host: str, port: int, command: list[str], settings: ServeConfig, n_ctx: int | None = None) -> int:
    """Run `command` on a loopback port and the gateway on host:port in front of it until either stops."""
    import uvicorn

    if host_name(host) in WILDCARD_HOSTS and not settings.allowed_hosts:
        log.warning("bound to %s: Host names with a dot (api.example.com) are refused until listed in "
                    "serve.allowed_hosts; IP addresses and one-label names are accepted", host)  # fmt: skip
    upstream_port = free_port()
    child = subprocess.Popen(on_loopback(command, upstream_port))
    api_key = os.environ.get(LLAMA_API_KEY_ENV) or None  # serve/backends.py api_key_env puts it there
    app = Gateway(f"http://127.0.0.1:{upstream_port}", settings, n_ctx, api_key, host)
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


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, ServeConfig, list[str]]:
    """(args, the serve: settings given as flags, validated, the server command)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n-ctx", type=int, help="tokens one request holds: max_tokens above it is refused")
    for name in SETTINGS:
        parser.add_argument(f"--{name.replace('_', '-')}", help=f"serve.{name}")
    for name in LIST_SETTINGS:
        parser.add_argument(f"--{name.replace('_', '-')}", action="append", default=[], help=f"serve.{name}")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the server command and its flags")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the server command after --")
    given = {name: getattr(args, name) for name in (*SETTINGS, *LIST_SETTINGS) if getattr(args, name)}
    try:
        settings = ServeConfig(**given)
    except ValueError as exc:
        parser.error(str(exc))
    return args, settings, command


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args, settings, command = parse_args(argv)
    sys.exit(asyncio.run(serve(args.host, args.port, command, settings, args.n_ctx)))


if __name__ == "__main__":
    main()
