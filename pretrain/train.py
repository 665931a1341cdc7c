"""`forge pretrain`: train the decoder-only model on the token shards with a manual Hugging Face Accelerate loop,
then export the best checkpoint as a transformers model directory.

    forge pretrain --config configs/tiny-cpu.yaml            # one process: the GPU if there is one, else the CPU
    accelerate launch --multi_gpu --num_processes 8 -m forge.cli pretrain --config configs/1b.yaml     # 8 GPUs, DDP
    accelerate launch --multi_gpu --num_processes 2 -m forge.cli pretrain --config configs/tiny-cpu.yaml
        # no GPU: 2 CPU processes over gloo (`--multi_gpu` picks the torchrun launcher; `--cpu` would start one)
    torchrun --nproc_per_node 8 --nnodes 2 --rdzv-endpoint HOST:29500 -m forge.cli pretrain --config ...  # 2 nodes
    torchrun --nproc_per_node 8 -m forge.cli pretrain --config configs/1b.yaml --set train.sharding=fsdp  # FSDP

Each process trains on its slice of the global batch (`train.micro_batch_size` x `train.grad_accum_steps` per
process); the main process alone writes the manifest, metrics and MLflow. train.sharding picks how the processes
hold the model: ddp, a whole copy each, or fsdp, a 1/N shard each (see pretrain/sharding.py). Each process writes
the checkpoints' tensors it holds (the main one renames a checkpoint into place) and any sharding on any number of
processes reads them back, so a run resumes sharded or not, and on another number of processes where
train.grad_accum_steps can keep its global batch (pretrain/resume.py); the export alone holds whole tensors.

Reads `runs/<run>/tokenizer/` (tokenizer files and `shards/`); writes into `runs/<run>/pretrain/`:
  checkpoints/step-NNNNNNN/   the last `train.keep_checkpoints` full checkpoints, sharded (see pretrain/checkpoint.py)
  checkpoints/best/           the weights with the lowest val loss so far, as the processes held them (tensors/
                              shard files + state.json): gathered whole once, by the export
  model/                      the best weights exported: safetensors, config.json, generation_config.json and the
                              tokenizer files with chat_template.jinja; `AutoModelForCausalLM.from_pretrained` it
  metrics.jsonl               one line per step (loss, lr, grad norm) and per evaluation (val loss, perplexity)
  loss_curves.png             train and val loss, and the learning rate, against the step

A re-run whose previous attempt did not complete (killed, or failed) resumes from its newest checkpoint when the
config and inputs are unchanged, and continues exactly as an uninterrupted run would; `--force` starts over.

Every optimizer step trains on one global batch of micro_batch_size x grad_accum_steps x processes windows of
context_length tokens (see pretrain/loader.py), so the number of processes changes speed, not the run.

Here: the stage, the run (`train`: build, resume, loop, export) and the steps of its loop. pretrain/trainer.py
builds what the run trains (data, model, optimizer, schedule), pretrain/resume.py saves and restores it exactly,
pretrain/weights.py keeps the best weights and exports them, pretrain/metrics.py logs and plots the losses.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from forge import ForgeError
from forge.config import ForgeConfig, TrainConfig
from forge.lineage import Stage, read_manifest, require_reads, run_stage
from forge.progress import progress
from models import TOKENIZER_FILES
from pretrain.checkpoint import CheckpointWriter
from pretrain.hardware import local_hardware, resolve_precision
from pretrain.loader import IGNORE, iter_eval_batches
from pretrain.metrics import CURVES, METRICS, plot_curves, read_records
from pretrain.monitor import check_finite
from pretrain.plan import training_budget
from pretrain.resume import resume_or_start_over, save_checkpoint
from pretrain.sharding import clip_grad_norm
from pretrain.token_shards import read_meta
from pretrain.trainer import Trainer, build_trainer, load_data
from pretrain.weights import export, save_best

log = logging.getLogger("forge.pretrain")


# ----------------------------------------------------------------------------------------------------------------
# the stage


def run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    """Pretrain `cfg.model` on the tokenizer stage's shards; resume an incomplete attempt; export the best model."""
    accelerator = make_accelerator(cfg.train)  # first: every process must take the same decisions below
    tok_dir = require_reads(cfg, "pretrain", ["tokenizer"])["tokenizer"]
    check_tokenizer_stage(tok_dir)
    stage = Stage(
        name="pretrain",
        cfg=cfg,
        inputs={
            **{name: tok_dir / name for name in TOKENIZER_FILES if (tok_dir / name).is_file()},
            "shards": tok_dir / "shards",
            **({"base": Path(cfg.model.init_from)} if cfg.model.init_from else {}),  # its sha256, in the manifest
        },
        artifact_exclude=("checkpoints/*",),  # resumable state stays on disk; the exported model/ is uploaded
    )
    key = skip_key_once(stage, accelerator)
    previous = stage.read_manifest()
    skip = not force and stage.up_to_date(key)
    resume = not force and previous is not None and previous.get("status") != "complete"
    accelerator.wait_for_everyone()  # every process has read the old manifest before the main one rewrites it

    def body(s: Stage) -> dict[str, float]:
        return {**log_training_budget(cfg, tok_dir), **train(s, accelerator, key, resume=resume)}

    if accelerator.is_main_process:
        manifest = run_stage(stage, body, force=force, key=key)
    elif skip:
        manifest = previous or {}
    else:
        body(stage)
        manifest = {}
    accelerator.wait_for_everyone()
    return manifest if accelerator.is_main_process else (read_manifest(stage.dir) or manifest)


