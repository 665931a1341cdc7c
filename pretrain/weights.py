"""The weights of the pretrain stage: where a run starts, the best it has reached, and the model it leaves.

    initial_model(cfg, vocab, ids)   a random model of cfg.model, or the base of model.init_from
    save_best(best_dir, model, best) checkpoints/best/: the weights with the lowest val loss so far
    export(best_dir, out, ...)       model/: those weights as a transformers model directory with the tokenizer

The best weights are written as the processes hold them (each its shards under FSDP, pretrain/checkpoint.py); the
export, on the main process alone, reads them whole from those files: no process group.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from forge import ForgeError
from forge.config import ForgeConfig
from forge.io import atomic_path, atomic_write_json
from models import TOKENIZER_FILES
from pretrain import checkpoint as ckpt

log = logging.getLogger("forge.pretrain")


def initial_model(cfg: ForgeConfig, vocab: int, ids: dict[str, int]) -> torch.nn.Module:
    """A random model of `cfg.model`, or the base model of model.init_from with its trained weights."""
    from pretrain.model import build_model

    if cfg.model.init_from is None:
        return build_model(cfg.model, vocab, **{f"{k}_id": v for k, v in ids.items()})
    from models.base import open_base

    model = open_base(cfg.model.init_from).load_model()
    if vocab > model.config.vocab_size:
        raise ForgeError(
            f"model.init_from={cfg.model.init_from}: the token shards use {vocab} ids but the model has "
            f"{model.config.vocab_size} embedding rows;"
            " re-run forge tokenizer (it writes the shards with the base's tokenizer)"
        )
    return model


def save_best(best_dir: Path, model: torch.nn.Module, best: dict[str, Any]) -> None:
    """The weights with the lowest val loss so far. Every process calls it and writes what it holds (nothing is
    gathered)."""
    ckpt.save_weights(best_dir, model, best)


def export(best_dir: Path, out: Path, cfg: ForgeConfig, vocab: int, ids: dict[str, int], tok_dir: Path) -> None:
    """Write the best weights as a transformers model directory, with the tokenizer and a generation config."""
    from transformers import GenerationConfig

    from models.shape import context_length

    if not (best_dir / "state.json").is_file():
        raise ForgeError(f"no best checkpoint in {best_dir}: the run evaluated nothing to export")
    model = initial_model(cfg, vocab, ids)
    model.load_state_dict(ckpt.read_weights(best_dir, model))  # a plain model, on the main process alone
    model.config.use_cache = True
    model.generation_config = GenerationConfig(
        bos_token_id=ids.get("bos"), eos_token_id=ids.get("eos"), pad_token_id=ids.get("pad"),
        max_length=context_length(model.config),  # a base's whole context
    )  # fmt: skip
    with atomic_path(out) as tmp:
        model.save_pretrained(tmp)
        for name in TOKENIZER_FILES:
            if (tok_dir / name).is_file():
                shutil.copy2(tok_dir / name, tmp / name)
        best = json.loads((best_dir / "state.json").read_text(encoding="utf-8"))
        atomic_write_json(tmp / "forge_pretrain.json", {"best_step": best["step"], "val_loss": best["val_loss"],
                                                        "run": cfg.run_name})  # fmt: skip
    log.info("pretrain: exported the best weights (step %d, val loss %.4f) to %s", best["step"], best["val_loss"], out)
