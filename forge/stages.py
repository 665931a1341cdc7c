"""The stages of a Forge run, in pipeline order, and where each one's code lives.

Each stage is a function `run(cfg: ForgeConfig, force: bool = False, **options) -> dict` in its stage package,
returning the stage's manifest. The CLI verbs and `forge pipeline` both go through this table, so a stage is
wired in one place. A stage whose issue has not landed has no target and raises `NotBuiltYet`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from forge import NotBuiltYet


@dataclass(frozen=True)
class StageSpec:
    name: str
    target: str | None  # "package.module:function", None until built
    issue: int  # the issue that builds it
    summary: str

    @property
    def built(self) -> bool:
        return self.target is not None

    def load(self) -> Callable[..., Any]:
        if self.target is None:
            raise NotBuiltYet(f"forge {self.name}: not implemented yet (issue #{self.issue})")
        module, _, function = self.target.partition(":")
        return getattr(importlib.import_module(module), function)


# name, "module:function" (None until built), the issue that builds it, what it does (the verb's --help).
_TABLE = [
    ("plan", "pretrain.plan:run", 5, "parameters, token budget, memory per GPU, OOM verdict and time"),
    ("data", "pretrain.data.stage:run", 3, "ingest, split 98:1:1, clean, deduplicate, report what was removed"),
    ("tokenizer", "pretrain.tokenizer:run", 4, "train a byte-level BPE on train, check compression, write shards"),
    ("pretrain", "pretrain.train:run", 6, "train the decoder-only model with Accelerate; export the best checkpoint"),
    ("eval", "evaluation.stage:run", 7, "perplexity, domain tasks and red flags for a model"),
    ("sft", "finetune.sft:run", 8, "supervised fine-tuning with TRL on domain Q&A (full, LoRA, QLoRA)"),
    ("quantize", "serve.quantize:run", 9, "GGUF f16/Q8_0/Q4_K_M and bitsandbytes 8/4-bit, with quality drift"),
    ("register", "serve.registry:run", 10, "register the candidate in the MLflow model registry with its evidence"),
    ("promote", "serve.registry:promote_run", 10, "move the production alias if the gate passes"),
    ("rollback", "serve.registry:rollback_run", 10, "move production back to the previous version that passed"),
    ("serve", "serve.stage:run", 11, "serve the production model (llama.cpp on CPU, vLLM on GPU), OpenAI API"),
    ("chat", "serve.stage:chat_run", 11, "the Gradio chat UI in front of a served model"),
    ("bundle", "serve.stage:bundle_run", 11, "a checksummed CPU deploy bundle of the production model"),
]
STAGES: dict[str, StageSpec] = {row[0]: StageSpec(*row) for row in _TABLE}

# The pipeline: (stage, options). eval runs twice, on the pretrained and on the fine-tuned model.
PIPELINE: list[tuple[str, dict[str, Any]]] = [
    ("plan", {}),
    ("data", {}),
    ("tokenizer", {}),
    ("pretrain", {}),
    ("eval", {"target": "pretrain"}),
    ("sft", {}),
    ("eval", {"target": "sft"}),
    ("quantize", {}),
    ("register", {}),
    ("promote", {}),
]

# Directories a run may hold, in the order `forge status` shows them.
RUN_LAYOUT = ["plan", "data", "tokenizer", "pretrain", "eval-pretrain", "sft", "eval-sft", "quantize", "register"]