def skip_key_once(stage: Stage, accelerator: Any) -> dict[str, Any]:
    """The stage's skip key, hashed by the main process alone and sent to the others: hashing reads every token
    shard (16 processes x 20 GB would be 320 GB of reads at every start)."""
    from accelerate.utils import broadcast_object_list

    box = [stage.skip_key() if accelerator.is_main_process else None]
    if accelerator.num_processes > 1:
        broadcast_object_list(box)
    return box[0]


def log_training_budget(cfg: ForgeConfig, tok_dir: Path) -> dict[str, float]:
    """Tokens per parameter of this model on the tokenized train split, logged with its note or warning."""
    meta = read_meta(tok_dir / "shards")
    budget = training_budget(cfg, int(meta["vocab_size"]), int(meta["splits"]["train"]["tokens"]))
    if "tokens_per_parameter" in budget:
        ratio, tokens, params = budget["tokens_per_parameter"], budget["tokens_train"], budget["parameters"]
        log.info("pretrain: %.2f tokens per parameter (%s train tokens, %s parameters)", ratio, f"{tokens:,}",
                 f"{params:,}")  # fmt: skip
    if "note" in budget:
        log.info("pretrain: %s", budget["note"])
    if "warning" in budget:
        log.warning("pretrain: %s", budget["warning"])
    if "tokens_per_parameter" not in budget:
        return {}
    return {"tokens_per_parameter": budget["tokens_per_parameter"], "model_parameters": budget["parameters"]}


def check_tokenizer_stage(tok_dir: Path) -> None:
    missing = [name for name in ("tokenizer.json", "shards/meta.json") if not (tok_dir / name).is_file()]
    if missing:
        raise ForgeError(f"{tok_dir} has no {' or '.join(missing)}: run `forge tokenizer` first")


def make_accelerator(tcfg: TrainConfig):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    precision = resolve_precision(tcfg.precision, local_hardware())
    mixed = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[precision]
    # Accelerate keeps one precision per process; a second stage in the same process (pipeline, tests) may need
    # another. This clears the precision only: the distributed setup (PartialState) stays.
    AcceleratorState._reset_state(reset_partial_state=False)
    accelerator = Accelerator(
        mixed_precision=mixed, cpu=not torch.cuda.is_available(), step_scheduler_with_optimizer=False
    )
    if accelerator.distributed_type == "FSDP":
        # Accelerate's FSDP plugin would wrap the model its own way and ignore train.sharding; one path shards
        raise ForgeError(
            "accelerate launch --use_fsdp: forge pretrain shards with its own FSDP (and its own checkpoints); "
            "launch without --use_fsdp and set train.sharding=fsdp"
        )
    return accelerator


