"""The interface every model backend implements (models/hf_backend.py, models/gguf_backend.py), and what is built
on it once for both: chat rendering, continuation log-likelihoods, bits per byte, sampling, timed generation.

A backend supplies the primitives (encode, decode, logits, perplexity, document_separator, tokenizer_info, and
`_start` / `_step`: the logits after a prompt, then after each new id); `Backend` turns them into what the tasks use.

Sampling is done here, from the logits, with a numpy generator seeded per call: the same seed gives the same
sample on the same weights, whichever backend runs them. `temperature=0` is greedy.

Scoring many sequences (`score_tails`: the summed log-probability of each sequence's last ids) runs one sequence
per forward pass here; each backend overrides it to evaluate the prompt all choices of a question share once.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from forge import ForgeError
from forge.progress import progress
from models.perplexity import Perplexity, TextScore, _nll_from_logits, document_windows


def one_line(exc: BaseException) -> str:
    """An exception as one line of at most 300 characters, for a ForgeError that wraps a loader's failure."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ").strip()
    return text[:300]


def sample_token(logits: np.ndarray, temperature: float, top_k: int, rng: np.random.Generator) -> int:
    """Greedy when temperature is 0, else a top-k sample at the temperature (float64 softmax)."""
    logits = np.asarray(logits, dtype=np.float64)
    if temperature <= 0:
        return int(logits.argmax())
    keep = np.argpartition(-logits, top_k - 1)[:top_k] if 0 < top_k < len(logits) else np.arange(len(logits))
    scaled = logits[keep] / temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    return int(keep[rng.choice(len(keep), p=probs)])


def tokenizer_label(name: str, tokens: Sequence[str]) -> dict[str, Any]:
    """{"name", "vocab_size", "sha256"} of a tokenizer: the sha256 is of its token strings in id order, so a model
    and its GGUF export, which carry the same vocabulary, get the same label."""
    digest = hashlib.sha256(json.dumps(list(tokens), ensure_ascii=False).encode()).hexdigest()
    return {"name": name, "vocab_size": len(tokens), "sha256": digest}


