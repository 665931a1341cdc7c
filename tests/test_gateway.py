"""serve/gateway.py, the front door of every backend: the pure rules (Host, Origin, CORS, JSON depth, token and
choice limits, admission, the flags `forge serve` passes) unmarked, then the issue's probes against the real gateway
in front of the real llama-server with SmolLM2 (one server for the module), and the queue and the timeout against
a backend that never answers. The probe functions take a base URL and are run against vLLM too
(test_serve_vllm.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import free_port

from forge.config import ForgeConfig, ServeConfig
from serve.gateway import Admission, on_loopback, parse_args, settings_flags
from serve.gateway_rules import check_request, cors_headers, host_refusal, nests_deeper, origin_refusal

ALIAS = "smol"
HI = [{"role": "user", "content": "hi"}]
EVIL = "http://evil.example"
LISTED = "http://chat.example.com"

# ----------------------------------------------------------------------------------------------------------------
# the rules (no server)

HOSTS = [  # (Host header, bound address, allowed_hosts, accepted)
    ("127.0.0.1:8080", "127.0.0.1", [], True),
    ("127.0.0.1", "127.0.0.1", [], True),
    ("localhost:8080", "127.0.0.1", [], True),
    ("[::1]:8080", "127.0.0.1", [], True),
    ("LOCALHOST", "127.0.0.1", [], True),
    ("evil.example:8080", "127.0.0.1", [], False),  # DNS rebinding: the name now resolves to 127.0.0.1
    ("evil.example", "127.0.0.1", ["evil.example"], True),
    ("api.example.com", "127.0.0.1", ["*"], True),
    (None, "127.0.0.1", [], True),  # HTTP/1.0 without Host: no browser's request
    ("10.0.0.5:8080", "10.0.0.5", [], True),
    ("localhost", "10.0.0.5", [], False),  # not bound to loopback: only its own address
    ("10.1.2.3:8080", "0.0.0.0", [], True),  # every interface: IP literals and one-label names...
    ("forge-serve:8080", "0.0.0.0", [], True),
    ("[fe80::1]:8080", "::", [], True),
    ("api.example.com", "0.0.0.0", [], False),  # ...but a dotted name only when listed
    ("api.example.com:443", "0.0.0.0", ["API.example.com"], True),
]


@pytest.mark.parametrize(("host", "bound", "allowed", "accepted"), HOSTS)
def test_host_check(host, bound, allowed, accepted):
    why = host_refusal(host, bound, allowed)
    assert (why is None) == accepted, why
    if why:
        assert "serve.allowed_hosts" in why


def test_only_listed_origins_are_granted():
    assert origin_refusal(None, []) is None  # not a browser page: curl, the openai client, the chat UI's server
    assert "serve.cors_origins" in origin_refusal(EVIL, [])
    assert origin_refusal(EVIL, [LISTED]) is not None
    assert origin_refusal(LISTED + "/", [LISTED]) is None and origin_refusal(EVIL, ["*"]) is None
    assert cors_headers(EVIL, [LISTED]) == [] and cors_headers(None, [LISTED]) == []
    assert dict(cors_headers(LISTED, [LISTED]))[b"access-control-allow-origin"] == LISTED.encode()
    preflight = dict(cors_headers(LISTED, [LISTED], "authorization, x-stainless-os"))
    assert preflight[b"access-control-allow-headers"] == b"authorization, x-stainless-os"
    assert b"access-control-allow-credentials" not in preflight  # a bearer key, never a cookie
    assert dict(cors_headers(EVIL, ["*"]))[b"access-control-allow-origin"] == b"*"
    with pytest.raises(ValueError, match="serve.cors_origins: 'http://a.example/' is not an origin"):
        ServeConfig(cors_origins=["http://a.example/"])


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_json_depth_is_found_without_recursing():
    assert not nests_deeper(nested(32), 32) and nests_deeper(nested(33), 32)
    assert nests_deeper(b"{" * 20 + b"[" * 20 + b"]" * 20 + b"}" * 20, 32)  # mixed kinds count level by level
    assert not nests_deeper(b'{"a": "' + b"[" * 1000 + b'", "b": "\\"[[["}', 32)  # brackets inside strings
    assert not nests_deeper(b"[[]]" * 100_000, 2)  # wide is not deep
    assert nests_deeper(nested(1_000_000), 32)  # json.loads would hit the recursion limit here
    assert nests_deeper(b"[" * 1000, 32) and not nests_deeper(b"[[[[]", 32)  # unbalanced: json.loads says so
    problem = check_request("/v1/chat/completions", nested(33))
    assert problem is not None and "serve.max_json_depth" in problem[0]
    assert "not valid JSON" in check_request("/v1/chat/completions", b"[" * 10)[0]


def test_token_budget_and_choices_are_capped():
    def check(**fields):
        body = json.dumps({"messages": HI, **fields}).encode()
        return check_request("/v1/chat/completions", body, n_ctx=512, max_n=2)

    assert check(max_tokens=512) is None and check(max_tokens=None) is None
    message, param = check(max_tokens=10**9)
    assert param == "max_tokens" and "512-token context" in message
    assert check(max_completion_tokens=513)[1] == "max_completion_tokens"
    assert check(n=2) is None and check(n=3)[1] == "n"
    assert check(max_tokens="ten") is None and check(n=True) is None  # wrong types are the backend's to refuse
    assert check_request("/v1/completions", json.dumps({"prompt": "x", "n_predict": 10**6}).encode(), n_ctx=64)
    assert check_request("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 10**9}).encode()) is None


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def test_a_stream_is_put_back_together_as_the_answer_asked_for():
    """The chunk shapes llama-server sends (recorded from the pinned build), fed in awkward pieces."""
    from serve.gateway_stream import EventReader, as_stream, assemble

    assert json.loads(as_stream({"messages": HI, "stream": False})) == {
        "messages": HI, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    head = {"id": "c1", "created": 1, "model": "m", "object": "chat.completion.chunk"}
    logprob = {"content": [{"token": "hi", "logprob": -2.5}]}
    call = {"index": 0, "id": "t1", "type": "function", "function": {"name": "get", "arguments": '{"a"'}}
    stream = sse(
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {"content": "hi"}, "logprobs": logprob, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {"content": " there"}, "logprobs": logprob}]},
        {**head, "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {**head, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        {**head, "choices": [], "usage": {"completion_tokens": 2}, "timings": {"predicted_n": 2}},
    ).replace(b"\n", b"\r\n")
    reader = EventReader()
    for i in range(0, len(stream), 7):
        reader.feed(stream[i : i + 7])
    assert reader.done
    answer = assemble(reader.events)
    assert answer == {
        "id": "c1", "created": 1, "model": "m", "object": "chat.completion",
        "usage": {"completion_tokens": 2}, "timings": {"predicted_n": 2},
        "choices": [{"index": 0, "finish_reason": "length", "logprobs": {"content": logprob["content"] * 2},
                     "message": {"role": "assistant", "content": "hi there", "tool_calls": [
                         {"id": "t1", "type": "function", "function": {"name": "get", "arguments": '{"a": 1}'}}]}}],
    }  # fmt: skip
    text = {"id": "c2", "object": "text_completion", "model": "m"}
    completion = assemble([{**text, "choices": [{"text": "-", "index": 0, "logprobs": None, "finish_reason": None}]},
                           {**text, "choices": [{"text": "only", "index": 0, "finish_reason": "length"}],
                            "usage": {"completion_tokens": 2}}])  # fmt: skip
    assert completion["object"] == "text_completion" and completion["usage"] == {"completion_tokens": 2}
    assert completion["choices"] == [{"index": 0, "text": "-only", "finish_reason": "length", "logprobs": None}]
    # a reply that is EOS at once: "" as llama-server's own non-streamed answer has it (clients test for None)
    empty = assemble([{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
                      {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}])  # fmt: skip
    assert empty["choices"][0]["message"] == {"role": "assistant", "content": ""}


def test_admission_runs_parallel_queues_queue_refuses_the_rest():
    async def scenario() -> list[str]:
        admission, events, release = Admission(parallel=2, queue=1), [], asyncio.Event()

        async def one(name: str) -> None:
            if admission.full():
                events.append(f"{name} refused")
                return
            async with admission.slot():
                events.append(f"{name} runs")
                await release.wait()

        tasks = [asyncio.create_task(one(name)) for name in "abc"]
        await asyncio.sleep(0.01)
        assert (admission.in_flight, admission.waiting) == (2, 1)
        await one("d")
        release.set()
        await asyncio.gather(*tasks)
        assert (admission.in_flight, admission.waiting) == (0, 0)
        assert b"forge_gateway_requests_in_flight 0" in admission.prometheus()
        return events

    assert asyncio.run(scenario()) == ["a runs", "b runs", "d refused", "c runs"]


def test_forge_serve_passes_its_limits_as_flags_and_the_gateway_reads_them_back():
    from serve.backends import gateway_command

    serve = ServeConfig(parallel=3, queue=5, max_n=2, request_timeout_s=9.5, cors_origins=[LISTED],
                        allowed_hosts=["api.example.com", "forge"])  # fmt: skip
    command = gateway_command(["llama-server", "--model", "m.gguf"], 9000, serve=serve, n_ctx=256)
    assert command[1:3] == ["-m", "serve.gateway"] and command[-4:] == ["--", "llama-server", "--model", "m.gguf"]
    args, settings, server = parse_args(command[3:])
    assert (args.port, args.n_ctx, server) == (9000, 256, ["llama-server", "--model", "m.gguf"])
    assert settings == serve
    with pytest.raises(SystemExit):
        parse_args(["--port", "1", "--queue", "-1", "--", "x"])  # validated as serve.queue is
    assert settings_flags(ServeConfig())[:2] == ["--parallel", "4"]
    bare = gateway_command(["llama-server"], 9000)
    assert bare == [
        sys.executable,
        "-m",
        "serve.gateway",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--",
        "llama-server",
    ]


def test_the_backend_goes_on_a_loopback_port_of_the_gateways_choosing():
    vllm = ["python", "-m", "vllm", "--model", "m", "--host", "0.0.0.0", "--port", "8080", "--port=1", "--seed", "1"]
    assert on_loopback(vllm, 5555) == ["python", "-m", "vllm", "--model", "m", "--seed", "1", "--host", "127.0.0.1",
                                       "--port", "5555"]  # fmt: skip


def test_every_backend_is_behind_the_gateway_and_its_key_stays_off_the_command_line(monkeypatch, tmp_path):
    import registry.serving
    from serve.stage import plan_server

    monkeypatch.delenv("FORGE_VLLM_PYTHON", raising=False)
    monkeypatch.delenv("FORGE_VLLM_ARGS", raising=False)
    monkeypatch.setenv("FORGE_API_KEY", "s3cret")
    monkeypatch.setenv("FORGE_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(registry.serving, "servable", lambda cfg, part: (tmp_path / "model", {"version": "1"}))
    cfg = ForgeConfig.model_validate({"serve": {"host": "0.0.0.0", "n_ctx": 1024, "queue": 3}})
    backend, info = plan_server(cfg, backend="vllm", port=8123)
    command = backend.command
    assert command[:3] == [sys.executable, "-m", "serve.gateway"] and info["backend"] == "vllm"
    gateway, server = command[: command.index("--")], command[command.index("--") + 1 :]
    assert gateway[3:7] == ["--host", "0.0.0.0", "--port", "8123"]
    assert gateway[gateway.index("--queue") + 1] == "3" and gateway[gateway.index("--n-ctx") + 1] == "1024"
    assert server[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "s3cret" not in " ".join(command)
    assert backend.env == {"LLAMA_API_KEY": "s3cret", "VLLM_API_KEY": "s3cret"}  # the gateway's and vLLM's


# ----------------------------------------------------------------------------------------------------------------
# probes over HTTP (shared with test_serve_vllm.py)


def request(base: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            key: str | None = None) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """(status, headers with lower-case names, body) of one request to the server at `base` (http://host:port)."""
    import httpx

    auth = {"Authorization": f"Bearer {key}"} if key else {}
    headers = {"Content-Type": "application/json", **auth, **(headers or {})}
    with httpx.Client(base_url=base, timeout=120) as client:
        resp = client.request(method, path, content=body, headers=headers)
    return resp.status_code, {k.lower(): v for k, v in resp.headers.items()}, resp.content


def assert_error_shape(status: int, body: bytes, wanted: int, fragment: str = "") -> dict:
    assert status == wanted, body[:500]
    error = json.loads(body)["error"]
    assert error["code"] == wanted and isinstance(error["type"], str) and fragment in error["message"], error
    return error


def chat(max_tokens: int = 4, **fields) -> bytes:
    return json.dumps({"messages": HI, "max_tokens": max_tokens, **fields}).encode()  # the one model served


def probe_origin_and_host(base: str, key: str | None = None, listed: str | None = None) -> None:
    """A foreign Origin: no CORS grant on a simple request nor on a preflight, and its POST never generates; a
    wrong Host: refused. `listed` (in serve.cors_origins, if given) gets the grant."""
    for method, path, body in (("POST", "/v1/chat/completions", chat()), ("GET", "/v1/models", None)):
        status, headers, answer = request(base, method, path, body, {"Origin": EVIL}, key)
        assert_error_shape(status, answer, 403, "serve.cors_origins")
        assert not any(h.startswith("access-control-") for h in headers), headers
    preflight = {
        "Origin": EVIL,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    status, headers, answer = request(base, "OPTIONS", "/v1/chat/completions", None, preflight)
    assert_error_shape(status, answer, 403)
    assert not any(h.startswith("access-control-") for h in headers), headers
    status, headers, answer = request(base, "POST", "/v1/chat/completions", chat(), {}, key)
    assert status == 200, answer
    assert "access-control-allow-origin" not in headers  # the backend's own grant is dropped
    if listed:
        status, headers, _ = request(base, "OPTIONS", "/v1/chat/completions", None, {**preflight, "Origin": listed})
        assert status == 204 and headers["access-control-allow-origin"] == listed
        status, headers, _ = request(base, "POST", "/v1/chat/completions", chat(), {"Origin": listed}, key)
        assert status == 200 and headers["access-control-allow-origin"] == listed
    port = urlparse(base).port
    status, _, answer = request(base, "GET", "/v1/models", None, {"Host": f"evil.example:{port}"}, key)
    assert_error_shape(status, answer, 421, "serve.allowed_hosts")
    assert request(base, "GET", "/v1/models", None, {"Host": f"localhost:{port}"}, key)[0] == 200


def probe_big_body(base: str, key: str | None = None) -> None:
    """20 MB gets 413 in the error shape, answered while the client is still sending (it is never read whole),
    with and without a Content-Length; an ordinary client sending it all gets the 413 too."""
    url = urlparse(base)
    big = 20 * 1024 * 1024
    for framing in (f"Content-Length: {big}", "Transfer-Encoding: chunked"):
        with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
            head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
            head += f"Authorization: Bearer {key}\r\n" if key else ""
            sock.sendall(f"{head}{framing}\r\n\r\n".encode())
            answer, sent = b"", 0
            while b"\r\n\r\n" not in answer and sent < big:
                chunk = b"a" * 65536
                sock.sendall(chunk if "Length" in framing else b"10000\r\n" + chunk + b"\r\n")
                sent += len(chunk)
                answer += _ready(sock)
            assert sent < big, "the 413 came only after the whole body was sent"
            head, _, body = (answer + _rest(sock, answer)).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), head
        assert json.loads(body)["error"]["code"] == 413
    status, _, answer = request(base, "POST", "/v1/chat/completions", b'{"messages": "' + b"a" * big + b'"}', key=key)
    assert_error_shape(status, answer, 413, "serve.max_body_bytes")


def _rest(sock: socket.socket, answer: bytes) -> bytes:
    """The rest of a response whose start is `answer` (read up to its Content-Length)."""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: (\d+)", head)[1])
    rest = b""
    while len(body) + len(rest) < length:
        rest += sock.recv(65536)
    return rest


def _ready(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    try:
        return sock.recv(65536)
    except BlockingIOError:
        return b""
    finally:
        sock.setblocking(True)


def probe_deep_json_and_limits(base: str, key: str | None = None) -> None:
    status, _, answer = request(base, "POST", "/v1/chat/completions", nested(100_000), key=key)
    assert_error_shape(status, answer, 400, "deep")
    for field in ("max_tokens", "max_completion_tokens"):
        status, _, answer = request(base, "POST", "/v1/chat/completions", chat(**{field: 10**9}), key=key)
        assert assert_error_shape(status, answer, 400, "context")["param"] == field
    status, _, answer = request(base, "POST", "/v1/chat/completions", chat(n=5), key=key)
    assert assert_error_shape(status, answer, 400, "serve.max_n")["param"] == "n"
    assert request(base, "POST", "/v1/chat/completions", chat(), key=key)[0] == 200


def probe_flood(base: str, clients: int = 100, key: str | None = None) -> dict[int, int]:
    """`clients` chats at once: each gets 200 or 503 (with Retry-After), none hangs; /health answers after."""
    import httpx

    async def flood() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=None)
        auth = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits, headers=auth) as client:
            body = chat(4)
            return await asyncio.gather(*(client.post("/v1/chat/completions", content=body) for _ in range(clients)))

    answers = asyncio.run(flood())
    counts: dict[int, int] = {}
    for resp in answers:
        counts[resp.status_code] = counts.get(resp.status_code, 0) + 1
        if resp.status_code == 503:
            assert resp.headers["retry-after"].isdigit()
            assert_error_shape(503, resp.content, 503, "busy")
    assert set(counts) <= {200, 503}, counts
    assert counts.get(503, 0) >= 1 and counts.get(200, 0) >= 1, counts
    assert request(base, "GET", "/health")[0] == 200
    return counts


