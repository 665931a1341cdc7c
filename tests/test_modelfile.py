"""The Ollama TEMPLATE is measured from a chat template, so it must render every conversation as the template does:
checked on each family's template style (tests/families.py), Forge's own, a default system message (SmolLM2's) and a
system text folded into the first user turn (Gemma 3's)."""

from __future__ import annotations

import pytest
from families import CHATML, GEMMA, LLAMA3, MISTRAL, OLMO2, PHI3

from forge import ForgeError
from serve.modelfile import _jinja_render, go_template, measure_turns, stop_tokens

FORGE = ("{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] }}"
         "{% if message['role'] == 'assistant' %}{{ '[EOS]' }}{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")  # fmt: skip
DEFAULT_SYSTEM = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                  "{{ '<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n' }}{% endif %}"
                  "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")  # fmt: skip
FOLDED_SYSTEM = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
                 "{% set first = messages[0]['content'] + '\\n\\n' %}{% set loop_messages = messages[1:] %}"
                 "{% else %}{% set first = '' %}{% set loop_messages = messages %}{% endif %}"
                 "{% for message in loop_messages %}{% set role = 'model' if message['role'] == 'assistant' "
                 "else message['role'] %}{{ '<start_of_turn>' + role + '\\n' + (first if loop.first else '') "
                 "+ message['content'] + '<end_of_turn>\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")  # fmt: skip
NO_SYSTEM = ("{% for message in messages %}{% if message['role'] == 'system' %}"
             "{{ raise_exception('System role not supported') }}{% endif %}"
             "{{ '<start_of_turn>' + message['role'] + '\\n' + message['content'] + '<end_of_turn>\\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<start_of_turn>assistant\\n' }}{% endif %}")  # fmt: skip
TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "gemma": GEMMA, "phi3": PHI3, "mistral": MISTRAL, "olmo2": OLMO2,
             "forge": FORGE, "default-system": DEFAULT_SYSTEM, "folded-system": FOLDED_SYSTEM,
             "no-system": NO_SYSTEM}  # fmt: skip
CHAT = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6, of course."},
        {"role": "user", "content": "Thanks"}]  # fmt: skip


@pytest.mark.parametrize("name", TEMPLATES)
def test_measured_turns_render_every_conversation_as_the_template_does(name):
    render = _jinja_render(TEMPLATES[name], "<s>", "</s>")
    turns = measure_turns(render)
    conversations = [CHAT[:1], CHAT[:3], CHAT]
    if name != "no-system":
        conversations += [[{"role": "system", "content": "Answer in one word."}, *c] for c in conversations]
    for conversation in conversations:
        assert turns.render(conversation) == render(conversation, True), conversation
    template = go_template(turns)
    assert template.count("{{- range .Messages }}") == 1 and template.count("{{- end }}{{- end }}") == 1
    assert ('eq .Role "system"' in template) == (name != "no-system")


def test_stop_tokens_are_the_eos_and_the_end_of_turn_marker():
    turns = measure_turns(_jinja_render(CHATML, "<s>", "</s>"))
    assert stop_tokens(turns, "</s>") == ["</s>", "<|im_end|>"]
    turns = measure_turns(_jinja_render(MISTRAL, "<s>", "</s>"))
    assert stop_tokens(turns, "</s>") == ["</s>"]


def test_a_template_whose_turns_depend_on_their_position_is_refused_with_what_was_rendered():
    numbered = ("{% for message in messages %}{{ loop.index|string + ':' + message['content'] + '\\n' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ 'A:' }}{% endif %}")  # fmt: skip
    with pytest.raises(ForgeError, match="cannot write an Ollama TEMPLATE .*rendered"):
        measure_turns(_jinja_render(numbered, None, None))
