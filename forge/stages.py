"""The map of Forge: every stage of a run, in pipeline order, where its code lives, what it reads and writes.

Each stage is a function `run(cfg: ForgeConfig, force: bool = False, **options) -> dict` (its manifest) named by
`target` as "package.module:function". The CLI verbs, `forge pipeline`, `forge status` and the report card all read
this table, so a stage is wired in one place, and `forge/` never imports a stage package: the function is looked up
when the verb runs (which also keeps `forge --help` fast).

    dirs     the directories the stage writes under runs/<run>/ (eval: one per model it evaluates)
    settings the config it reads: whole sections ("data") or single fields ("sft.system_prompt"). With the code it
             runs (forge.code) and its inputs' hashes, they are its skip key: change any and the stage re-runs,
             change another section and it is skipped. tests/test_stage_reads.py checks the list against the code.
    reads    the stages whose outputs it may read. Before it writes anything, a stage names those this run needs
             (its settings and options decide: eval --target pretrain needs no sft, qa from your own JSONL no data)
             to forge.lineage.require_reads, the one place that checks they completed; an input under the
             directory of a stage it does not declare is refused when its forge.lineage.Stage is built.
    files    named outputs other stages and the report card read, relative to the run directory
    calls    other functions of the stage's package a verb needs (promote's decision table, registry history)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StageSpec:
    name: str
    target: str
    summary: str
    dirs: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    calls: dict[str, str] = field(default_factory=dict)

    @property
    def code(self) -> str:
        """The source file of the stage's function, relative to the repository: where a newcomer starts reading."""
        return self.module.replace(".", "/") + ".py"

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    def load(self) -> Callable[..., Any]:
        return load(self.target)

    def call(self, name: str) -> Callable[..., Any]:
        return load(self.calls[name])


def load(target: str) -> Callable[..., Any]:
    """The function named by "package.module:function"."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


STAGES: dict[str, StageSpec] = {
    spec.name: spec
    for spec in [
        StageSpec("plan", "pretrain.plan:run", "parameters, token budget, memory per GPU, OOM verdict and time",
                  dirs=("plan",), settings=("plan", "model", "train", "tokenizer"),
                  reads=("tokenizer", "pretrain"),  # when they have run: the corpus size and the measured MFU
                  files={"plan": "plan/plan.json"}),
        StageSpec("evidence", "evaluation.evidence:check_run",
                  "check that eval will give every gate rule its min_items, and what eval and SFT will cost",
                  calls={"render": "evaluation.evidence:render"}),
        StageSpec("data", "pretrain.data.stage:run",
                  "ingest, split into train/val/test, clean, deduplicate, report what was removed",
                  dirs=("data",), settings=("data",),
                  files={"plot": "data/removed_by_filter.png", "report": "data/report.json"}),
        StageSpec("qa", "pretrain.qa.stage:run",
                  "domain Q&A pairs from the corpus (or your JSONL), held out from val/test",
                  # the data settings decide the documents, their splits and the dedup the pairs get
                  dirs=("qa",), settings=("qa", "data"), reads=("data",), files={"report": "qa/report.json"}),
        StageSpec("tokenizer", "pretrain.tokenizer:run",
                  "train a byte-level BPE on train, check compression, write token shards",
                  dirs=("tokenizer",), settings=("tokenizer", "model.init_from"), reads=("data",)),
        StageSpec("pretrain", "pretrain.train:run",
                  "train the decoder-only model with Accelerate; export the best checkpoint",
                  dirs=("pretrain",), settings=("model", "train", "plan.peak_tflops"), reads=("tokenizer",),
                  files={"plot": "pretrain/loss_curves.png"}),
        StageSpec("eval", "evaluation.stage:run", "bits per byte, domain tasks and red flags for a model",
                  dirs=("eval-pretrain", "eval-sft"), settings=("eval", "sft.system_prompt", "model.init_from"),
                  reads=("data", "qa", "pretrain", "sft", "quantize"),  # quantize: a GGUF --target
                  files={"pretrain": "eval-pretrain/eval.json", "sft": "eval-sft/eval.json",
                         "plot": "eval-pretrain/plots/val_ppl.png"}),
        StageSpec("sft", "finetune.sft:run", "supervised fine-tuning with TRL on domain Q&A (full, LoRA, QLoRA)",
                  dirs=("sft",), settings=("sft",), reads=("pretrain", "qa")),
        StageSpec("quantize", "serve.quantize:run",
                  "GGUF f16/Q8_0/Q4_K_M and bitsandbytes 8/4-bit, with quality drift",
                  dirs=("quantize",), settings=("quantize",), reads=("pretrain", "sft", "tokenizer"),
                  files={"report": "quantize/quantize.json"}),
        StageSpec("register", "registry.register:run",
                  "register the candidate in the MLflow model registry with its evidence",
                  dirs=("register",), settings=("registry",),
                  reads=("pretrain", "sft", "eval", "quantize", "data", "tokenizer"),  # model, evidence, lineage
                  files={"version": "register/version.json"}),
        StageSpec("promote", "registry.promote:promote_run", "move the production alias if the gate passes",
                  reads=("register",), files={"decision": "promote/decision.json"},
                  calls={"decide": "registry.promote:promote", "events": "registry.audit:events",
                         "format_history": "registry.audit:format_history"}),
        # a verb, never a pipeline step: `forge rollback [NAME]` calls rollback(cfg, name)
        StageSpec("rollback", "registry.audit:rollback",
                  "move production back to the previous version that passed the gate"),
        StageSpec("serve", "serve.stage:run",
                  "serve the production model (llama.cpp on CPU, vLLM on GPU), OpenAI API"),
        StageSpec("chat", "serve.stage:chat_run", "the Gradio chat UI in front of a served model"),
        StageSpec("bundle", "serve.stage:bundle_run", "a checksummed CPU deploy bundle of the production model"),
    ]
}  # fmt: skip

# The pipeline: (stage, options). eval runs twice, on the pretrained and on the fine-tuned model.
# evidence runs twice: on the settings alone first, then with the held-out pairs and test text counted, before the
# tokenizer and training (it is a check, never skipped: what it reads may have changed).
PIPELINE: list[tuple[str, dict[str, Any]]] = [
    ("plan", {}),
    ("evidence", {}),
    ("data", {}),
    ("qa", {}),
    ("evidence", {}),
    ("tokenizer", {}),
    ("pretrain", {}),
    ("eval", {"target": "pretrain"}),
    ("sft", {}),
    ("eval", {"target": "sft"}),
    ("quantize", {}),
    ("register", {}),
    ("promote", {}),
]

# Directories a run may hold, in the order `forge status` and the report card show them.
RUN_LAYOUT: list[str] = [d for spec in STAGES.values() for d in spec.dirs]


def stage_file(run: Path, stage: str, name: str) -> Path:
    """The path of a stage's named output (STAGES[stage].files[name]) in run directory `run`."""
    return run / STAGES[stage].files[name]