def gateway_metrics(base: str, key: str | None = None) -> dict[str, float]:
    text = request(base, "GET", "/metrics", key=key)[2].decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^([a-z_:]+)(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)}


def probe_disconnect(base: str, key: str | None = None, running: str = "llamacpp:requests_processing") -> None:
    """Clients that go away mid-generation (streamed and not) free their slots: the backend stops generating (its
    `running` gauge drops to 0; llama-server's token count shows far fewer than 4 x 400 made) and the gateway's
    slots are free."""
    import httpx

    before = gateway_metrics(base, key)
    long = chat(400, ignore_eos=True, temperature=1.0)
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    for stream in (True, True, False, False):
        body = chat(400, ignore_eos=True, temperature=1.0, stream=True) if stream else long
        try:
            with (
                httpx.Client(base_url=base, timeout=0.5, headers=auth) as client,
                client.stream("POST", "/v1/chat/completions", content=body) as resp,
            ):
                next(resp.iter_raw())  # the first event: it is generating; then hang up
        except httpx.ReadTimeout:
            pass  # the non-streamed answer never came: hung up after 0.5 s
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = gateway_metrics(base, key)
        if now.get(running, 0) == 0 and now["forge_gateway_requests_in_flight"] == 0:
            break
        time.sleep(0.2)
    gone = now["forge_gateway_requests_clients_gone_total"] - before["forge_gateway_requests_clients_gone_total"]
    assert 2 <= gone <= 4  # the streams hung up after their first token; a fast backend may finish the others first
    assert now[running] == 0 and now["forge_gateway_requests_in_flight"] == 0
    if "llamacpp:tokens_predicted_total" in now:
        made = now["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
        assert made < 800, f"{made} tokens made for 4 clients that hung up: the generations were not stopped"
    assert request(base, "POST", "/v1/chat/completions", chat(), key=key)[0] == 200


# ----------------------------------------------------------------------------------------------------------------
# the real gateway in front of the real llama-server


@pytest.fixture(scope="module")
def gateway(smollm2_gguf, tmp_path_factory):
    from serve.stage import plan_server

    cfg = ForgeConfig.model_validate({"registry": {"model_name": ALIAS}, "serve": {
        "n_ctx": 512, "parallel": 4, "queue": 16, "cors_origins": [LISTED], "request_timeout_s": 120}})  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORGE_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))
        backend, _ = plan_server(cfg, gguf=smollm2_gguf, port=free_port())
        with backend:
            yield backend.base_url.removesuffix("/v1")


