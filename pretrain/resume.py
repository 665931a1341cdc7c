"""Exact resume: what a checkpoint holds of a pretraining run beyond the weights and optimizer (the RNG, the
schedule, the loss scaler, the data position, the monitors, the best val loss), and how a run comes back from it
and continues as if it had never stopped. pretrain/checkpoint.py writes and reads the files.

A checkpoint resumes under ddp or fsdp whichever wrote it (each process reads the slices it holds), and on another
number of processes when train.grad_accum_steps can keep its global batch (keep_global_batch); exactly, to the bit,
on the number of processes that wrote it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.io import remove_path
from pretrain import checkpoint as ckpt
from pretrain.loader import eval_windows
from pretrain.metrics import CURVES, METRICS, keep_records_until
from pretrain.trainer import Trainer

log = logging.getLogger("forge.pretrain")


def resume_or_start_over(t: Trainer, resume: bool) -> None:
    """Continue from the newest checkpoint of an incomplete attempt with this config and inputs, or clear the old
    outputs and start from step 0."""
    path = resumable_checkpoint(t) if resume else None
    if path is not None:
        load_checkpoint(t, path)
    elif t.main:
        for old in (t.ckpt_root, t.stage.dir / "model", t.stage.dir / METRICS, t.stage.dir / CURVES):
            remove_path(old)
    t.accelerator.wait_for_everyone()
    t.start_step = t.step


def resumable_checkpoint(t: Trainer) -> Path | None:
    found = ckpt.list_checkpoints(t.ckpt_root)
    if not found:
        return None
    path = found[-1][1]
    state = ckpt.read_state(path)
    if (state["config_hash"], state["inputs"]) != (t.key["config_hash"], t.key["inputs"]):
        log.warning("pretrain: the checkpoints in %s are from another config or input; starting over", t.ckpt_root)
        return None
    ckpt.check_format(path, state)
    keep_global_batch(t, path, state)
    return path


def keep_global_batch(t: Trainer, path: Path, state: dict[str, Any]) -> None:
    """Resume on any number of processes that can train on the checkpoint's global batch (micro_batch_size x
    grad_accum_steps x processes windows a step): train.grad_accum_steps becomes what keeps it, with a warning
    naming the numbers; on another, refused with them before anything is loaded.

    The data position counts windows of the global batch (pretrain/loader.py), so the same windows make each step,
    in the same order, and the optimizer's state reshards to the new processes. What cannot continue exactly is
    each process's RNG (dropout masks): a process draws for other windows than the one of that rank that wrote
    it, so the losses follow the uninterrupted run closely (float sums in another order), not to the bit."""
    world, tcfg = t.accelerator.num_processes, t.tcfg
    written = state["global_batch"]
    if written == t.data.global_batch:
        return
    accum = grad_accum_for(path, state, tcfg.micro_batch_size, world)
    if t.main:
        log.warning(
            "pretrain: %s was written by %d process(es) x train.micro_batch_size %d x train.grad_accum_steps %d, a "
            "global batch of %d; resumed on %d with train.grad_accum_steps %d to keep it (the same data in the same "
            "order; each process's dropout RNG cannot continue exactly on another process count: the losses follow "
            "the uninterrupted run closely, not to the bit)",
            path, state["world_size"], tcfg.micro_batch_size, state["grad_accum_steps"], written, world, accum,
        )  # fmt: skip
    # this run's copy of the config (the caller's is left as it is); config.yaml keeps the configured value
    t.stage.cfg = t.stage.cfg.model_copy(update={"train": tcfg.model_copy(update={"grad_accum_steps": accum})})
    d = t.data
    d.global_batch = written
    d.val_starts = eval_windows(d.val_tokens, d.context_length, t.tcfg.eval_batches * written)  # as written


def grad_accum_for(path: Path, state: dict[str, Any], micro_batch_size: int, world: int) -> int:
    """The train.grad_accum_steps that trains on the checkpoint's global batch on `world` processes of
    `micro_batch_size` windows, or a ForgeError with the numbers and the process counts that can."""
    written, by = state["global_batch"], state["world_size"]
    accum, rest = divmod(written, micro_batch_size * world)
    if accum >= 1 and rest == 0:
        return accum
    can = [n for n in range(1, written // micro_batch_size + 1) if written % (micro_batch_size * n) == 0]
    raise ForgeError(
        f"pretrain: {path} was written by {by} process(es), a global batch of {written} sequences ({by} x "
        f"train.micro_batch_size {micro_batch_size} x train.grad_accum_steps {state['grad_accum_steps']}); on "
        f"{world} process(es) no whole train.grad_accum_steps keeps it ({written} / ({world} x {micro_batch_size}) "
        f"= {written / (world * micro_batch_size):g}). Resume it on {', '.join(map(str, can))} process(es) "
        "(accelerate launch / torchrun --nproc-per-node x --nnodes), or start over with --force"
    )


def load_checkpoint(t: Trainer, path: Path) -> None:
    """Weights, optimizer, RNG, schedule, loss scaler, data position and monitors as they were at the checkpoint;
    the metrics log cut back to it."""
    state = ckpt.load(path, t.raw_model, t.optimizer.optimizer)
    t.scheduler.load_state_dict(state["scheduler"])
    if t.accelerator.scaler is not None and state.get("scaler"):
        t.accelerator.scaler.load_state_dict(state["scaler"])
    t.data.loader.load_state_dict(state["loader"])
    t.val_rise.load_state_dict(state["val_rise"])
    t.spikes.load_state_dict(state["spikes"])
    t.step, t.tokens_seen, t.best, t.last_ckpt = state["step"], state["tokens_seen"], state["best"], path.name
    if t.main:
        ckpt.clean_partial(t.ckpt_root)
        keep_records_until(t.stage.dir / METRICS, t.step)
    log.info("pretrain: resumed from %s (step %d of %d, %s tokens seen)", path, t.step, t.tcfg.max_steps, t.tokens_seen)


def save_checkpoint(t: Trainer, writer: ckpt.CheckpointWriter) -> None:
    """A full checkpoint of this step, each process writing what it holds (its shards under FSDP), in the
    background; the oldest beyond train.keep_checkpoints go once it is in place."""
    scaler = t.accelerator.scaler
    state = {
        "config_hash": t.key["config_hash"], "inputs": t.key["inputs"], "tokens_seen": t.tokens_seen,
        "world_size": t.accelerator.num_processes, "sharding": "fsdp" if t.sharded else "ddp",
        "global_batch": t.data.global_batch, "micro_batch_size": t.tcfg.micro_batch_size,
        "grad_accum_steps": t.tcfg.grad_accum_steps,
        "precision": t.precision, "scheduler": scheduler_state(t.scheduler),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "loader": t.data.loader.state_dict(), "val_rise": t.val_rise.state_dict(), "spikes": t.spikes.state_dict(),
        "best": t.best,
    }  # fmt: skip
    t.last_ckpt = writer.save(t.step, t.raw_model, t.optimizer.optimizer, state).name


def scheduler_state(scheduler) -> dict[str, Any]:
    return {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"} | {"lr_lambdas": [None]}
