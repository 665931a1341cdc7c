"""An existing model to start from (`model.init_from`): a local Hugging Face directory or a GGUF file.

    base = open_base("/models/SmolLM2-135M-Instruct.Q4_1.gguf")     # or a directory with config.json
    base.config()                       # the transformers config (a decoder-only causal LM transformers ships)
    base.model_shape(context_length)    # a ModelShape read off the model (models/shape.py): what plan and pretrain use
    base.tokenizer()                    # the base's own tokenizer (a transformers fast tokenizer)
    base.load_model()                   # the weights, fp32 (a GGUF is dequantized by transformers' gguf loader)
    base.identity()                     # path, kind, sha256 and origin, for manifests and registry tags

Any family transformers runs as a decoder-only causal LM with its own code is accepted (Qwen, Gemma, Phi, Mistral,
OLMo...); one whose code comes with the model (trust_remote_code) or that transformers does not know is refused in
one line naming the family and what is supported. Nothing is downloaded: every load is local_files_only with
HF_HUB_OFFLINE set. A directory must hold model.safetensors (or its shards): pickled checkpoints are never loaded.

A GGUF's tokenizer, as transformers rebuilds it, keeps the vocabulary and merges but not llama.cpp's pre-tokenizer
(every BPE vocabulary gets the plain GPT-2 split), so the pre-token boundaries of a model that splits digits one
by one (SmolLM's "smollm", StarCoder) are lost: its text may tokenize otherwise than it did in training and
than llama.cpp does. The GGUF's `tokenizer.ggml.pre` is read and the matching pre-tokenizer of
models/pretokenize.py is put back; a pre-tokenizer type not in that table is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.hashing import sha256_tree
from models.shape import ModelShape, check_causal_lm, read_shape, supported

KINDS = "a local Hugging Face model directory (config.json + model.safetensors + tokenizer files) or a .gguf file"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


@dataclass(frozen=True)
class Base:
    path: Path  # the directory, or the GGUF file
    field: str = "model.init_from"

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix == ".gguf"

    def _where(self) -> dict[str, Any]:
        """from_pretrained's arguments: the directory, and the file name for a GGUF."""
        offline = {"local_files_only": True}
        if self.is_gguf:
            return {"pretrained_model_name_or_path": str(self.path.parent), "gguf_file": self.path.name, **offline}
        return {"pretrained_model_name_or_path": str(self.path), **offline}

    def _fail(self, what: str, exc: Exception | None = None) -> ForgeError:
        detail = f" ({type(exc).__name__}: {' '.join(str(exc).split())})" if exc else ""  # one line
        return ForgeError(f"{self.field}={self.path}: {what}{detail}; supported: {KINDS}")

    @cached_property
    def _config(self) -> Any:
        import json

        from transformers import AutoConfig

        where = f"{self.field}={self.path}"
        if not self.is_gguf:  # read first: transformers would ask for trust_remote_code, or not know the type
            try:
                raw = json.loads((self.path / "config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise self._fail("cannot read config.json", exc) from exc
            check_causal_lm(raw if isinstance(raw, dict) else {}, where)
        try:
            config = AutoConfig.from_pretrained(**self._where())
        except (OSError, ValueError, KeyError) as exc:  # a GGUF architecture transformers does not read, too
            raise self._fail(f"cannot read the model's config; families: {supported()}", exc) from exc
        check_causal_lm(config.to_dict(), where)
        return config

    def config(self) -> Any:
        return self._config

    def model_shape(self, context_length: int | None = None) -> ModelShape:
        """The base's shape, read off a meta-device instance; `context_length` (the training window) at most the
        base's own."""
        try:
            shape = read_shape(self.config())
        except (ValueError, TypeError, AttributeError) as exc:  # transformers cannot build it from its config
            raise self._fail("transformers cannot build the model from its config", exc) from exc
        if context_length is not None and context_length < shape.context_length:
            shape = shape.model_copy(update={"context_length": context_length})
        return shape

    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(**self._where())
        except (OSError, ValueError, KeyError) as exc:
            raise self._fail("cannot load its tokenizer", exc) from exc
        if not getattr(tokenizer, "is_fast", False):
            raise self._fail("its tokenizer has no tokenizer.json (a fast tokenizer is needed)")
        if self.is_gguf:
            from models.gguf import gguf_metadata
            from models.pretokenize import set_pre_tokenizer

            pre = gguf_metadata(self.path, "tokenizer.ggml.pre").get("tokenizer.ggml.pre") or "default"
            set_pre_tokenizer(tokenizer, pre, f"{self.field}={self.path}")
        if tokenizer.eos_token is None:
            raise self._fail("its tokenizer has no EOS token (documents and assistant turns end with it)")
        return tokenizer

    def load_model(self) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        self.config()
        kwargs: dict[str, Any] = {**self._where(), "dtype": torch.float32}
        if not self.is_gguf:
            kwargs["use_safetensors"] = True
        try:
            model: Any = AutoModelForCausalLM.from_pretrained(**kwargs)
        except (OSError, ValueError, KeyError) as exc:
            raise self._fail("cannot load its weights", exc) from exc
        model.config.quantization_config = None  # dequantized: the trained model is a plain fp32 model
        if hasattr(model, "hf_quantizer"):
            model.hf_quantizer = None
        return model

    def identity(self) -> dict[str, Any]:
        """What the base is: path, kind, sha256 (of the file, or of the directory's files: lineage.sha256_tree)."""
        config = self.config()
        if self.is_gguf:  # transformers would name the GGUF's directory
            origin = self.path.name
        else:
            origin = getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", None) or self.path.name
        return {"path": str(self.path), "kind": "gguf" if self.is_gguf else "hf", "sha256": sha256_tree(self.path),
                "origin": str(origin), "architecture": config.model_type}  # fmt: skip


def open_base(path: str | Path, field: str = "model.init_from") -> Base:
    """The base at `path`, checked to exist and to be a kind Forge reads (nothing is loaded yet)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a missing local file must never turn into a download
    base = Base(Path(path).expanduser(), field)
    p = base.path
    if not p.exists():
        raise base._fail("no such file or directory")
    if p.is_file() and p.suffix != ".gguf":
        raise base._fail("a file that is not a .gguf")
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise base._fail("the directory has no config.json")
        if not any((p / name).is_file() for name in WEIGHT_FILES):
            raise base._fail("the directory has no model.safetensors (pickled .bin checkpoints are never loaded)")
    return base