class Backend:
    """What the tasks need from a model: tokenization, chat rendering, log-likelihoods, sampling, perplexity."""

    kind: str
    path: Path
    context: int
    vocab_size: int
    eos_id: int | None
    chat_template: str | None

    def encode(self, text: str, special: bool = False) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """(len(ids), vocab) logits: row i predicts ids[i + 1]."""
        raise NotImplementedError

    def perplexity(self, ids: Sequence[int], window: int, stride: int) -> Perplexity:
        raise NotImplementedError

    def document_separator(self) -> int:
        """The id a document is read after (models/perplexity.py): BOS when the tokenizer adds one, else EOS."""
        raise NotImplementedError

    def tokenizer_info(self) -> dict[str, Any]:
        raise NotImplementedError

    def _start(self, prompt: list[int]) -> np.ndarray:
        raise NotImplementedError

    def _step(self, token: int) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        pass

    # ---- shared on top of the primitives

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The chat template applied to `messages`, with the assistant generation prompt appended."""
        if not self.chat_template:
            raise ForgeError(f"{self.path} has no chat template")
        if getattr(self, "_template_source", None) != self.chat_template:  # compiled once: a few ms each time
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise ForgeError(f"chat template of {self.path}: {message}")

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            self._template, self._template_source = env.from_string(self.chat_template), self.chat_template
        return self._template.render(messages=messages, add_generation_prompt=True)

    def score_tails(self, requests: Sequence[tuple[Sequence[int], int]], desc: str = "scoring") -> list[float]:
        """For each (ids, n): the summed log-probability of the last n ids given the ids before them. One
        sequence per forward pass here; HFBackend batches them, GGUFBackend reuses the KV cache of shared prefixes."""
        out = []
        for ids, n in progress(requests, desc=desc, unit="seq"):
            out.append(-float(_nll_from_logits(self.logits(ids), np.asarray(ids, dtype=np.int64), n).sum()))
        return out

    def _fit(self, context: Sequence[int], continuation: Sequence[int]) -> tuple[list[int], int]:
        """(context + continuation, scored ids), the context cut from the left to fit the model's context; with no
        context, nothing predicts the continuation's first id, so it becomes the context."""
        continuation = list(continuation)[: self.context - 1]
        context = list(context)[-(self.context - len(continuation)) :] if context else []
        if not context:
            context, continuation = continuation[:1], continuation[1:]
        return context + continuation, len(continuation)

    def continuation_logprobs(
        self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], desc: str = "scoring"
    ) -> list[float]:
        """Sum of log p(continuation | context) for each (context, continuation) pair, scored together."""
        fitted = [self._fit(context, continuation) for context, continuation in pairs]
        scored = [i for i, (_, n) in enumerate(fitted) if n > 0]
        out = [0.0] * len(fitted)
        for i, value in zip(scored, self.score_tails([fitted[i] for i in scored], desc), strict=True):
            out[i] = value
        return out

    def continuation_logprob(self, context: Sequence[int], continuation: Sequence[int]) -> float:
        """Sum of log p(continuation | context); the context is cut from the left to fit the model's context."""
        return self.continuation_logprobs([(context, continuation)])[0]

    def score_text(self, texts: Sequence[str], window: int, stride: int, desc: str = "bits per byte") -> TextScore:
        """Bits per byte and per-token perplexity of the documents `texts`, each tokenized by this model's own
        tokenizer and cut into sliding windows (the rule is in models/perplexity.py's docstring)."""
        if window > self.context:
            raise ForgeError(f"window={window} is longer than the context of {self.path} ({self.context} tokens)")
        kept, windows_of, sizes = [], [], []
        for i, text in enumerate(texts):
            ids = self.encode(text)
            if ids:
                kept.append(i)
                windows_of.append(document_windows([ids], self.document_separator(), window, stride))
                sizes.append(len(text.encode("utf-8")))
        if not kept:
            raise ForgeError("no text to score: every document is empty")
        requests = [r for doc in windows_of for r in doc]
        scores = self.score_tails(requests, desc)
        ends = np.cumsum([len(doc) for doc in windows_of])
        nll = tuple(-float(sum(scores[end - len(doc) : end])) for doc, end in zip(windows_of, ends, strict=True))
        return TextScore(
            nll=sum(nll), tokens=sum(n for _, n in requests), bytes=sum(sizes), documents=len(kept),
            windows=len(requests), window=window, stride=stride, tokenizer=self.tokenizer_info(),
            document_index=tuple(kept), document_nll=nll, document_bytes=tuple(sizes),
        )  # fmt: skip

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        seed: int = 0,
        stop_ids: set[int] | frozenset[int] = frozenset(),
        stop_text: str | None = None,
    ) -> list[int]:
        """New ids after `prompt` (cut from the left to leave room), stopping after a stop id (kept) or once the
        decoded new text contains `stop_text` after some other text."""
        (prompt,), max_new_tokens = self._room([prompt], max_new_tokens)
        rng = np.random.default_rng(seed)
        out: list[int] = []
        logits = self._start(prompt)
        while True:
            token = sample_token(logits, temperature, top_k, rng)
            out.append(token)
            if self._stopped(out, max_new_tokens, stop_ids, stop_text):
                return out
            logits = self._step(token)

    def _room(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> tuple[list[list[int]], int]:
        """(prompts, max_new_tokens) fitted to the context: at least one new id, each prompt cut from the left to
        leave room for them (an empty prompt becomes the EOS id)."""
        max_new_tokens = max(1, min(max_new_tokens, self.context - 1))
        return [list(p)[-(self.context - max_new_tokens) :] or [self.eos_id or 0] for p in prompts], max_new_tokens

    def _stopped(
        self, out: list[int], max_new_tokens: int, stop_ids: set[int] | frozenset[int], stop_text: str | None
    ) -> bool:
        """After a stop id (kept), at max_new_tokens, or once the new text holds `stop_text` after other text."""
        if out[-1] in stop_ids or len(out) >= max_new_tokens:
            return True
        return bool(stop_text and stop_text in self.decode(out).lstrip())

    def greedy_many(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        stop_ids: set[int] | frozenset[int] = frozenset(),
        stop_text: str | None = None,
        desc: str = "generating",
    ) -> list[list[int]]:
        """`generate`'s greedy answer to each prompt. One at a time here; HFBackend decodes many prompts together."""
        return [self.generate(p, max_new_tokens, stop_ids=stop_ids, stop_text=stop_text)
                for p in progress(prompts, desc=desc, unit="prompt")]  # fmt: skip

    def timed_greedy(self, prompt: Sequence[int], new_tokens: int) -> TimedGreedy:
        """Exactly `new_tokens` greedy ids after `prompt` (no stop ids), timing the prompt pass and the decode."""
        start = time.perf_counter()
        logits = self._start(list(prompt))
        first = time.perf_counter()
        out = [int(np.argmax(logits))]
        while len(out) < new_tokens:
            out.append(int(np.argmax(self._step(out[-1]))))
        return TimedGreedy(out, first - start, time.perf_counter() - first)

    def prompt_speed(self, ids: Sequence[int], repeats: int = 2) -> float:
        """Prompt-processing tokens/s: the best of `repeats` passes over `ids`, keeping only the last logits."""
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            self._start(list(ids))
            best = min(best, time.perf_counter() - start)
        return len(ids) / best


@dataclass(frozen=True)
class TimedGreedy:
    ids: list[int]
    prompt_s: float  # the prompt's forward pass, up to the first new id's logits
    decode_s: float  # ids 2..n, one forward step each

    @property
    def decode_tokens_per_s(self) -> float | None:
        return (len(self.ids) - 1) / self.decode_s if self.decode_s > 0 and len(self.ids) > 1 else None
