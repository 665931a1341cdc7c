"""A GGUF file run by llama.cpp as a Backend (models/backend.py).

Scoring many sequences (`score_tails`) takes one llama.cpp evaluation per sequence that reuses the KV cache of the
ids it shares with the previous one, so the prompt all choices of a question share is evaluated once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forge import ForgeError
from forge.progress import progress
from models.backend import Backend, one_line, tokenizer_label
from models.gguf import check_gguf, gguf_metadata, load_llama
from models.perplexity import Perplexity, _nll_from_logits, perplexity_llama


class GGUFBackend(Backend):
    """A GGUF file through llama.cpp. `logits_all` keeps every position's logits (scoring needs them); without it
    llama.cpp computes the last position's only, which is what generation and speed measurements want."""

    kind = "gguf"

    def __init__(self, path: Path, n_threads: int | None = None, logits_all: bool = True, n_ctx: int | None = None):
        self.path = Path(path)
        check_gguf(self.path)  # a damaged file is a one-line ForgeError before llama.cpp reads it
        arch = gguf_metadata(self.path, "general.architecture")["general.architecture"]
        keys = (f"{arch}.context_length", "tokenizer.ggml.eos_token_id", "tokenizer.chat_template")
        meta = gguf_metadata(self.path, *keys)
        self.context = int(meta.get(f"{arch}.context_length") or 512)
        try:
            self.llm = load_llama(self.path, n_ctx=n_ctx or self.context, n_threads=n_threads, logits_all=logits_all)
        except ForgeError:
            raise
        except Exception as exc:  # noqa: BLE001 - llama.cpp raises ValueError/RuntimeError on files it rejects
            raise ForgeError(f"{self.path} does not load in llama.cpp: {one_line(exc)}") from None
        self.vocab_size = int(self.llm.n_vocab())
        eos = meta.get("tokenizer.ggml.eos_token_id")
        self.eos_id = int(eos) if eos is not None else None
        self.chat_template = meta.get("tokenizer.chat_template")
        self._tokenizer_info: dict[str, Any] | None = None

    def encode(self, text: str, special: bool = False) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)

    def decode(self, ids: Sequence[int]) -> str:
        return self.llm.detokenize(list(ids)).decode("utf-8", errors="replace")

    def _eval_reusing_cache(self, ids: Sequence[int]) -> None:
        """Evaluate `ids`, keeping the KV cache (and the logits) of the prefix they share with what is cached."""
        ids = list(ids)
        cached = np.asarray(self.llm.input_ids[: min(self.llm.n_tokens, len(ids))])
        differs = np.flatnonzero(cached != np.asarray(ids[: len(cached)]))
        self.llm.n_tokens = int(differs[0]) if len(differs) else len(cached)
        self.llm.eval(ids[self.llm.n_tokens :])  # llama-cpp-python drops the cache from n_tokens on first

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        self._eval_reusing_cache(ids)
        return np.array(self.llm.scores[: len(ids)])

    def score_tails(self, requests: Sequence[tuple[Sequence[int], int]], desc: str = "scoring") -> list[float]:
        out = []
        for ids, n in progress(requests, desc=desc, unit="seq"):
            self._eval_reusing_cache(ids)
            out.append(-float(_nll_from_logits(self.llm.scores[: len(ids)], np.asarray(ids), n).sum()))
        return out

    def perplexity(self, ids: Sequence[int], window: int, stride: int) -> Perplexity:
        return perplexity_llama(self.llm, ids, window, stride)

    def document_separator(self) -> int:
        bos = self.llm.token_bos()
        if bos >= 0 and self.llm.tokenize(b"a", add_bos=True)[:1] == [bos]:  # llama.cpp adds BOS only if it should
            return int(bos)
        separator = self.eos_id if self.eos_id is not None else (bos if bos >= 0 else None)
        if separator is None:
            raise ForgeError(f"{self.path} has neither a BOS nor an EOS token: documents cannot be scored from their "
                             "first token")  # fmt: skip
        return int(separator)

    def tokenizer_info(self) -> dict[str, Any]:
        if self._tokenizer_info is None:  # reading 50k token strings from the file takes seconds: once
            keys = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens")
            meta = gguf_metadata(self.path, *keys)
            kind = "/".join(str(meta[k]) for k in keys[:2] if meta.get(k))
            self._tokenizer_info = tokenizer_label(f"gguf:{kind}:{self.path.name}", meta["tokenizer.ggml.tokens"] or [])
        return self._tokenizer_info

    def _start(self, prompt: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(prompt)
        return self._last_logits()

    def _step(self, token: int) -> np.ndarray:
        self.llm.eval([token])
        return self._last_logits()

    def _last_logits(self) -> np.ndarray:
        if self.llm._logits_all:
            return np.array(self.llm.scores[self.llm.n_tokens - 1])
        # without logits_all llama-cpp-python keeps no scores: read the last position's logits from the context
        row = self.llm._ctx.get_logits_ith(-1)
        return np.ctypeslib.as_array(row, shape=(self.vocab_size,)).copy()

    def close(self) -> None:
        self.llm.close()
