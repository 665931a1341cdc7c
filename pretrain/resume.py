"""Exact resume: what a checkpoint holds of a pretraining run beyond the weights and optimizer (the RNG, the
schedule, the loss scaler, the data position, the monitors, the best val loss), and how a run comes back from it
and continues as if it had never stopped. pretrain/checkpoint.py writes and reads the files.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.io import remove_path
from pretrain import checkpoint as ckpt
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
    state = ckpt.read_state(found[-1][1])
    if (state["config_hash"], state["inputs"]) != (t.key["config_hash"], t.key["inputs"]):
        log.warning("pretrain: the checkpoints in %s are from another config or input; starting over", t.ckpt_root)
        return None
    refuse_another_world_size(t, found[-1][1], state.get("world_size"))
    return found[-1][1]


def refuse_another_world_size(t: Trainer, path: Path, written_by: int | None) -> None:
    """A checkpoint resumes only on the number of processes that wrote it: on another, each step would train on
    another global batch (micro_batch_size x grad_accum_steps x processes) and the data position would no longer
    be where the run stopped. Refused with the numbers, before anything is loaded."""
    world = t.accelerator.num_processes
    if written_by is None or written_by == world:
        return
    per_process = t.tcfg.micro_batch_size * t.tcfg.grad_accum_steps
    raise ForgeError(
        f"pretrain: {path} was written by {written_by} process(es), a global batch of {written_by * per_process} "
        f"sequences ({written_by} x train.micro_batch_size {t.tcfg.micro_batch_size} x train.grad_accum_steps "
        f"{t.tcfg.grad_accum_steps}); resumed on {world} it would train on {world * per_process} a step. Resume it "
        f"on {written_by} process(es) (accelerate launch / torchrun --nproc-per-node x --nnodes = {written_by}), or "
        "start over with --force"
    )


def load_checkpoint(t: Trainer, path: Path) -> None:
    """Weights, optimizer, RNG, schedule, loss scaler, data position and monitors as they were at the checkpoint;
    the metrics log cut back to it."""
    state = ckpt.load(path, t.raw_model, t.optimizer.optimizer, rank=t.accelerator.process_index)
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


def save_checkpoint(t: Trainer) -> None:
    """A full checkpoint of this step, written by every process (FSDP gathers the shards); the oldest beyond
    train.keep_checkpoints go."""
    from accelerate.utils import gather_object

    rng = gather_object([ckpt.capture_rng()])
    scaler = t.accelerator.scaler
    state = {
        "config_hash": t.key["config_hash"], "inputs": t.key["inputs"], "tokens_seen": t.tokens_seen,
        "world_size": t.accelerator.num_processes, "sharding": "fsdp" if t.sharded else "ddp",
        "precision": t.precision, "scheduler": scheduler_state(t.scheduler),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "loader": t.data.loader.state_dict(), "val_rise": t.val_rise.state_dict(), "spikes": t.spikes.state_dict(),
        "best": t.best,
    }  # fmt: skip
    ckpt.save(t.ckpt_root, t.step, t.raw_model, t.optimizer.optimizer, rng, state)
    if t.main:
        ckpt.prune(t.ckpt_root, t.tcfg.keep_checkpoints, keep=set())
    t.accelerator.wait_for_everyone()
    t.last_ckpt = ckpt.step_dir(t.ckpt_root, t.step).name


def scheduler_state(scheduler) -> dict[str, Any]:
    return {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"} | {"lr_lambdas": [None]}
