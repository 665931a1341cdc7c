"""An Ollama Modelfile for a bundle's GGUF: FROM the GGUF, a TEMPLATE that renders a conversation as the model's own
chat template does, and the model's stop tokens.

    text = modelfile(Path("bundle/model-q4_k_m.gguf"))      # then: ollama create NAME -f Modelfile

Ollama speaks Go templates, the model's template is Jinja, and a wrong template is the most common fault of a
fine-tune deployed to Ollama. So the template is not translated: it is measured. The Jinja template (the GGUF's
tokenizer.chat_template, which SFT trained with) renders a few conversations with marker contents, and the text
around the markers is each role's prefix and suffix, the generation prompt and the text before the first turn. The
pieces are checked against the Jinja rendering of a longer conversation before they are written (`Turns.render` is
the Go template's logic in Python), and a template whose turns are not prefix + content + suffix is refused with
what was found. A template that has no system turn but puts the system text into the first user turn (Gemma's) is
rendered that way too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from forge import ForgeError

MARK = {"system": "FORGEsysMARK", "user": "FORGEuserMARK", "assistant": "FORGEasstMARK", "user2": "FORGEuser2MARK"}


@dataclass(frozen=True)
class Turns:
    start: str  # before the first turn (a BOS the template writes)
    prefix: dict[str, str]  # role -> the text before its content (the assistant's: the generation prompt)
    suffix: dict[str, str]  # role -> the text after it
    generation: str  # the generation prompt: what opens the assistant's turn
    default_system: str = ""  # written after `start` when the conversation has no system message (SmolLM2's)
    system_in_user: str | None = None  # no system turn: the system text and this go before the first user text

    def render(self, messages: list[dict[str, str]]) -> str:
        """What the Go template below renders (the same logic, for the check against Jinja)."""
        out, system = self.start, ""
        if not messages or messages[0]["role"] != "system":
            out += self.default_system
        for message in messages:
            role, content = message["role"], message["content"]
            if role == "system" and self.system_in_user is not None:
                system = content + self.system_in_user
                continue
            if role == "user" and system:
                content, system = system + content, ""
            out += self.prefix[role] + content + self.suffix[role]
        return out + self.generation


def measure_turns(render: Any) -> Turns:
    """The turns of a chat template, from `render(messages, add_generation_prompt)` of marker conversations."""
    user, assistant = [{"role": "user", "content": MARK["user"]}], {"role": "assistant", "content": MARK["assistant"]}
    one, one_gen = render(user, False), render(user, True)
    two = render([*user, assistant], False)
    three = render([*user, assistant, {"role": "user", "content": MARK["user2"]}], False)
    if not (one_gen.startswith(one) and two.startswith(one_gen) and three.startswith(two)):
        raise _refuse("a conversation's rendering does not extend the rendering of its first turns", three)
    generation = one_gen[len(one) :]
    assistant_suffix = _after(two, MARK["assistant"])
    if two[len(one_gen) :] != MARK["assistant"] + assistant_suffix:
        raise _refuse("the assistant's turn is not the generation prompt + its text + a suffix", two)
    user_prefix = three[len(two) : three.index(MARK["user2"])]
    user_suffix = _after(three, MARK["user2"])
    before_user = one[: one.index(MARK["user"])]
    if not before_user.endswith(user_prefix) or _after(one, MARK["user"]) != user_suffix:
        raise _refuse("the first user turn is not shaped like the next", one)
    turns = Turns(before_user[: len(before_user) - len(user_prefix)], {"user": user_prefix, "assistant": generation},
                  {"user": user_suffix, "assistant": assistant_suffix}, generation)  # fmt: skip
    return _with_system(turns, render)


def _with_system(turns: Turns, render: Any) -> Turns:
    """Add the system turn: its own prefix and suffix, or (a template with none) the text joining it to the first
    user turn; a template that refuses a system message gets none."""
    from jinja2.exceptions import TemplateError

    messages = [{"role": "system", "content": MARK["system"]}, {"role": "user", "content": MARK["user"]}]
    try:
        text = render(messages, False)
    except TemplateError:
        return turns
    if MARK["system"] not in text:
        raise _refuse("the template drops the system message", text)
    head, tail = text.split(MARK["system"], 1)
    user_at = tail.index(MARK["user"])
    if tail.find(turns.prefix["user"]) == -1 or tail.index(turns.prefix["user"]) > user_at:  # no user turn between
        if head != turns.start + turns.prefix["user"]:
            raise _refuse("the system text is neither a turn of its own nor the start of the first user turn", text)
        return Turns(turns.start, turns.prefix, turns.suffix, turns.generation, system_in_user=tail[:user_at])
    # What comes before the system turn is shared with a conversation without one; the rest of what that one has
    # before its first user turn is the template's default system message.
    start = os.path.commonprefix([head, turns.start])
    prefix = {**turns.prefix, "system": head[len(start) :]}
    suffix = {**turns.suffix, "system": tail[: user_at - len(turns.prefix["user"])]}
    return Turns(start, prefix, suffix, turns.generation, default_system=turns.start[len(start) :])


def go_template(turns: Turns) -> str:
    """The Ollama TEMPLATE of `turns` (Go text/template over .Messages)."""
    q = json.dumps  # Go template string literals take JSON's escapes

    def turn(role: str) -> str:
        return f"{{{{ {q(turns.prefix[role])} }}}}{{{{ .Content }}}}{{{{ {q(turns.suffix[role])} }}}}"

    parts = [f"{{{{- {q(turns.start)} }}}}"]
    if turns.default_system:
        parts.append(f'{{{{- if or (not .Messages) (ne (index .Messages 0).Role "system") }}}}'
                     f"{{{{ {q(turns.default_system)} }}}}{{{{ end }}}}")  # fmt: skip
    parts.append('{{- $system := "" }}{{- range .Messages }}')
    if turns.system_in_user is not None:
        parts.append(
            f'{{{{- if eq .Role "system" }}}}{{{{ $system = printf "%s%s" .Content {q(turns.system_in_user)} }}}}'
        )
        parts.append(f'{{{{- else if eq .Role "user" }}}}{{{{ {q(turns.prefix["user"])} }}}}{{{{ $system }}}}'
                     f'{{{{ .Content }}}}{{{{ {q(turns.suffix["user"])} }}}}{{{{ $system = "" }}}}')  # fmt: skip
    elif "system" in turns.prefix:
        parts.append(f'{{{{- if eq .Role "system" }}}}{turn("system")}')
        parts.append(f'{{{{- else if eq .Role "user" }}}}{turn("user")}')
    else:  # the template refuses system messages: Ollama's are left out
        parts.append(f'{{{{- if eq .Role "user" }}}}{turn("user")}')
    parts.append(f'{{{{- else if eq .Role "assistant" }}}}{turn("assistant")}')
    parts.append("{{- end }}{{- end }}")
    parts.append(f"{{{{ {q(turns.generation)} }}}}")
    return "".join(parts)


def stop_tokens(turns: Turns, eos: str | None) -> list[str]:
    """The strings that end the assistant's turn: the EOS token and the assistant suffix's own marker."""
    stops = [eos] if eos else []
    marker = turns.suffix["assistant"].strip()
    if marker and marker not in stops:
        stops.append(marker)
    return stops


def modelfile(gguf: Path) -> str:
    """The Modelfile for `gguf` (named relative to the Modelfile, in the bundle's directory)."""
    template, bos, eos, adds_bos = _chat_facts(gguf)
    turns = measure_turns(_jinja_render(template, bos, eos))
    _check(turns, _jinja_render(template, bos, eos))
    if adds_bos and bos and turns.start.startswith(bos):  # the runtime adds it to every prompt: not twice
        turns = replace(turns, start=turns.start[len(bos) :])
    lines = [
        "# Ollama: ollama create NAME -f Modelfile   (the template was measured from the model's own chat template)",
        f"FROM ./{gguf.name}",
        f'TEMPLATE """{go_template(turns)}"""',
        *(f"PARAMETER stop {json.dumps(stop)}" for stop in stop_tokens(turns, eos)),
    ]
    return "\n".join(lines) + "\n"


def _check(turns: Turns, render: Any) -> None:
    """The measured turns render conversations with and without a system message as the Jinja template does."""
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "And?"}]  # fmt: skip
    system = [{"role": "system", "content": "Be brief."}]
    for conversation in (chat, system + chat) if "system" in turns.prefix or turns.system_in_user else (chat,):
        if turns.render(conversation) != render(conversation, True):
            raise _refuse("the measured turns do not reproduce a conversation", render(conversation, True))


