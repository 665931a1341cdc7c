"""What serve/gateway.py lets through, as pure functions of a request's headers and body (no I/O, no server): the
Host and Origin checks, the CORS headers granted to listed origins, and the checks of a JSON body (nesting depth,
validity, the chat shape llama-server answers with a 500, and the limits on `max_tokens` and `n`).

Each check returns why a request is refused (a sentence naming the field and the fix), or None.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
JSON_ENDPOINTS = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions")
PASSED = (*JSON_ENDPOINTS, "/health", "/metrics", "/v1/models", "/models")
# The token budget of one request, under every name the backends read (llama-server also takes n_predict).
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def error_body(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> bytes:
    """The OpenAI error object (and llama-server's own shape: code is the HTTP status)."""
    return json.dumps({"error": {"code": status, "message": message, "type": kind, "param": param}}).encode()


# ----------------------------------------------------------------------------------------------------------------
# Host and Origin


def host_name(value: str) -> str:
    """The name in a Host header or a bound address, lower case, without port or IPv6 brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _loopback(name: str) -> bool:
    address = _ip(name)
    return name == "localhost" or (address is not None and address.is_loopback)


def host_refusal(host: str | None, bound: str, allowed_hosts: Sequence[str]) -> str | None:
    """Why a request's Host header is refused (DNS rebinding: a page of evil.example whose name now resolves to
    127.0.0.1 sends `Host: evil.example`), else None. No Host at all is no browser's request: accepted."""
    if host is None:
        return None
    name, bound_name = host_name(host), host_name(bound)
    listed = {host_name(h) for h in allowed_hosts}
    if "*" in listed or name in listed or name == bound_name:
        return None
    if _loopback(bound_name) and _loopback(name):
        return None
    # Bound to every interface (a container's published port, a LAN), the server is reached by names nobody can
    # list in advance: its IP, a container or host name. A rebinding attack needs a name whose DNS the attacker
    # answers, always a dotted public name; an IP literal or a one-label name (resolved by the local network) cannot
    # be one. So those are accepted and a dotted name must be in serve.allowed_hosts (gateway.py warns at start).
    if bound_name in WILDCARD_HOSTS and (_ip(name) is not None or "." not in name):
        return None
    return f"Host {host!r} is not a name of this server ({bound}): add it to serve.allowed_hosts if it is one"


def origin_listed(origin: str, cors_origins: Sequence[str]) -> bool:
    return "*" in cors_origins or origin.rstrip("/").lower() in {o.rstrip("/").lower() for o in cors_origins}


def origin_refusal(origin: str | None, cors_origins: Sequence[str]) -> str | None:
    """Why a request from a browser page is refused. The gateway serves no page of its own, so every Origin is
    another site's: only serve.cors_origins may call the API (a simple POST needs no preflight, so refusing the
    grant alone would still let any page make the model generate)."""
    if origin is None or origin_listed(origin, cors_origins):
        return None
    return f"requests from pages of {origin} are refused: add the origin to serve.cors_origins to allow it"


def cors_headers(origin: str | None, cors_origins: Sequence[str], preflight_headers: str | None = None) -> list:
    """The CORS response headers for a listed origin (none for any other); with preflight_headers (the request's
    Access-Control-Request-Headers), those of a preflight answer. No credentials: the API takes a bearer key,
    never a cookie."""
    if origin is None or not origin_listed(origin, cors_origins):
        return []
    granted = "*" if cors_origins == ["*"] else origin
    headers = [(b"access-control-allow-origin", granted.encode()), (b"vary", b"Origin")]
    if preflight_headers is not None:
        headers += [
            (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
            (b"access-control-allow-headers", (preflight_headers or "authorization, content-type").encode()),
            (b"access-control-max-age", b"600"),
        ]
    return headers


# ----------------------------------------------------------------------------------------------------------------
# the body


_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_ONE_KIND = bytes.maketrans(b"{}", b"[]")


def outside_strings(body: bytes) -> bytes:
    """The body with every JSON string cut out, in linear time: escaped backslashes and escaped quotes are dropped
    (a backslash is only valid inside a string), then every quote left opens or closes one, so the even pieces
    between quotes are what lies outside. (A regex for strings is quadratic on an unterminated one.)"""
    return b"".join(body.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[::2])


def nests_deeper(body: bytes, limit: int) -> bool:
    """Whether arrays/objects nest more than `limit` deep, found without recursing: json.loads recurses once per
    level (a deep enough body is a RecursionError, and each level costs a C stack frame), this scans the bytes.
    Outside the strings, with both kinds of bracket made one, a run of limit+1 openers is too deep at once; else
    each pass removes the innermost pairs, and after `limit` passes a body no deeper than that is gone.
    Unbalanced brackets are json.loads' to report."""
    brackets = outside_strings(body).translate(_ONE_KIND, _NOT_BRACKETS)
    too_deep = b"[" * (limit + 1)
    for _ in range(limit):
        if brackets.count(b"[") <= limit:
            return False
        if too_deep in brackets:
            return True
        shorter = brackets.replace(b"[]", b"")
        if shorter == brackets:
            return False
        brackets = shorter
    return bool(brackets)


def check_request(
    path: str, body: bytes, max_depth: int = 32, n_ctx: int | None = None, max_n: int = 1
) -> tuple[str, str | None] | None:
    """(message, param) of why a body is refused with 400: one llama-server would answer with a 5xx or generate
    unbounded for, one nested deeper than max_depth, or one asking for more than the limits. Else None."""
    if nests_deeper(body, max_depth):
        return f"the request body nests arrays or objects more than {max_depth} deep (serve.max_json_depth)", None
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
    problem = _check_limits(request, n_ctx, max_n)
    if problem is None and "chat/completions" in path:
        problem = _check_chat(request)
    return problem


def _check_limits(request: dict[str, Any], n_ctx: int | None, max_n: int) -> tuple[str, str | None] | None:
    """A token budget beyond the context is refused, not capped: it can never be met, and the OpenAI API (and
    vLLM) answer it with a 400 naming the context, which is what a client is written to handle. llama-server would
    take it and generate until the slot is full. Wrong types are left to the backend (it answers them with 400)."""
    for field in TOKEN_FIELDS:
        value = request.get(field)
        if n_ctx and isinstance(value, int) and not isinstance(value, bool) and value > n_ctx:
            return (f"{field}={value} is more than the {n_ctx}-token context a request holds (prompt included): "
                    f"ask for at most {n_ctx}"), field  # fmt: skip
    for field in ("n", "best_of"):
        value = request.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > max_n:
            return f"{field}={value}: at most {max_n} choices per request are served (serve.max_n)", field
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