# ----------------------------------------------------------------------------------------------------------------
# the training run


def train(stage: Stage, accelerator, key: dict[str, Any], resume: bool) -> dict[str, float]:
    """Train on the token shards, from the newest checkpoint of an incomplete attempt or from the start; export the
    best weights."""
    data = load_data(stage.cfg, accelerator.num_processes)
    t = build_trainer(stage, accelerator, key, data)
    resume_or_start_over(t, resume)
    log_start(t)
    writer = CheckpointWriter(t.ckpt_root, t.tcfg.keep_checkpoints)
    try:
        with t.metrics:
            train_loop(t, writer)
    finally:
        writer.wait()  # the last checkpoint in place before the run ends, a failed run too (its last good one)
        if t.main:
            plot_curves(stage.dir / METRICS, stage.dir / CURVES)
    if t.main:  # the best weights, read whole from their shard files, as a transformers model directory
        export(t.best_dir, stage.dir / "model", stage.cfg, t.vocab, data.ids, data.tok_dir)
    accelerator.wait_for_everyone()
    return summary(t)


def train_loop(t: Trainer, writer: CheckpointWriter) -> None:
    """Optimizer steps up to train.max_steps or an early stop; logging, evaluation and checkpoints (written by
    `writer` while training goes on) on their schedules. Only what happens here counts in the tokens/s: evaluation
    and the checkpoint's copy to CPU memory are left out."""
    tcfg = t.tcfg
    t.model.train()
    with step_bar(t) as bar, logging_redirect_tqdm() if t.main else contextlib.nullcontext():
        if t.step == 0:
            evaluate_initial(t)
        interval = Interval()
        while t.step < tcfg.max_steps:
            started = time.perf_counter()
            loss, grad_norm, lr = train_step(t)
            record_step(t, loss, grad_norm, lr)
            interval.tokens += t.data.tokens_per_step
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            step_s = time.perf_counter() - started
            last = t.step == tcfg.max_steps
            if t.step % tcfg.log_every == 0 or last:
                log_progress(t, loss, lr, grad_norm, interval.tokens_per_s(), step_s)
            evaluated = t.step % tcfg.eval_every == 0 or last
            if evaluated:
                evaluate_and_keep_best(t)
            checkpointed = t.step % tcfg.checkpoint_every == 0 or last or t.stop_reason is not None
            if checkpointed:
                save_checkpoint(t, writer)
            if t.stop_reason:
                log.warning("pretrain: %s", t.stop_reason)
                break
            if evaluated or checkpointed:
                interval = Interval()


# ----------------------------------------------------------------------------------------------------------------
# the steps of the loop


def train_step(t: Trainer) -> tuple[float, float, float]:
    """One optimizer step on the global batch: (its mean loss, the gradient norm before clipping, the lr used)."""
    acc, tcfg = t.accelerator, t.tcfg
    lr = float(t.scheduler.get_last_lr()[0])
    micro_batches = t.data.loader.next_step(tcfg.micro_batch_size, tcfg.grad_accum_steps, acc.process_index,
                                            acc.num_processes)  # fmt: skip
    total = torch.zeros((), device=acc.device)
    for i, (x, y) in enumerate(micro_batches):
        x, y = x.to(acc.device, non_blocking=True), y.to(acc.device, non_blocking=True)
        # DDP all-reduces once, at the last micro-batch; FSDP reduce-scatters each one, so that every process
        # keeps only its shard of the gradients (what it is there to save)
        sync = i == len(micro_batches) - 1 or t.sharded
        with contextlib.nullcontext() if sync else acc.no_sync(t.model):
            loss = compute_loss(t.forward, x, y) / tcfg.grad_accum_steps
            acc.backward(loss)
        total += loss.detach()
    acc.unscale_gradients()  # fp16: the norm and the clipping are of the true gradients
    grad_norm = clip_grad_norm(t.parameters, tcfg.grad_clip or math.inf)
    loss_value = acc.reduce(total, "mean").item()
    check_finite(t.step + 1, loss_value, None if t.precision == "fp16" else grad_norm, t.last_ckpt, lr)
    t.optimizer.step()
    t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    t.step += 1
    t.tokens_seen += t.data.tokens_per_step
    return loss_value, grad_norm, lr