def _chat_facts(gguf: Path) -> tuple[str, str | None, str | None, bool]:
    """The GGUF's chat template, its BOS and EOS token texts, and whether the runtime adds a BOS itself."""
    from models.gguf import gguf_metadata

    keys = ("tokenizer.chat_template", "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token")  # fmt: skip
    meta = gguf_metadata(gguf, *keys)
    template, tokens = meta["tokenizer.chat_template"], meta["tokenizer.ggml.tokens"] or []
    if not template:
        raise ForgeError(f"{gguf}: no tokenizer.chat_template in the GGUF: an Ollama Modelfile needs one")

    def token(key: str) -> str | None:
        index = meta[key]
        return str(tokens[int(index)]) if index is not None and int(index) < len(tokens) else None

    bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
    return str(template), bos, eos, bool(meta["tokenizer.ggml.add_bos_token"])


def _jinja_render(template: str, bos: str | None, eos: str | None) -> Any:
    """render(messages, add_generation_prompt) with the template, as transformers renders chat templates."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos or "", eos_token=eos or "")  # fmt: skip

    return render


def _after(text: str, marker: str) -> str:
    return text[text.index(marker) + len(marker) :]


def _refuse(why: str, rendered: str) -> ForgeError:
    return ForgeError(f"cannot write an Ollama TEMPLATE for this chat template: {why} (rendered: {rendered[:300]!r})")
