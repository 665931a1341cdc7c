"""A non-streamed completion asked of the backend as a stream and put back together (serve/gateway.py).

Why: llama-server stops a generation whose client went away only when writing to it fails, which happens only for
a stream; a non-streamed request runs to its end in a slot nobody waits on (measured on the pinned build: 400
tokens kept generating for 25 s after the client hung up; ggml-org/llama.cpp#24496). Asked as a stream, the
gateway's closing of the connection stops it within a second. The answer the client gets is the one it asked for:
the chunks' text, tool calls and log-probabilities joined per choice, the last finish_reason, the usage (asked for
with stream_options.include_usage) and anything else the chunks carry (llama-server's timings).
"""

from __future__ import annotations

import json
from typing import Any


def as_stream(request: dict[str, Any]) -> bytes:
    """The body asking the backend for the same completion as a stream, usage included."""
    options = {**(request.get("stream_options") or {}), "include_usage": True}
    return json.dumps({**request, "stream": True, "stream_options": options}).encode()


class EventReader:
    """Server-sent events from chunks of bytes: the JSON of each `data:` line, until `data: [DONE]`."""

    def __init__(self) -> None:
        self.buffer, self.events, self.done = b"", [], False

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk.replace(b"\r\n", b"\n")
        *complete, self.buffer = self.buffer.split(b"\n\n")
        for event in complete:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                elif payload:
                    self.events.append(json.loads(payload))


def assemble(events: list[dict[str, Any]]) -> dict[str, Any]:
    """One chat.completion or text_completion from the chunks of its stream."""
    answer: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for event in events:
        answer |= {k: v for k, v in event.items() if k != "choices" and v is not None}
        for part in event.get("choices") or []:
            index = part.get("index", 0)
            choice = choices.setdefault(index, {"index": index, "finish_reason": None, "logprobs": None})
            if part.get("finish_reason"):
                choice["finish_reason"] = part["finish_reason"]
            choice["logprobs"] = _joined_logprobs(choice["logprobs"], part.get("logprobs"))
            if "delta" in part:
                _add_delta(choice.setdefault("message", {"role": "assistant", "content": None}), part["delta"] or {})
            else:
                choice["text"] = choice.get("text", "") + (part.get("text") or "")
    for choice in choices.values():
        message = choice.get("message")
        if message is not None and message["content"] is None and not message.get("tool_calls"):
            message["content"] = ""  # a reply of no text (EOS first) is "" in a non-streamed answer, not null
    answer["object"] = str(answer.get("object", "chat.completion.chunk")).removesuffix(".chunk")
    answer["choices"] = [choices[i] for i in sorted(choices)]
    return answer


def _add_delta(message: dict[str, Any], delta: dict[str, Any]) -> None:
    """Text fields are joined; tool calls by their index (id, type and name once, arguments joined)."""
    for key, value in delta.items():
        if key == "tool_calls":
            calls = message.setdefault("tool_calls", [])
            for call in value or []:
                while len(calls) <= call.get("index", 0):
                    calls.append({"id": None, "type": "function", "function": {"name": None, "arguments": ""}})
                whole = calls[call.get("index", 0)]
                whole["id"] = call.get("id") or whole["id"]
                whole["type"] = call.get("type") or whole["type"]
                function = call.get("function") or {}
                whole["function"]["name"] = function.get("name") or whole["function"]["name"]
                whole["function"]["arguments"] += function.get("arguments") or ""
        elif isinstance(value, str) and key != "role":
            message[key] = (message.get(key) or "") + value
        elif value is not None:
            message[key] = value


def _joined_logprobs(so_far: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, Any] | None:
    """Log-probabilities come as lists per chunk (chat: content; completions: tokens, token_logprobs...)."""
    if not more:
        return so_far
    if so_far is None:
        return {k: list(v) if isinstance(v, list) else v for k, v in more.items()}
    for key, value in more.items():
        if isinstance(value, list):
            so_far.setdefault(key, []).extend(value)
    return so_far
