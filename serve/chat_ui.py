"""`forge chat`: a Gradio 6 ChatInterface in front of an OpenAI-compatible server (llama.cpp or vLLM).

It streams through the official `openai` client, shows which model/version/alias it talks to, lets the user set a
system prompt and sampling settings, enforces the request limits of ServeConfig with a polite message in the chat,
and turns backend errors into a chat message instead of a crash. Binds 127.0.0.1, never a share link; pass auth
(user, password) when the UI is exposed beyond loopback.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from forge.config import ServeConfig

log = logging.getLogger("forge.chat")

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant for this domain. Answer briefly."


def flatten_content(content: Any) -> str:
    """Gradio 6 history content (a string, a list of {"type": "text", "text": ...} parts, or a dict) -> a string;
    llama.cpp renders a list of parts as a Python repr otherwise."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text") or "")
    if isinstance(content, list | tuple):
        return "".join(flatten_content(part) for part in content)
    return str(content)


def build_messages(message: Any, history: list[dict[str, Any]], system_prompt: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt and system_prompt.strip() else []
    for turn in history or []:
        role = turn.get("role") if isinstance(turn, dict) else None
        if role in ("user", "assistant"):
            messages.append({"role": role, "content": flatten_content(turn.get("content"))})
    messages.append({"role": "user", "content": flatten_content(message)})
    return messages


def check_limits(
    messages: list[dict[str, str]], temperature: float, max_tokens: int, limits: ServeConfig
) -> str | None:
    """A polite sentence when the request breaks a limit, else None."""
    last = messages[-1]["content"]
    if not last.strip():
        return "Please type a question first."
    if len(last) > limits.max_message_chars:
        return (
            f"Sorry, your message is too long ({len(last):,} characters; the limit is "
            f"{limits.max_message_chars:,}). Please shorten it and try again."
        )
    total = sum(len(m["content"]) for m in messages)
    if total > limits.max_history_chars:
        return (
            f"Sorry, this conversation is too long ({total:,} characters; the limit is "
            f"{limits.max_history_chars:,}). Please clear the chat and start a new one."
        )
    if not 0.0 <= float(temperature) <= 2.0:
        return f"Sorry, temperature must be between 0 and 2 (got {temperature})."
    if not 1 <= int(max_tokens) <= limits.max_new_tokens:
        return f"Sorry, max tokens must be between 1 and {limits.max_new_tokens} (got {max_tokens})."
    return None


def make_respond(client: Any, model: str, limits: ServeConfig):
    """The ChatInterface function: yields the accumulated answer, or one polite/error message."""

    def respond(
        message: Any,
        history: list[dict[str, Any]],
        system_prompt: str,
        temperature: float,
        max_tokens: float,
        top_p: float,
    ) -> Iterator[str]:
        messages = build_messages(message, history, system_prompt)
        refusal = check_limits(messages, temperature, int(max_tokens), limits)
        if refusal:
            yield refusal
            return
        text = ""
        try:
            stream = client.chat.completions.create(
                model=model,
                messages=messages,
                stream=True,
                temperature=float(temperature),
                max_tokens=int(max_tokens),
                top_p=float(top_p),
            )
            for chunk in stream:
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta.content or ""
                if delta:
                    text += delta
                    yield text
        except Exception as exc:  # noqa: BLE001 - any backend failure becomes a message, never a crash
            log.warning("backend error: %s", exc)
            yield (text + "\n\n" if text else "") + f"⚠️ The model server returned an error: {exc}"
            return
        if not text:
            yield "(the model returned an empty answer)"

    return respond


def build_ui(
    api_base: str,
    model: str,
    limits: ServeConfig,
    api_key: str | None = None,
    info: dict[str, Any] | None = None,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
) -> Any:
    """The gr.ChatInterface (not launched). info: {"name", "version", "alias", "backend"} shown in the header."""
    import gradio as gr
    from openai import OpenAI

    client = OpenAI(base_url=api_base, api_key=api_key or "none", timeout=120.0, max_retries=0)
    info = info or {}
    shown = ", ".join(f"{k} {v}" for k, v in info.items() if v not in (None, "")) or f"model {model}"
    description = (
        f"Serving **{model}** ({shown}) from `{api_base}`. Limits: {limits.max_message_chars:,} characters per "
        f"message, {limits.max_history_chars:,} per conversation, {limits.max_new_tokens} new tokens."
    )
    return gr.ChatInterface(
        make_respond(client, model, limits),
        title=f"Forge chat: {model}",
        description=description,
        additional_inputs=[
            gr.Textbox(system_prompt, label="System prompt", lines=2),
            gr.Slider(0.0, 2.0, value=limits.temperature, step=0.05, label="Temperature"),
            gr.Slider(1, limits.max_new_tokens, value=min(256, limits.max_new_tokens), step=1, label="Max tokens"),
            gr.Slider(0.05, 1.0, value=0.95, step=0.05, label="Top p"),
        ],
        api_name="chat",
        fill_height=True,
        analytics_enabled=False,
    )


def launch(
    ui: Any, host: str = "127.0.0.1", port: int = 7860, auth: tuple[str, str] | None = None, block: bool = True
) -> Any:
    if host not in ("127.0.0.1", "localhost", "::1") and auth is None:
        log.warning("the chat UI is exposed on %s without auth: set FORGE_UI_USER and FORGE_UI_PASSWORD", host)
    ui.queue(default_concurrency_limit=8)
    return ui.launch(
        server_name=host,
        server_port=port,
        share=False,
        auth=auth,
        prevent_thread_lock=not block,
        quiet=True,
        show_error=True,
    )
