"""One interface over the two kinds of artifact `forge eval` measures: a transformers model directory and a GGUF
file run by llama.cpp. Every task and red flag goes through it, so both are measured the same way.

    backend = open_backend(Path("runs/tiny-cpu/pretrain/model"))     # or a .gguf file
    backend.perplexity(ids, window=256, stride=128)                   # evaluation/perplexity.py underneath
    backend.continuation_logprob(context_ids, continuation_ids)       # sum of log p(continuation | context)
    backend.generate(prompt_ids, 64, temperature=0.8, top_k=50, seed=0, stop_ids={3})

Sampling is done here, from the logits, with a numpy generator seeded per call: the same seed gives the same
sample on the same weights, whichever backend runs them. `temperature=0` is greedy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.perplexity import Perplexity
from forge import ForgeError


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


def _log_softmax_rows(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    rows = rows - rows.max(axis=-1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(axis=-1, keepdims=True))


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
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ForgeError(f"chat template of {self.path}: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(messages=messages, add_generation_prompt=True)

    def continuation_logprob(self, context: Sequence[int], continuation: Sequence[int]) -> float:
        """Sum of log p(continuation | context); the context is cut from the left to fit the model's context."""
        continuation = list(continuation)[: self.context - 1]
        context = list(context)[-(self.context - len(continuation)) :] if context else []
        if not context:  # nothing predicts the first id: score from the second on
            context, continuation = continuation[:1], continuation[1:]
        if not continuation:
            return 0.0
        ids = context + continuation
        rows = self.logits(ids)[len(context) - 1 : len(ids) - 1]
        logp = _log_softmax_rows(rows)
        return float(logp[np.arange(len(continuation)), continuation].sum())

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
        max_new_tokens = max(1, min(max_new_tokens, self.context - 1))
        prompt = list(prompt)[-(self.context - max_new_tokens) :] or [self.eos_id or 0]
        rng = np.random.default_rng(seed)
        out: list[int] = []
        logits = self._start(prompt)
        while True:
            token = sample_token(logits, temperature, top_k, rng)
            out.append(token)
            if token in stop_ids or len(out) >= max_new_tokens:
                return out
            if stop_text and stop_text in self.decode(out).lstrip():
                return out
            logits = self._step(token)


# ----------------------------------------------------------------------------------------------------------------
# transformers


class HFBackend(Backend):
    kind = "hf"

    def __init__(self, path: Path, model: Any = None, tokenizer: Any = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = Path(path)
        if model is None:
            if not (self.path / "config.json").is_file():
                raise ForgeError(
                    f"{self.path} is not a model directory (no config.json); pass a directory exported by forge "
                    "pretrain / forge sft, or a .gguf file"
                )
            try:
                model = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32)
            except Exception as exc:  # noqa: BLE001 - any loading failure is the same user error
                raise ForgeError(f"{self.path} does not load as a transformers model: {_one_line(exc)}") from None
        if tokenizer is None:
            try:
                tokenizer = AutoTokenizer.from_pretrained(self.path)
            except Exception as exc:  # noqa: BLE001
                raise ForgeError(f"{self.path} has no loadable tokenizer: {_one_line(exc)}") from None
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.vocab_size = int(model.config.vocab_size)
        from evaluation.perplexity import model_context_length

        self.context = model_context_length(model) or 1024
        self.eos_id = tokenizer.eos_token_id
        self.chat_template = getattr(tokenizer, "chat_template", None)
        self._past: Any = None
        import inspect

        # transformers >= 5.2x names the KV cache `cache`; earlier 5.x releases `past_key_values`
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def encode(self, text: str, special: bool = False) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=not special)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=torch.as_tensor([list(ids)], dtype=torch.long), use_cache=False)
        return out.logits[0].float().numpy()

    def perplexity(self, ids: Sequence[int], window: int, stride: int) -> Perplexity:
        from evaluation.perplexity import perplexity_hf

        return perplexity_hf(self.model, ids, window, stride)

    def _start(self, prompt: list[int]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=torch.as_tensor([prompt], dtype=torch.long), use_cache=True)
        self._past = getattr(out, self._cache_arg)
        return out.logits[0, -1].float().numpy()

    def _step(self, token: int) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.model(
                input_ids=torch.as_tensor([[token]], dtype=torch.long), use_cache=True, **{self._cache_arg: self._past}
            )
        self._past = getattr(out, self._cache_arg)
        return out.logits[0, -1].float().numpy()


# ----------------------------------------------------------------------------------------------------------------
# llama.cpp


class GGUFBackend(Backend):
    kind = "gguf"

    def __init__(self, path: Path, n_threads: int | None = None):
        from evaluation.perplexity import load_gguf
        from serve.gguf_export import check_gguf, gguf_metadata

        self.path = Path(path)
        check_gguf(self.path)  # a damaged file is a one-line ForgeError before llama.cpp reads it
        arch = gguf_metadata(self.path, "general.architecture")["general.architecture"]
        keys = (f"{arch}.context_length", "tokenizer.ggml.eos_token_id", "tokenizer.chat_template")
        meta = gguf_metadata(self.path, *keys)
        self.context = int(meta.get(f"{arch}.context_length") or 512)
        try:
            self.llm = load_gguf(self.path, n_ctx=self.context, n_threads=n_threads, logits_all=True)
        except ForgeError:
            raise
        except Exception as exc:  # noqa: BLE001 - llama.cpp raises ValueError/RuntimeError on files it rejects
            raise ForgeError(f"{self.path} does not load in llama.cpp: {_one_line(exc)}") from None
        self.vocab_size = int(self.llm.n_vocab())
        eos = meta.get("tokenizer.ggml.eos_token_id")
        self.eos_id = int(eos) if eos is not None else None
        self.chat_template = meta.get("tokenizer.chat_template")

    def encode(self, text: str, special: bool = False) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)

    def decode(self, ids: Sequence[int]) -> str:
        return self.llm.detokenize(list(ids)).decode("utf-8", errors="replace")

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(list(ids))
        return np.array(self.llm.scores[: len(ids)])

    def perplexity(self, ids: Sequence[int], window: int, stride: int) -> Perplexity:
        from evaluation.perplexity import perplexity_llama

        return perplexity_llama(self.llm, ids, window, stride)

    def _start(self, prompt: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(prompt)
        return np.array(self.llm.scores[self.llm.n_tokens - 1])

    def _step(self, token: int) -> np.ndarray:
        self.llm.eval([token])
        return np.array(self.llm.scores[self.llm.n_tokens - 1])

    def close(self) -> None:
        self.llm.close()


def open_backend(path: Path, n_threads: int | None = None) -> Backend:
    """An HF model directory or a .gguf file; anything else is a one-line ForgeError."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return GGUFBackend(path, n_threads)
    if path.is_dir():
        return HFBackend(path)
    if not path.exists():
        raise ForgeError(f"eval target {path} does not exist; use pretrain, sft, a model directory or a .gguf file")
    raise ForgeError(f"eval target {path} is neither a model directory nor a .gguf file")


def is_chat_model(backend: Backend) -> bool:
    """A chat model: it has a chat template and is not a raw pretraining export (forge_pretrain.json)."""
    if not backend.chat_template:
        return False
    if backend.kind == "hf":
        return not (backend.path / "forge_pretrain.json").is_file()
    return "pretrain" not in backend.path.parts


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