def compute_loss(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits are upcast to fp32 for the softmax."""
    logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))


def record_step(t: Trainer, loss: float, grad_norm: float, lr: float) -> None:
    """The step's line in metrics.jsonl, marked where its loss spikes."""
    record = {"step": t.step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "time": time.time()}
    if (spike := t.spikes.update(t.step, loss)) is not None:
        log.warning("pretrain: %s", spike)
        record["spike"] = 1
    t.metrics.write(record)


def log_progress(t: Trainer, loss: float, lr: float, grad_norm: float, tok_s: float, step_s: float) -> None:
    """Every train.log_every steps: one log line and the tracker's training curves."""
    t.throughput.append(tok_s)
    logged = {
        "train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm,
        "train/tokens_per_s": tok_s, "train/mfu": t.flops_token * tok_s / t.peak,
        "train/memory_gb": memory_gb(t.accelerator.device), "train/tokens_seen": t.tokens_seen,
        "train/step_s": step_s, "train/spikes": len(t.spikes.spikes),
    }  # fmt: skip
    log.info(
        "step %d/%d | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | MFU %.1f%% | mem %.2f GB",
        t.step, t.tcfg.max_steps, loss, lr, grad_norm, f"{tok_s:,.0f}", 100 * logged["train/mfu"],
        logged["train/memory_gb"],
    )  # fmt: skip
    if t.tracker:
        t.tracker.log_metrics(logged, step=t.step)


def evaluate_initial(t: Trainer) -> None:
    """The val loss before any training: the reference of the acceptance ratio, and the first best weights."""
    first = log_val_loss(t)
    t.val_rise.update(0, first)
    t.best = {"val_loss": first, "step": 0}
    save_best(t.best_dir, t.raw_model, t.best)


def evaluate_and_keep_best(t: Trainer) -> None:
    """The val loss now: the best weights kept, and a rise flagged (an early stop with train.stop_on_val_rise)."""
    val_loss = log_val_loss(t)
    if val_loss < t.best["val_loss"]:
        t.best = {"val_loss": val_loss, "step": t.step}
        save_best(t.best_dir, t.raw_model, t.best)
    if (flag := t.val_rise.update(t.step, val_loss)) is not None:
        log.warning("pretrain: %s", flag)
        if t.tracker:
            t.tracker.log_metrics({"red_flags/val_rise": 1.0}, step=t.step)
        if t.tcfg.stop_on_val_rise:
            t.stop_reason = f"stopped early at step {t.step}: val perplexity rising (best: {t.best['step']})"


def log_val_loss(t: Trainer) -> float:
    """The val loss now, in metrics.jsonl, the log and the tracker."""
    d = t.data
    val_loss = evaluate(t.forward, d.val_tokens, d.val_starts, d.context_length, t.tcfg.micro_batch_size, t.accelerator)
    t.metrics.write({"step": t.step, "val_loss": val_loss, "val_ppl": _ppl(val_loss)})
    log.info("step %d | val loss %.4f | val ppl %.3f", t.step, val_loss, _ppl(val_loss))
    if t.tracker:
        t.tracker.log_metrics({"val/loss": val_loss, "val/ppl": _ppl(val_loss)}, step=t.step)
    return val_loss


@torch.no_grad()
def evaluate(model, tokens, starts, context_length: int, batch_size: int, accelerator) -> float:
    """Mean next-token loss over the fixed val windows, every process a share, summed across processes."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
    rank, world = accelerator.process_index, accelerator.num_processes
    for x, y in iter_eval_batches(tokens, starts, context_length, batch_size, rank, world):
        x, y = x.to(accelerator.device), y.to(accelerator.device)
        logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(
            logits.float().view(-1, logits.size(-1)), y.reshape(-1), reduction="sum", ignore_index=IGNORE
        )
        total += torch.stack([loss.double(), (y != IGNORE).sum().double()])
    model.train()
    total = accelerator.reduce(total, "sum")
    return float(total[0] / total[1])


# ----------------------------------------------------------------------------------------------------------------
# what the run shows and reports


def log_start(t: Trainer) -> None:
    """What this run trains, on what, from which step: log lines and the tracker's parameters (main process)."""
    if not t.main:
        return
    d, world, max_steps = t.data, t.accelerator.num_processes, t.tcfg.max_steps
    log.info(
        "pretrain: %s parameters, %d process(es) on %s, %s, global batch %d x %d tokens, %d steps, %.2f epochs",
        f"{t.n_params:,}", world, t.accelerator.device.type, t.precision, d.global_batch, d.context_length,
        max_steps, max_steps * d.global_batch / d.loader.windows_per_epoch,
    )  # fmt: skip
    log.info("pretrain: %s, parameters held per process: %s", "FSDP" if t.sharded else "unsharded",
             " / ".join(f"{n:,}" for n in t.held))  # fmt: skip
    if t.tracker is not None:
        t.tracker.log_params({"pretrain": {"parameters": t.n_params, "precision": t.precision, "processes": world,
                                           "sharding": "fsdp" if t.sharded else "ddp", "resumed_from_step": t.step,
                                           "flops_per_token": t.flops_token}})  # fmt: skip


def step_bar(t: Trainer) -> tqdm:
    """The steps done of train.max_steps, on the main process: a bar on a terminal, else a log line now and then."""
    if not t.main:
        return tqdm(disable=True)
    bar = progress(total=t.tcfg.max_steps, desc="pretrain", unit="step", logger=log)
    bar.n = bar.last_print_n = bar.initial = t.step  # what tqdm's initial= sets: a resumed run's rate is its own
    return bar


class Interval:
    """The tokens trained since it began, and their rate: the throughput of one logging interval."""

    def __init__(self) -> None:
        self.start, self.tokens = time.perf_counter(), 0

    def tokens_per_s(self) -> float:
        elapsed = time.perf_counter() - self.start
        return self.tokens / elapsed if elapsed > 0 else 0.0


def memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import psutil

    return psutil.Process().memory_info().rss / 2**30


def _ppl(loss: float) -> float:
    return math.exp(min(loss, 700.0))


def summary(t: Trainer) -> dict[str, float]:
    """The stage's metrics: the run's extent, its losses (metrics.jsonl holds those before a resume too), the
    red flags and the median throughput."""
    records = read_records(t.stage.dir / METRICS)
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    train_losses = [r["loss"] for r in records if "loss" in r]
    tok_s = statistics.median(t.throughput) if t.throughput else math.nan
    return {
        "steps": float(t.step), "resumed_from_step": float(t.start_step), "tokens": float(t.tokens_seen),
        "parameters": float(t.n_params),
        "initial_val_loss": vals[0] if vals else math.nan, "final_val_loss": vals[-1] if vals else math.nan,
        "best_val_loss": t.best["val_loss"], "best_step": float(t.best["step"]),
        "best_val_ppl": _ppl(t.best["val_loss"]),
        "final_train_loss": train_losses[-1] if train_losses else math.nan,
        "val_rise_flags": float(len(t.val_rise.flagged_at)), "loss_spikes": float(len(t.spikes.spikes)),
        "stopped_early": float(t.stop_reason is not None),
        "tokens_per_s": tok_s, "mfu": t.flops_token * tok_s / t.peak if t.throughput else math.nan,
    }  # fmt: skip
