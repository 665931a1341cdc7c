"""A transformers model directory as a Backend (models/backend.py): fp32 by default, or int8 / nf4 weights
through bitsandbytes at load time.

HF models run in fp32, on CUDA when there is one (fp32 there too: the scores then agree with the CPU's to float
rounding, which bf16's 8-bit mantissa would not).

Scoring many sequences (`score_tails`) takes two padded forwards per batch: the distinct contexts, longest first,
keeping their KV cache; then every continuation over a copy of its context's cache, the only positions that get
logits. Greedy answers to many prompts (`greedy_many`) are decoded together, left-padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forge import ForgeError
from forge.progress import progress
from models.backend import Backend, one_line, tokenizer_label
from models.perplexity import Perplexity, model_context_length, perplexity_hf

QUANTIZATIONS = ("none", "int8", "nf4")  # bitsandbytes at load time (HF directories only)
BATCH_TOKENS = 16_384  # context ids (per continuation row: their cache is copied to each) in one HF forward
GENERATE_ROWS = 64  # prompts decoded together by HFBackend.greedy_many
BATCH_LOGITS = 1 << 26  # logits in one padded forward (256 MiB in fp32): bounds memory for a large vocabulary


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
                raise ForgeError(f"{self.path} has no loadable tokenizer: {one_line(exc)}") from None
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
        raise ForgeError(f"{path} does not load as a transformers model: {one_line(exc)}") from None
