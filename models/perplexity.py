"""Sliding-window, token-weighted perplexity over token ids, for a transformers model and for a GGUF file.

    ids = load_split(run / "tokenizer" / "shards", "test")[0][:50_000]
    result = perplexity_hf(model, ids, window=256, stride=128)      # a loaded transformers causal LM
    result = perplexity_llama(llm, ids, 256, 128)                   # a loaded llama_cpp.Llama (GGUFBackend.perplexity)
    result.ppl, result.nll, result.tokens

Both share `windows()`: a window of `window` ids moves by `stride`; every id after the first is scored exactly
once, by the window that first contains it, with as much preceding context as that window holds (each window
after the first scores only its last `stride` ids, so those ids see at least `window - stride` ids of context).
Perplexity is exp(sum of negative log-likelihoods / number of scored ids): token-weighted, not a mean of
per-window perplexities. The same ids, window and stride give comparable numbers across backends and quantized
variants. Log-softmax runs in float64 for llama.cpp's logits, float32 for torch's.

Bits per byte (`TextScore`, what evaluation compares across models, whatever their tokenizers): each document is
tokenized by the model's own tokenizer and scored on its own, never joined to the next one. The document's ids
follow ONE separator id that is read, never scored: the id the tokenizer puts before a text by default (BOS where
`add_bos_token` is set, as for Llama), else its EOS (what Forge's pretraining, GPT-2 and SmolLM2 put between
documents). So every id of the document is scored, the first one included, and each document is cut into the same
`windows()` as above (position 0, the separator, is never a target). bits_per_byte is the documents' summed
negative log-likelihood in bits over the UTF-8 bytes of their text as stored (not of the decoded ids); the
per-token perplexity beside it is exp(nats / scored ids) and is only comparable between models that share a
tokenizer, so it carries the tokenizer's name, vocabulary size and sha256.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from forge import ForgeError


@dataclass(frozen=True)
class Perplexity:
    ppl: float  # exp(nll)
    nll: float  # mean negative log-likelihood per scored token, in nats
    tokens: int  # scored tokens: len(ids) - 1
    windows: int
    window: int
    stride: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "ppl": self.ppl,
            "nll": self.nll,
            "tokens": self.tokens,
            "windows": self.windows,
            "window": self.window,
            "stride": self.stride,
        }


@dataclass(frozen=True)
class TextScore:
    """Negative log-likelihood of a set of documents, per byte of their text and per token of one tokenizer."""

    nll: float  # summed negative log-likelihood of every scored id, in nats
    tokens: int  # scored ids: every id of every non-empty document
    bytes: int  # UTF-8 bytes of the scored documents' text
    documents: int
    windows: int
    window: int
    stride: int
    tokenizer: dict[str, Any]  # {"name", "vocab_size", "sha256"}: what the per-token perplexity is measured in
    # Per scored document (the gate's paired comparisons): its index in the texts given, its nats and its bytes.
    document_index: tuple[int, ...] = ()
    document_nll: tuple[float, ...] = ()
    document_bytes: tuple[int, ...] = ()

    @property
    def bits_per_byte(self) -> float:
        return self.nll / math.log(2) / self.bytes

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.tokens)

    def as_dict(self) -> dict[str, Any]:
        return {
            "bits_per_byte": self.bits_per_byte, "ppl": self.ppl, "nll_nats": self.nll, "tokens": self.tokens,
            "bytes": self.bytes, "documents": self.documents, "windows": self.windows, "window": self.window,
            "stride": self.stride, "tokenizer": self.tokenizer,
        }  # fmt: skip


def document_windows(
    documents: Sequence[Sequence[int]], separator: int, window: int, stride: int
) -> list[tuple[list[int], int]]:
    """(ids the model reads, how many of its last ids are scored) for every window of every document, each
    document preceded by `separator` (read, never scored): see the module docstring."""
    out = []
    for doc in documents:
        ids = [separator, *doc]
        out += [(ids[begin:end], end - first) for begin, end, first in windows(len(ids), window, stride)]
    return out


def windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first_target) per window: the model reads ids[begin:end] and ids[first_target:end] are scored.

    Every index 1..n_tokens-1 is a target exactly once. Position 0 is never a target (nothing predicts it).
    """
    if window < 2:
        raise ForgeError(f"perplexity window={window}: needs at least 2 tokens")
    if not 1 <= stride <= window:
        raise ForgeError(f"perplexity stride={stride}: must be between 1 and the window ({window})")
    out = []
    scored_until = 1  # the next id still to score
    begin = 0
    while scored_until < n_tokens:
        end = min(begin + window, n_tokens)
        out.append((begin, end, scored_until))
        scored_until = end
        begin += stride
    return out


