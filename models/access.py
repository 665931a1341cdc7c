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

The backends live in their own modules; this one picks the backend for a path:
  models/backend.py       Backend, the shared interface: chat template, log-likelihoods, bits per byte, sampling
  models/hf_backend.py    HFBackend: a transformers directory (fp32, or bitsandbytes int8 / nf4)
  models/gguf_backend.py  GGUFBackend: a GGUF file through llama.cpp
"""

from __future__ import annotations

from pathlib import Path

from forge import ForgeError
from models.backend import Backend, TimedGreedy, sample_token
from models.gguf_backend import GGUFBackend
from models.hf_backend import HFBackend

__all__ = ["Backend", "GGUFBackend", "HFBackend", "TimedGreedy", "is_chat_model", "open_model", "sample_token"]


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
