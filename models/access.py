"""One interface over the two kinds of model file Forge uses: a transformers model directory and a GGUF file run
by llama.cpp. Evaluation, quantization and serving measure and run both through it, so both are treated the same.

    model = open_model(Path("runs/tiny-cpu/pretrain/model"))        # or a .gguf file
    model = open_model(model_dir, quantization="nf4")               # bitsandbytes int8 / nf4 (HF directories)
    model.perplexity(ids, window=256, stride=128)                   # models/perplexity.py underneath
    model.continuation_logprob(context_ids, continuation_ids)       # sum of log p(continuation | context)
    model.continuation_logprobs([(context_ids, continuation_ids), ...])  # many at once (batched on HF)
    model.score_text(["doc one", "doc two"], window=256, stride=128)  # TextScore: bits per byte, labelled ppl
    model.generate(prompt_ids, 64, temperature=0.8, top_k=50, seed=0, stop_ids={3})
    model.timed_greedy(prompt_ids, 32)                              # greedy ids + prompt and decode seconds

Sampling is done here, from the logits, with a numpy generator seeded per call: the same seed gives the same
sample on the same weights, whichever backend runs them. `temperature=0` is greedy.

Scoring many sequences (`score_tails`: the summed log-probability of each sequence's last ids) evaluates the
prompt all choices of a question share once, on both paths: on HF two padded forwards per batch (the distinct
contexts, longest first, keeping their KV cache; then every continuation over a copy of its context's cache, the
only positions that get logits), and on the GGUF path one llama.cpp evaluation per sequence that reuses the KV cache
of the ids it shares with the previous one.
HF models run in fp32, on CUDA when there is one (fp32 there too: the scores then agree with the CPU's to float
rounding, which bf16's 8-bit mantissa would not).
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
from models.gguf import check_gguf, gguf_metadata, load_llama
from models.perplexity import (
    Perplexity,
    TextScore,
    _nll_from_logits,
    document_windows,
    model_context_length,
    perplexity_hf,
    perplexity_llama,
)

QUANTIZATIONS = ("none", "int8", "nf4")  # bitsandbytes at load time (HF directories only)
BATCH_TOKENS = 16_384  # context ids (per continuation row: their cache is copied to each) in one HF forward
GENERATE_ROWS = 64  # prompts decoded together by HFBackend.greedy_many
BATCH_LOGITS = 1 << 26  # logits in one padded forward (256 MiB in fp32): bounds memory for a large vocabulary


def _one_line(exc: BaseException) -> str:
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


# ----------------------------------------------------------------------------------------------------------------
# transformers


class HFBackend(Backend):
    """A transformers causal LM with its tokenizer. fp32 by default; `quantization` int8 or nf4 loads the weights
    through bitsandbytes (on the GPU when there is one, else the CPU: bitsandbytes runs on AVX2 CPUs too)."""

    kind = "hf"

    def __init__(
        self, path: Path, model: Any = None, tokenizer: Any = None, quantization: str = "none",
        device: str | None = None,
    ):  # fmt: skip
        import inspect

        self.path = Path(path)
        if model is None:
            if not (self.path / "config.json").is_file():
                raise ForgeError(
                    f"{self.path} is not a model directory (no config.json); pass a directory exported by forge "
                    "pretrain / forge sft, or a .gguf file"
                )
            model = _load_hf(self.path, quantization)
        if tokenizer is None:
            from transformers import AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(self.path)
            except Exception as exc:  # noqa: BLE001
                raise ForgeError(f"{self.path} has no loadable tokenizer: {_one_line(exc)}") from None
        if quantization == "none":  # bitsandbytes placed a quantized model already
            model = model.to(device or default_device())
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.tokenizer = tokenizer
        self.vocab_size = int(model.config.vocab_size)
        self.context = model_context_length(model) or 1024
        self.eos_id = tokenizer.eos_token_id
        self.chat_template = getattr(tokenizer, "chat_template", None)
        self._past: Any = None
        # transformers >= 5.2x names the KV cache `cache`; earlier 5.x releases `past_key_values`
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def encode(self, text: str, special: bool = False) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=not special)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def memory_footprint(self) -> int:
        return int(self.model.get_memory_footprint())

    def _ids(self, ids: Sequence[int]) -> Any:
        import torch

        return torch.as_tensor([list(ids)], dtype=torch.long, device=self.device)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=self._ids(ids), use_cache=False)
        return out.logits[0].float().cpu().numpy()

    def perplexity(self, ids: Sequence[int], window: int, stride: int) -> Perplexity:
        return perplexity_hf(self.model, ids, window, stride)

    def document_separator(self) -> int:
        bos = self.tokenizer.bos_token_id
        with_special = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        if bos is not None and with_special[:1] == [bos]:
            return int(bos)
        separator = self.eos_id if self.eos_id is not None else bos
        if separator is None:
            raise ForgeError(f"the tokenizer of {self.path} has neither a BOS nor an EOS token: documents cannot be "
                             "scored from their first token; set tokenizer_config.json's eos_token")  # fmt: skip
        return int(separator)

    def tokenizer_info(self) -> dict[str, Any]:
        tokens = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        return tokenizer_label(f"{type(self.tokenizer).__name__}:{self.path.name}", tokens)

    def score_tails(self, requests: Sequence[tuple[Sequence[int], int]], desc: str = "scoring") -> list[float]:
        """Batched, and each context run once for all the continuations that share it (a question's choices): the
        contexts, right-padded, in one forward that keeps their KV cache; then every continuation in a second forward
        over its context's cache. Only continuations get logits. Padding is masked out and never scored."""
        by_context: dict[tuple[int, ...], list[int]] = {}
        for i, (ids, n) in enumerate(requests):
            by_context.setdefault(tuple(ids[: len(ids) - n]), []).append(i)
        out = [0.0] * len(requests)
        with progress(total=len(requests), desc=desc, unit="seq") as bar:
            for batch in self._batches(list(by_context.items()), requests):
                indices = [i for _, members in batch for i in members]
                for i, value in zip(indices, self._score_shared(requests, batch), strict=True):
                    out[i] = value
                bar.update(len(indices))
        return out

    def _batches(
        self, groups: list[tuple[tuple[int, ...], list[int]]], requests: Sequence[tuple[Sequence[int], int]]
    ) -> list[list[tuple[tuple[int, ...], list[int]]]]:
        """(context, request indices) groups in batches of at most BATCH_TOKENS ids per forward (a context counted
        once per continuation: each gets a copy of its cache) and BATCH_LOGITS logits. The continuations' forward
        (the one with logits) pads to its longest, and answers range from one id to a paragraph: a group's
        continuations are split, longest first, where running its context again costs fewer ids than the padding it
        saves (the question-free prompt every item shares has hundreds), and batches take the longest first.
        Contexts of one id (nothing before their last id to cache) are batched apart."""

        def tail(i: int) -> int:
            return requests[i][1]

        def fits(rows: int, context: int, longest_tail: int) -> bool:
            return (
                rows * max(context, longest_tail) <= BATCH_TOKENS
                and rows * longest_tail * self.vocab_size <= BATCH_LOGITS
            )

        units: list[tuple[tuple[int, ...], list[int]]] = []
        for context, members in groups:
            members = sorted(members, key=tail, reverse=True)
            chunk = [members[0]]
            for k, i in enumerate(members[1:], start=1):
                padding_saved = (tail(chunk[0]) - tail(i)) * (len(members) - k)
                if not fits(len(chunk) + 1, len(context), tail(chunk[0])) or len(context) < padding_saved:
                    units.append((context, chunk))
                    chunk = []
                chunk.append(i)
            units.append((context, chunk))
        batches: list[list[tuple[tuple[int, ...], list[int]]]] = []
        for one_id in (False, True):
            kind = sorted((u for u in units if (len(u[0]) == 1) == one_id), key=lambda u: (tail(u[1][0]), len(u[0])))
            batch: list[tuple[tuple[int, ...], list[int]]] = []
            rows = longest = 0
            for context, chunk in reversed(kind):  # longest continuation first
                if batch and not fits(rows + len(chunk), max(longest, len(context)), tail(batch[0][1][0])):
                    batches.append(batch)
                    batch, rows, longest = [], 0, 0
                batch.append((context, chunk))
                rows, longest = rows + len(chunk), max(longest, len(context))
            if batch:
                batches.append(batch)
        return batches

    def _score_shared(
        self, requests: Sequence[tuple[Sequence[int], int]], batch: list[tuple[tuple[int, ...], list[int]]]
    ) -> list[float]:
        """The continuations of `batch` ((context, request indices) groups), in group order: the contexts but their
        last id in one forward (cached), then each continuation after its context's last id over that cache."""
        import torch

        def padded(seqs: Sequence[Sequence[int]]) -> tuple[Any, Any]:
            ids = torch.zeros((len(seqs), max(1, max(len(q) for q in seqs))), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, seq in enumerate(seqs):
                ids[row, : len(seq)], mask[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long), 1
            return ids.to(self.device), mask.to(self.device)

        group_of_row = [g for g, (_, members) in enumerate(batch) for _ in members]
        tails = [list(requests[i][0][len(requests[i][0]) - requests[i][1] :]) for _, m in batch for i in m]
        # each row reads its context's last id, then its continuation but the last id: the logits predict the tail
        inputs, tail_mask = padded([[batch[g][0][-1], *t[:-1]] for g, t in zip(group_of_row, tails, strict=True)])
        targets, _ = padded(tails)
        where = torch.as_tensor(group_of_row, device=self.device)
        context_lengths = torch.as_tensor([len(c) - 1 for c, _ in batch], device=self.device)[where]
        positions = context_lengths[:, None] + torch.arange(inputs.shape[1], device=self.device)[None, :]
        kwargs: dict[str, Any] = {}
        with torch.inference_mode():
            if int(context_lengths.max()) > 0:  # contexts of one id have nothing before their last id to cache
                context_ids, context_mask = padded([c[:-1] for c, _ in batch])
                cached = self.model(input_ids=context_ids, attention_mask=context_mask, use_cache=True,
                                    logits_to_keep=1)  # fmt: skip
                cache = getattr(cached, self._cache_arg)
                cache.batch_select_indices(where)  # one copy of its context's cache per continuation
                kwargs = {self._cache_arg: cache}
                tail_mask = torch.cat([context_mask[where], tail_mask], dim=1)
            logits = self.model(input_ids=inputs, attention_mask=tail_mask, position_ids=positions, use_cache=True,
                                **kwargs).logits.float()  # fmt: skip
            logp = logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, dim=-1)
        logp = logp.cpu().double().numpy()
        return [float(logp[row, : len(t)].sum()) for row, t in enumerate(tails)]

    def greedy_many(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        stop_ids: set[int] | frozenset[int] = frozenset(),
        stop_text: str | None = None,
        desc: str = "generating",
    ) -> list[list[int]]:
        """Batched greedy decoding, the same answers as `generate` one prompt at a time: prompts of similar length
        left-padded together (positions counted from each prompt's first id), one forward per step for the batch,
        until every row has stopped (a stop id, max_new_tokens, or `stop_text` in its new text)."""
        import torch

        fitted, max_new_tokens = self._room(prompts, max_new_tokens)
        order = sorted(range(len(fitted)), key=lambda i: len(fitted[i]), reverse=True)
        out: list[list[int]] = [[] for _ in fitted]
        with progress(total=len(fitted), desc=desc, unit="prompt") as bar:
            start = 0
            while start < len(order):
                rows = max(1, min(GENERATE_ROWS, BATCH_TOKENS // (len(fitted[order[start]]) + max_new_tokens)))
                batch = order[start : start + rows]
                start += len(batch)
                width = len(fitted[batch[0]])
                ids = torch.zeros((len(batch), width), dtype=torch.long)
                mask = torch.zeros_like(ids)
                for row, i in enumerate(batch):  # left-padded: every row's next id is in the last column
                    ids[row, width - len(fitted[i]) :] = torch.as_tensor(fitted[i])
                    mask[row, width - len(fitted[i]) :] = 1
                ids, mask = ids.to(self.device), mask.to(self.device)
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                done = [False] * len(batch)
                kwargs: dict[str, Any] = {}
                with torch.inference_mode():
                    for _ in range(max_new_tokens):
                        result = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                                            logits_to_keep=1, **kwargs)  # fmt: skip
                        kwargs = {self._cache_arg: getattr(result, self._cache_arg)}
                        ids = result.logits[:, -1].float().argmax(-1, keepdim=True)
                        for row, i in enumerate(batch):
                            if not done[row]:
                                out[i].append(int(ids[row, 0]))
                                done[row] = self._stopped(out[i], max_new_tokens, stop_ids, stop_text)
                        if all(done):
                            break
                        mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
                        positions = positions[:, -1:] + 1
                bar.update(len(batch))
        return out

    def _start(self, prompt: list[int]) -> np.ndarray:
        import torch

        with torch.inference_mode():  # the last position's logits only, as llama.cpp computes them
            out = self.model(input_ids=self._ids(prompt), use_cache=True, logits_to_keep=1)
        self._past = getattr(out, self._cache_arg)
        return out.logits[0, -1].float().cpu().numpy()

    def _step(self, token: int) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=self._ids([token]), use_cache=True, **{self._cache_arg: self._past})
        self._past = getattr(out, self._cache_arg)
        return out.logits[0, -1].float().cpu().numpy()


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_hf(path: Path, quantization: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if quantization not in QUANTIZATIONS:
        raise ForgeError(f"quantization={quantization!r}: use one of {', '.join(QUANTIZATIONS)}")
    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if quantization == "int8":
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    elif quantization == "nf4":  # QLoRA's recipe: NF4 with double quantization
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32,
        )  # fmt: skip
    if quantization != "none":
        kwargs["device_map"] = {"": 0} if torch.cuda.is_available() else "cpu"
    try:
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any loading failure is the same user error
        raise ForgeError(f"{path} does not load as a transformers model: {_one_line(exc)}") from None


# ----------------------------------------------------------------------------------------------------------------
# llama.cpp


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
            raise ForgeError(f"{self.path} does not load in llama.cpp: {_one_line(exc)}") from None
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


def open_model(path: Path, n_threads: int | None = None, quantization: str = "none") -> Backend:
    """An HF model directory or a .gguf file; anything else is a one-line ForgeError."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        if quantization != "none":
            raise ForgeError(f"{path}: a GGUF file is quantized already; bitsandbytes {quantization} is for HF dirs")
        return GGUFBackend(path, n_threads)
    if path.is_dir():
        return HFBackend(path, quantization=quantization)
    if not path.exists():
        raise ForgeError(f"model {path} does not exist; use pretrain, sft, a model directory or a .gguf file")
    raise ForgeError(f"model {path} is neither a model directory nor a .gguf file")


def is_chat_model(backend: Backend) -> bool:
    """A chat model: it has a chat template and is not a raw pretraining export (forge_pretrain.json)."""
    if not backend.chat_template:
        return False
    if backend.kind == "hf":
        return not (backend.path / "forge_pretrain.json").is_file()
    return "pretrain" not in backend.path.parts
