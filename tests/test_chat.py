"""`forge chat`: Gradio 6 history flattened to strings, request limits refused politely, backend errors shown in
the chat, streaming through the `openai` client, and the real UI driven in headless Chromium with Playwright."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import free_port
from test_serve import ALIAS, gguf_path, serve_cfg  # noqa: F401 - gguf_path is a fixture

from forge.config import ServeConfig

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # fmt: skip


def test_gradio6_history_is_flattened_to_strings():
    from serve.chat_ui import build_messages

    history = [
        {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "a list?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A sequence."}], "metadata": None},
        {"role": "assistant", "content": "plain string"},
    ]
    msgs = build_messages({"text": "And a dict?", "files": []}, history, "Be brief.")
    assert msgs == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a list?"},
        {"role": "assistant", "content": "A sequence."},
        {"role": "assistant", "content": "plain string"},
        {"role": "user", "content": "And a dict?"},
    ]
    assert all(isinstance(m["content"], str) for m in msgs)
    assert build_messages("hi", [], "  ")[0] == {"role": "user", "content": "hi"}


class FakeClient:
    """Records the request; streams the given pieces or raises."""

    def __init__(self, pieces=(), error=None):
        self.pieces, self.error, self.calls = list(pieces), error, []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **kwargs):
        self.calls.append(kwargs)
        if self.error:
            raise self.error
        yield SimpleNamespace(choices=[])  # a usage-only chunk: skipped
        for piece in self.pieces:
            yield SimpleNamespace(choices=[SimpleNamespace(delta=SimpleNamespace(content=piece))])


def _respond(client, **limits):
    from serve.chat_ui import make_respond

    return make_respond(client, "m", ServeConfig(**limits))


def test_streams_accumulated_text():
    client = FakeClient(["Hel", "lo", None, "!"])
    out = list(_respond(client)("hi", [], "sys", 0.5, 32, 0.9))
    assert out == ["Hel", "Hello", "Hello!"]
    call = client.calls[0]
    assert call["stream"] is True and call["max_tokens"] == 32 and call["temperature"] == 0.5 and call["top_p"] == 0.9
    assert call["messages"][0] == {"role": "system", "content": "sys"}


@pytest.mark.parametrize(
    ("message", "history", "temperature", "max_tokens", "expected"),
    [
        ("x" * 101, [], 0.7, 16, "message is too long (101 characters; the limit is 100)"),
        ("ok", [{"role": "user", "content": "y" * 299}], 0.7, 16, "conversation is too long"),
        ("ok", [], 2.5, 16, "temperature must be between 0 and 2"),
        ("ok", [], 0.7, 65, "max tokens must be between 1 and 64"),
        ("   ", [], 0.7, 16, "type a question"),
    ],
)
def test_limits_are_refused_politely_without_calling_the_backend(message, history, temperature, max_tokens, expected):
    client = FakeClient(["never"])
    out = list(_respond(client, max_message_chars=100, max_history_chars=300, max_new_tokens=64)(
        message, history, "", temperature, max_tokens, 1.0))  # fmt: skip
    assert len(out) == 1 and expected in out[0]
    assert client.calls == []


def test_backend_error_is_a_chat_message_not_a_crash():
    out = list(_respond(FakeClient(error=ConnectionError("connection refused")))("hi", [], "", 0.7, 16, 1.0))
    assert len(out) == 1 and "error" in out[0] and "connection refused" in out[0]


@pytest.mark.slow
def test_browser_chat_streams_and_refuses_long_message(gguf_path):  # noqa: F811
    """Real llama.cpp server + real Gradio UI + headless Chromium."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium not installed")
    from gradio_client import Client
    from playwright.sync_api import expect, sync_playwright

    from serve.chat_ui import build_ui, launch
    from serve.stage import plan_server

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    cfg = serve_cfg(max_message_chars=200, max_new_tokens=64)
    backend, info = plan_server(cfg, gguf=gguf_path, port=free_port())
    ui_port = free_port()
    with backend:
        ui = build_ui(backend.base_url, ALIAS, cfg.serve, info={"name": ALIAS, "version": "3", "alias": "production"})
        launch(ui, "127.0.0.1", ui_port, block=False)
        url = f"http://127.0.0.1:{ui_port}"
        try:
            # the API endpoint streams: several growing partial answers
            job = Client(url, verbose=False).submit("What is a list?", "Be brief.", 1.0, 48, 1.0, api_name="/chat")
            partials = [out for out in job]
            assert len(partials) >= 2 and all(isinstance(p, str) for p in partials)
            assert partials[-1].startswith(partials[0])

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                page = browser.new_page()
                page.goto(url)
                expect(page.get_by_text(f"Forge chat: {ALIAS}")).to_be_visible(timeout=30_000)
                expect(page.get_by_text("version 3")).to_be_visible()
                # record every text the answer shows while it streams
                page.evaluate("""() => { window.__seen = [];
                    new MutationObserver(() => { const m = document.querySelectorAll('.bot.message');
                        if (m.length) window.__seen.push(m[m.length - 1].innerText); })
                    .observe(document.body, {subtree: true, childList: true, characterData: true}); }""")
                box = page.get_by_test_id("textbox").first
                box.fill("What is a list?")
                page.locator(".submit-button").click()
                answer = page.locator(".bot.message").last
                expect(answer).not_to_have_text("", timeout=60_000)
                page.wait_for_timeout(1500)
                seen = [s for s in page.evaluate("window.__seen") if s.strip()]
                assert len(set(seen)) >= 2, f"expected the answer to grow while streaming, saw {seen[-3:]}"
                assert "error" not in answer.inner_text().lower()

                box.fill("z" * 300)
                page.locator(".submit-button").click()
                refusal = page.locator(".bot.message").nth(1)
                expect(refusal).to_contain_text("too long", timeout=30_000)
                expect(refusal).to_contain_text("the limit is 200")
                browser.close()
        finally:
            ui.close()