def sliding_perplexity(
    nll_fn: Callable[[np.ndarray, int], np.ndarray], ids: Sequence[int], window: int, stride: int
) -> Perplexity:
    """Generic driver: `nll_fn(window_ids, n_targets)` returns the NLL of the last `n_targets` ids of the window."""
    if len(ids) < 2:
        raise ForgeError(f"perplexity needs at least 2 token ids, got {len(ids)}")
    tokens = np.asarray(ids, dtype=np.int64)
    total = 0.0
    count = 0
    spans = windows(len(ids), window, stride)
    for begin, end, first in spans:
        n_targets = end - first
        nll = np.asarray(nll_fn(tokens[begin:end], n_targets), dtype=np.float64)
        if nll.shape != (n_targets,):
            raise ForgeError(f"internal: nll_fn returned shape {nll.shape}, expected ({n_targets},)")
        total += float(nll.sum())
        count += n_targets
    mean = total / count
    return Perplexity(ppl=math.exp(mean), nll=mean, tokens=count, windows=len(spans), window=window, stride=stride)


def _nll_from_logits(logits: np.ndarray, ids: np.ndarray, n_targets: int) -> np.ndarray:
    """NLL of ids[-n_targets:] given logits[i] predicting ids[i + 1] (numpy, float64)."""
    rows = np.asarray(logits[len(ids) - 1 - n_targets : len(ids) - 1], dtype=np.float64)
    rows = rows - rows.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(rows).sum(axis=-1))
    targets = ids[len(ids) - n_targets :]
    return log_z - rows[np.arange(n_targets), targets]


# ----------------------------------------------------------------------------------------------------------------
# transformers


def model_context_length(model: Any) -> int | None:
    config = model.config
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if value:
            return int(value)
    return None


def perplexity_hf(model: Any, token_ids: Sequence[int], window: int, stride: int) -> Perplexity:
    """Perplexity of a transformers causal LM (any dtype or bitsandbytes quantization) on `token_ids`."""
    import torch

    context = model_context_length(model)
    if context is not None and window > context:
        raise ForgeError(f"perplexity window={window} is longer than the model's context of {context} tokens")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()

    def nll_fn(chunk: np.ndarray, n_targets: int) -> np.ndarray:
        inputs = torch.as_tensor(chunk, dtype=torch.long, device=device)[None]
        with torch.inference_mode():
            logits = model(input_ids=inputs, use_cache=False).logits[0, -n_targets - 1 : -1].float()
            logp = torch.log_softmax(logits, dim=-1)
            targets = inputs[0, -n_targets:]
            return (-logp[torch.arange(n_targets, device=device), targets]).cpu().numpy()

    try:
        return sliding_perplexity(nll_fn, token_ids, window, stride)
    finally:
        model.train(was_training)


# ----------------------------------------------------------------------------------------------------------------
# llama.cpp


def perplexity_llama(llm: Any, token_ids: Sequence[int], window: int, stride: int) -> Perplexity:
    """Perplexity through an already loaded llama_cpp.Llama (created with logits_all=True, n_ctx >= window)."""
    if llm.n_ctx() < window:
        raise ForgeError(f"perplexity window={window} is longer than the llama.cpp context n_ctx={llm.n_ctx()}")
    meta = llm.metadata
    context = int(meta.get(f"{meta.get('general.architecture')}.context_length", 0))
    if context and window > context:
        raise ForgeError(f"perplexity window={window} is longer than the model's context of {context} tokens")

    def nll_fn(chunk: np.ndarray, n_targets: int) -> np.ndarray:
        llm.reset()
        llm.eval(chunk.tolist())
        return _nll_from_logits(llm.scores[: len(chunk)], chunk, n_targets)

    return sliding_perplexity(nll_fn, token_ids, window, stride)
