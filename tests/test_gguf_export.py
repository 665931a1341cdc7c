"""GGUF export of our models: llama.cpp tokenizes like the HF tokenizer, the f16 file's logits match the HF model for
llama and gpt2, the metadata carries the chat template and special ids, and damaged files are refused.

The helpers here (a tokenizer trained in a second on generated text, tiny models with hidden size 256 so K-quants
are real) are shared with test_quantize.py.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from forge import ForgeError
from forge.config import ModelConfig, TokenizerConfig

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "it",
    "for",
    "was",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "from",
    "have",
    "or",
    "by",
    "one",
    "had",
    "not",
    "but",
    "what",
    "all",
    "were",
    "when",
    "we",
    "there",
    "can",
    "an",
    "your",
    "which",
    "their",
    "said",
    "if",
    "do",
    "will",
    "each",
    "about",
    "how",
    "up",
    "out",
    "them",
    "then",
    "she",
    "many",
    "some",
    "def",
    "return",
    "class",
    "import",
    "self",
    "None",
    "True",
    "False",
    "list",
    "dict",
    "tuple",
    "print",
    "yield",
    "lambda",
    "value",
    "index",
]
EXTRA = ["café", "naïve", "façade", "Ünïcödé", "😀", "🚀", "中文", "—", "“quoted”", "…"]
CODE = ["def f(x):\n\treturn {'a': [1, 2, 3]}  # comment\n", "    if x  ==  1:\n        pass\n", "x = y\t# tab\n"]

# Accents, emoji, CJK, tabs, runs of spaces, code, CRLF, leading/trailing spaces.
TRICKY = [
    "café naïve façade Ünïcödé — “quotes” ‘single’ … 😀🚀 中文文本 日本語 한국어 Ελληνικά русский",
    "\tindented with a tab\tand  two  spaces,   three   spaces\n\n\n    four-space indent\n",
    "  leading spaces, trailing spaces   ",
    "def f(x):\n\treturn {'a': [1, 2, 3]}  # comment\n\nclass A(B):\n    x: int = 0x1F\n",
    "Windows line\r\nendings\r\n and 1234567 digits, 3.14159 and a_snake_case_name",
    "emoji 👩‍💻 with a zero-width joiner and 🇫🇷 flag",
]
CHAT = "<|system|>Be brief.<|user|>What is a list?<|assistant|>A mutable sequence.[EOS]<|user|>Hi<|assistant|>"


def generated_docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(4, 10)):
            words = rng.choices(WORDS, k=rng.randint(5, 12)) + rng.choices(EXTRA, k=rng.randint(0, 2))
            rng.shuffle(words)
            parts.append(" ".join(words).capitalize() + rng.choice([".", ".", "?", "!", ":\n"]))
            if rng.random() < 0.3:
                parts.append("\n" + rng.choice(CODE))
        docs.append(" ".join(parts))
    return docs


def make_tokenizer_dir(dest: Path, vocab_size: int = 640) -> Path:
    """A byte-level BPE trained like pretrain/tokenizer.py does, saved as a transformers tokenizer directory."""
    from pretrain.tokenizer import save_tokenizer, train_bpe

    tcfg = TokenizerConfig(vocab_size=vocab_size, min_frequency=2)
    tok = train_bpe(generated_docs(400), tcfg)
    dest.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, tcfg, dest)
    return dest


def tiny_model_config(arch: str, **overrides) -> ModelConfig:
    fields = dict(
        architecture=arch, hidden_size=256, num_layers=2, num_attention_heads=4, intermediate_size=512,
        context_length=128, initializer_range=0.05,
    )  # fmt: skip
    fields.update(overrides)
    return ModelConfig(**fields)


def make_model_dir(dest: Path, arch: str, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    """A random-init tiny model saved with the tokenizer files beside it (what forge pretrain exports)."""
    import shutil

    import torch
    from transformers import AutoTokenizer

    from pretrain.model import build_model

    torch.manual_seed(seed)
    vocab = len(AutoTokenizer.from_pretrained(tokenizer_dir))
    model = build_model(tiny_model_config(arch, **overrides), vocab)
    model.eval()
    model.save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tokenizer_dir / name, dest / name)
    return dest


def hf_ids(model_dir: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{variant: (model_dir, f16 gguf path)} for llama, gpt2 and gpt2 with an untied output layer."""
    from serve.gguf_export import export_gguf

    root = tmp_path_factory.mktemp("gguf")
    tok_dir = make_tokenizer_dir(root / "tokenizer")
    out = {}
    for variant in ("llama", "gpt2", "gpt2-untied"):
        arch = variant.split("-")[0]
        untied = {"tie_word_embeddings": False} if variant.endswith("untied") else {}
        model_dir = make_model_dir(root / variant, arch, tok_dir, **untied)
        info = export_gguf(model_dir, root / f"{variant}-f16.gguf")
        assert info["architecture"] == arch and info["size_bytes"] > 0
        out[variant] = (model_dir, root / f"{variant}-f16.gguf")
    return out


