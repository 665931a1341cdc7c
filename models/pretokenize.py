"""Pre-tokenizers llama.cpp knows, the Hugging Face equivalent of each, and the check that they agree.

llama.cpp does not read a tokenizer's pre-tokenizer: a GGUF names one of its built-in types
(`tokenizer.ggml.pre`), each a fixed list of split regexes (llama.cpp's llama-vocab.cpp). A byte-level BPE
tokenizer is exported correctly only when its HF pre-tokenizer splits text exactly like the named type does:

    gpt-2    the GPT-2 regex: HF ByteLevel(use_regex=True) (Forge's own tokenizers, GPT-2)
    smollm   single digits, then the GPT-2 regex: HF Sequence[Digits(individual_digits=True), ByteLevel(use_regex)]
             (SmolLM/SmolLM2, StarCoder's "starcoder" and "refact" are the same regexes)

    name = llama_cpp_pre_type(tokenizer)         # which type splits like `tokenizer` on TRICKY_TEXT, or ForgeError
    check_llama_cpp_tokens(gguf_path, tokenizer) # llama.cpp's ids == the tokenizer's on TRICKY_TEXT, or ForgeError

The second check is the one that guarantees the GGUF tokenizes like the HF model: it runs llama.cpp itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forge import ForgeError

# Strings where pre-tokenizers differ: digit runs, English contractions (upper case too), accents, non-Latin
# scripts, emoji with modifiers, tabs, runs of spaces and newlines, leading/trailing whitespace, code punctuation.
TRICKY_TEXT = (
    "Hello world! It's 2024-12-04; we'll've done 1234567 things, 3.14159 and 42.\n\n"
    "\tTabs\t\tand    four spaces   \n naïve café Ελληνικά русский 日本語のテキスト 🤖👍🏽\n"
    "I'M SHOUTING, you're DON'T 've  \n\n\n   "
    'def f(x):\n    return x**2 + 0x1F  # comment\n    if a != b and c <= d: print(f"{a!r}")\n'
    "   end ..."
)


def _gpt2() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> Any:
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


# llama.cpp type -> the HF pre-tokenizer that splits text the same way
PRE_TOKENIZERS = {"gpt-2": _gpt2, "smollm": _digits_then_gpt2}
# other llama.cpp names for the same regexes
ALIASES = {"starcoder": "smollm", "refact": "smollm"}


def _splits(pre: Any, text: str = TRICKY_TEXT) -> list[str]:
    return [piece for piece, _ in pre.pre_tokenize_str(text)] if pre is not None else [text]


def set_pre_tokenizer(tokenizer: Any, llama_cpp_type: str, where: str) -> None:
    """Give a transformers fast tokenizer the HF pre-tokenizer of a llama.cpp type (a GGUF's tokenizer.ggml.pre)."""
    name = ALIASES.get(llama_cpp_type, llama_cpp_type)
    if name not in PRE_TOKENIZERS:
        raise ForgeError(
            f"{where}: llama.cpp pre-tokenizer {llama_cpp_type!r} has no Hugging Face equivalent here; supported: "
            f"{', '.join([*PRE_TOKENIZERS, *ALIASES])}"
        )
    tokenizer.backend_tokenizer.pre_tokenizer = PRE_TOKENIZERS[name]()


def llama_cpp_pre_type(tokenizer: Any, where: str) -> str:
    """The llama.cpp pre-tokenizer type that splits TRICKY_TEXT exactly like `tokenizer` (a fast tokenizer)."""
    backend = tokenizer.backend_tokenizer
    if backend.normalizer is not None:
        raise ForgeError(
            f"{where}: the tokenizer has a normalizer ({type(backend.normalizer).__name__}); llama.cpp's BPE "
            "tokenizer applies none, so a GGUF would tokenize differently: not exported"
        )
    ours = _splits(backend.pre_tokenizer)
    for name, build in PRE_TOKENIZERS.items():
        if _splits(build()) == ours:
            return name
    theirs = {name: _splits(build()) for name, build in PRE_TOKENIZERS.items()}
    first = {name: next((i for i, (a, b) in enumerate(zip(ours, s, strict=False)) if a != b), 0)
             for name, s in theirs.items()}  # fmt: skip
    detail = "; ".join(f"{n} splits {theirs[n][i : i + 2]} where it splits {ours[i : i + 2]}" for n, i in first.items())
    raise ForgeError(
        f"{where}: the tokenizer's pre-tokenizer matches none of llama.cpp's known types ({detail}); a GGUF would "
        f"tokenize differently, so it is not exported (supported: {', '.join(PRE_TOKENIZERS)})"
    )


def check_llama_cpp_tokens(gguf_path: Path, tokenizer: Any, text: str = TRICKY_TEXT) -> int:
    """Tokenize `text` with llama.cpp (the GGUF's vocabulary) and with `tokenizer`; ForgeError at the first
    difference. Returns the number of tokens compared."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    try:
        theirs = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    finally:
        llm.close()
    ours = tokenizer(text, add_special_tokens=False)["input_ids"]
    if list(theirs) != list(ours):
        at = next(
            (i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b), min(len(ours), len(theirs))
        )
        raise ForgeError(
            f"{gguf_path}: llama.cpp tokenizes the check text differently from the Hugging Face tokenizer at token "
            f"{at}: {tokenizer.convert_ids_to_tokens(list(ours[at : at + 3]))} vs llama.cpp's ids "
            f"{list(theirs[at : at + 3])} "
            f"({len(ours)} vs {len(theirs)} tokens); the GGUF was not written"
        )
    return len(ours)