@pytest.mark.integration
def test_foreign_origin_and_wrong_host_are_refused(gateway):
    probe_origin_and_host(gateway, listed=LISTED)


@pytest.mark.integration
def test_a_20_mb_body_gets_413_before_it_is_read(gateway):
    probe_big_body(gateway)


@pytest.mark.integration
def test_deep_json_token_budget_and_choices_are_refused(gateway):
    probe_deep_json_and_limits(gateway)


@pytest.mark.integration
def test_100_clients_at_once_get_200_or_503_and_the_server_stays_up(gateway):
    counts = probe_flood(gateway)
    print("\n100 clients, parallel 4, queue 16:", counts)
    assert counts[200] >= 20  # the 4 running and the 16 queued are all answered
    metrics = gateway_metrics(gateway)
    assert metrics["forge_gateway_requests_in_flight"] == 0 and metrics["forge_gateway_requests_waiting"] == 0


@pytest.mark.integration
def test_a_client_that_hangs_up_frees_its_slot(gateway):
    probe_disconnect(gateway)


# ----------------------------------------------------------------------------------------------------------------
# a backend that never answers: the queue's bound and the timeout, deterministically

SILENT = "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[-1]))); s.listen(64); " \
         "c = [s.accept() for _ in iter(int, 1)]"  # fmt: skip