def test_llama_cpp_tokenizes_like_hf(exported):
    from llama_cpp import Llama

    model_dir, path = exported["llama"]
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        for text in TRICKY:
            expected = hf_ids(model_dir, text)
            assert llm.tokenize(text.encode(), add_bos=False, special=False) == expected, text
            assert llm.detokenize(expected).decode() == text
        # the chat format: role tokens and [EOS] are single control tokens in both
        chat = hf_ids(model_dir, CHAT)
        assert llm.tokenize(CHAT.encode(), add_bos=False, special=True) == chat
        assert chat[0] == 4 and chat.count(3) == 1
        # add_bos_token=false as in tokenizer_config.json: llama.cpp adds no BOS of its own
        assert llm.tokenize(b"hello", add_bos=True, special=False) == hf_ids(model_dir, "hello")
    finally:
        llm.close()


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt2-untied"])
def test_f16_logits_match_hf(exported, arch):
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM

    model_dir, path = exported[arch]
    ids = hf_ids(model_dir, " ".join(generated_docs(3, seed=7)))[:120]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    llm = Llama(model_path=str(path), n_ctx=128, n_batch=128, n_ubatch=128, logits_all=True, verbose=False)
    try:
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)])
    finally:
        llm.close()
    assert expected.std() > 0.3  # logits that vary: a wrong permutation or transpose could not pass below
    diff = np.abs(got - expected).max()
    assert diff < 0.01
    # same argmax wherever the top two HF logits are further apart than twice the largest difference (a random
    # model has near-ties, where f16 rounding may legitimately pick the other one)
    top2 = np.sort(expected, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * diff
    assert clear.mean() > 0.9
    assert (got.argmax(-1) == expected.argmax(-1))[clear].all()


def test_metadata_carries_tokenizer_and_chat_template(exported):
    import gguf

    from models.gguf import check_gguf, gguf_metadata

    model_dir, path = exported["gpt2"]
    meta = gguf_metadata(
        path, "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.token_type",
    )  # fmt: skip
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert meta["tokenizer.chat_template"] == (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (2, 3)
    types = meta["tokenizer.ggml.token_type"]
    assert types[:7] == [int(gguf.TokenType.CONTROL)] * 7 and types[300] == int(gguf.TokenType.NORMAL)
    info = check_gguf(path)
    assert info["tensor_types"] == {"F16": 10, "F32": 18}  # 2-D weights f16, norms and biases f32


def test_corrupted_or_truncated_gguf_is_refused(exported, tmp_path):
    from models.access import GGUFBackend
    from models.gguf import check_gguf

    _, path = exported["llama"]
    data = path.read_bytes()
    check_gguf(path)

    cases = {
        "half.gguf": (data[: len(data) // 2], "truncated"),
        "tail.gguf": (data[:-100], "truncated"),
        "header.gguf": (data[:10], "shorter than the 24-byte GGUF header"),
        "magic.gguf": (b"GGML" + data[4:], "not a GGUF file"),
        "metadata.gguf": (data[:24] + b"\xff" * 64 + data[88:], "corrupted"),
        "empty.gguf": (b"", "truncated"),
    }
    for name, (content, expected) in cases.items():
        bad = tmp_path / name
        bad.write_bytes(content)
        with pytest.raises(ForgeError, match=expected) as err:
            check_gguf(bad)
        assert str(bad) in str(err.value) and "forge quantize --force" in str(err.value)
    with pytest.raises(ForgeError, match="refusing GGUF file"):  # llama.cpp never sees it
        GGUFBackend(tmp_path / "half.gguf")
    with pytest.raises(ForgeError, match="not found"):
        check_gguf(tmp_path / "missing.gguf")


def test_gpt2_without_gelu_is_refused(tmp_path):
    from serve.gguf_export import export_gguf

    tok_dir = make_tokenizer_dir(tmp_path / "tok", vocab_size=320)
    model_dir = make_model_dir(tmp_path / "m", "gpt2", tok_dir, activation="relu", num_layers=1)
    with pytest.raises(ForgeError, match="model.activation"):
        export_gguf(model_dir, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()  # nothing half-written under the final name