@pytest.mark.integration
def test_the_queue_refuses_at_once_and_a_stalled_answer_times_out(tmp_path):
    import httpx

    port = free_port()
    command = [sys.executable, "-m", "serve.gateway", "--port", str(port), "--parallel", "1", "--queue", "1",
               "--request-timeout-s", "3", "--", sys.executable, "-c", SILENT]  # fmt: skip
    proc = subprocess.Popen(command, cwd=Path(__file__).resolve().parent.parent, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_listening(port, proc)

        async def three() -> list[tuple[str, int]]:
            order: list[tuple[str, int]] = []
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:

                async def one(name: str, delay: float) -> None:
                    await asyncio.sleep(delay)
                    order.append((name, (await client.post("/v1/chat/completions", content=chat())).status_code))

                await asyncio.gather(one("running", 0), one("queued", 0.3), one("refused", 0.6))
            return order

        # the third is refused while the other two still wait on the silent backend; both then time out
        assert asyncio.run(three()) == [("refused", 503), ("running", 504), ("queued", 504)]
        status, _, answer = request(base, "GET", "/v1/models")
        assert_error_shape(status, answer, 504, "serve.request_timeout_s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the gateway and its silent backend
        proc.wait(timeout=30)


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"the gateway did not listen on {port} (exit code {proc.poll()})")
