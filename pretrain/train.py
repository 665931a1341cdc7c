"""`forge pretrain`: train the decoder-only model on the token shards with a manual Hugging Face Accelerate loop,
then export the best checkpoint as a transformers model directory.

    forge pretrain --config configs/tiny-cpu.yaml            # one process: the GPU if there is one, else the CPU
    accelerate launch --multi_gpu --num_processes 8 -m forge.cli pretrain --config configs/1b.yaml     # 8 GPUs, DDP
    accelerate launch --multi_gpu --num_processes 2 -m forge.cli pretrain --config configs/tiny-cpu.yaml
        # no GPU: 2 CPU processes over gloo (`--multi_gpu` picks the torchrun launcher; `--cpu` would start one)
    torchrun --nproc_per_node 8 --nnodes 2 --rdzv-endpoint HOST:29500 -m forge.cli pretrain --config ...  # 2 nodes
    torchrun --nproc_per_node 8 -m forge.cli pretrain --config configs/1b.yaml --set train.sharding=fsdp  # FSDP

Each process trains on its slice of the global batch (`train.micro_batch_size` x `train.grad_accum_steps` per
process); the main process alone writes the manifest, checkpoints, metrics and MLflow. train.sharding picks how
the processes hold the model: ddp, a whole copy each, or fsdp, a 1/N shard each (see pretrain/sharding.py);
checkpoints and the export hold whole tensors either way, so a run resumes on any number of processes, sharded or
not.

Reads `runs/<run>/tokenizer/` (tokenizer files and `shards/`); writes into `runs/<run>/pretrain/`:
  checkpoints/step-NNNNNNN/   the last `train.keep_checkpoints` full checkpoints (see pretrain/checkpoint.py)
  checkpoints/best/           the weights with the lowest val loss so far (model.safetensors + state.json)
  model/                      the best weights exported: safetensors, config.json, generation_config.json and the
                              tokenizer files with chat_template.jinja; `AutoModelForCausalLM.from_pretrained` it
  metrics.jsonl               one line per step (loss, lr, grad norm) and per evaluation (val loss, perplexity)
  loss_curves.png             train and val loss, and the learning rate, against the step

A re-run whose previous attempt did not complete (killed, or failed) resumes from its newest checkpoint when the
config and inputs are unchanged, and continues exactly as an uninterrupted run would; `--force` starts over.

Every optimizer step trains on one global batch of micro_batch_size x grad_accum_steps x processes windows of
context_length tokens (see pretrain/loader.py), so the number of processes changes speed, not the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from forge import ForgeError, render
from forge.config import ForgeConfig, TrainConfig
from forge.io import atomic_path, atomic_write_json, atomic_write_jsonl, read_jsonl
from forge.lineage import Stage, read_manifest, run_stage
from forge.paths import run_dir
from models import TOKENIZER_FILES
from pretrain import checkpoint as ckpt
from pretrain.hardware import flops_per_token, peak_flops
from pretrain.loader import IGNORE, WindowLoader, eval_windows, iter_eval_batches
from pretrain.monitor import LossSpikes, ValRise, check_finite
from pretrain.plan import training_budget
from pretrain.sharding import clip_grad_norm, local_parameters, shard, use_fsdp
from pretrain.token_shards import load_split, read_meta

log = logging.getLogger("forge.pretrain")

METRICS = "metrics.jsonl"
CURVES = "loss_curves.png"


# ----------------------------------------------------------------------------------------------------------------
# the stage


def run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    """Pretrain `cfg.model` on the tokenizer stage's shards; resume an incomplete attempt; export the best model."""
    tok_dir = run_dir(cfg) / "tokenizer"
    check_tokenizer_stage(tok_dir)
    accelerator = make_accelerator(cfg.train)  # first: every process must take the same decisions below
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
    key = stage.skip_key()
    previous = stage.read_manifest()
    skip = not force and stage.up_to_date(key)
    resume = not force and previous is not None and previous.get("status") != "complete"
    accelerator.wait_for_everyone()  # every process has read the old manifest before the main one rewrites it

    def body(s: Stage) -> dict[str, float]:
        return {**log_training_budget(cfg, tok_dir), **train(s, accelerator, key, resume=resume)}

    if accelerator.is_main_process:
        manifest = run_stage(stage, body, force=force)
    elif skip:
        manifest = previous or {}
    else:
        body(stage)
        manifest = {}
    accelerator.wait_for_everyone()
    return manifest if accelerator.is_main_process else (read_manifest(stage.dir) or manifest)


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
    manifest = read_manifest(tok_dir)
    if manifest is not None and manifest.get("status") != "complete":
        raise ForgeError(f"the tokenizer stage in {tok_dir} is {manifest.get('status')}: re-run forge tokenizer")
    missing = [name for name in ("tokenizer.json", "shards/meta.json") if not (tok_dir / name).is_file()]
    if missing:
        raise ForgeError(f"{tok_dir} has no {' or '.join(missing)}: run `forge tokenizer` first")


def resolve_precision(tcfg: TrainConfig) -> str:
    """auto: bf16 on a GPU that has it, fp16 (with loss scaling) on an older GPU, fp32 on CPU."""
    cuda = torch.cuda.is_available()
    if tcfg.precision == "auto":
        if not cuda:
            return "fp32"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if tcfg.precision == "fp16" and not cuda:
        raise ForgeError("train.precision=fp16 needs a CUDA GPU; on CPU use bf16, fp32 or auto")
    if tcfg.precision == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        raise ForgeError(f"train.precision=bf16: {torch.cuda.get_device_name()} has no bf16; use fp16 or auto")
    return tcfg.precision


def make_accelerator(tcfg: TrainConfig):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    precision = resolve_precision(tcfg)
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
            "accelerate launch --use_fsdp: forge pretrain shards with its own FSDP (whole-tensor checkpoints); "
            "launch without --use_fsdp and set train.sharding=fsdp"
        )
    return accelerator


def prepare(model: torch.nn.Module, tcfg: TrainConfig, accelerator, precision: str):
    """The model and optimizer to train and whether the model is sharded: FSDP2 over the processes, or handed to
    Accelerate (DDP, device placement, autocast). The optimizer goes to Accelerate either way (fp16 loss scaling)."""
    if use_fsdp(tcfg, accelerator.num_processes, precision):
        shard(model, accelerator.device.type, precision)  # first: the optimizer must hold the sharded parameters
        return model, accelerator.prepare(make_optimizer(model, tcfg, accelerator.device)), True
    model, optimizer = accelerator.prepare(model, make_optimizer(model, tcfg, accelerator.device))
    return model, optimizer, False


# ----------------------------------------------------------------------------------------------------------------
# the training run


def train(stage: Stage, accelerator, key: dict[str, Any], resume: bool) -> dict[str, float]:
    from accelerate.utils import gather_object, set_seed
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from pretrain.model import count_parameters, model_config

    cfg, tcfg, mcfg = stage.cfg, stage.cfg.train, model_config(stage.cfg)
    main = accelerator.is_main_process
    rank, world = accelerator.process_index, accelerator.num_processes
    precision = resolve_precision(tcfg)
    tracker = stage.tracker if main else None
    ckpt_root = stage.dir / "checkpoints"
    best_dir = ckpt_root / "best"

    # ------------------------------------------------------------------------------------------------------------
    # data: memory-mapped token shards, random train windows, fixed val windows (never the test split)
    tok_dir = run_dir(cfg) / "tokenizer"
    shards = tok_dir / "shards"
    meta = read_meta(shards)
    vocab = int(meta["vocab_size"])
    ids = {name: int(meta[f"{name}_id"]) for name in ("bos", "eos", "pad") if f"{name}_id" in meta}
    train_tokens, _ = load_split(shards, "train")
    val_tokens, _ = load_split(shards, "val")
    T = mcfg.context_length
    loader = WindowLoader(train_tokens, T, seed=cfg.seed)
    global_batch = tcfg.micro_batch_size * tcfg.grad_accum_steps * world
    val_starts = eval_windows(val_tokens, T, tcfg.eval_batches * global_batch)  # the same for any process count
    tokens_per_step = global_batch * T

    # ------------------------------------------------------------------------------------------------------------
    # model, optimizer, schedule
    set_seed(cfg.seed)
    model = initial_model(cfg, vocab, ids)
    vocab = model.config.vocab_size  # a base may have more embedding rows than its tokenizer has tokens
    model.config.use_cache = False
    if tcfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    n_params = count_parameters(mcfg, vocab)
    model, optimizer, sharded = prepare(model, tcfg, accelerator, precision)
    raw_model = accelerator.unwrap_model(model)  # under fsdp, the sharded model itself
    torch_optimizer = optimizer.optimizer  # under Accelerate's wrapper: what torch.distributed.checkpoint reads
    scheduler = torch.optim.lr_scheduler.LambdaLR(torch_optimizer, lambda step: lr_factor(step, tcfg))
    held = gather_object([local_parameters(raw_model)])  # each process's share: all, or 1/N under fsdp
    parameters = list(model.parameters())
    forward = torch.compile(model) if tcfg.compile else model
    flops_token = flops_per_token(mcfg, vocab)
    device_peak = peak_flops(accelerator.device.type, precision, cfg)
    peak = device_peak * (world if accelerator.device.type == "cuda" else 1)  # CPU processes share one socket
    val_rise = ValRise(tcfg.val_rise_patience)
    spikes = LossSpikes(tcfg.spike_window, tcfg.spike_zscore)

    # ------------------------------------------------------------------------------------------------------------
    # resume the newest checkpoint of an incomplete attempt, or start over
    step, tokens_seen, last_ckpt, best = 0, 0, None, {"val_loss": math.inf, "step": -1}
    found = ckpt.list_checkpoints(ckpt_root) if resume else []
    state = ckpt.read_state(found[-1][1]) if found else None
    if state is not None and (state["config_hash"], state["inputs"]) != (key["config_hash"], key["inputs"]):
        log.warning("pretrain: the checkpoints in %s are from another config or input; starting over", ckpt_root)
        state = None
    if state is not None:
        path = found[-1][1]
        state = ckpt.load(path, raw_model, torch_optimizer, rank=rank)
        scheduler.load_state_dict(state["scheduler"])
        if accelerator.scaler is not None and state.get("scaler"):
            accelerator.scaler.load_state_dict(state["scaler"])
        loader.load_state_dict(state["loader"])
        val_rise.load_state_dict(state["val_rise"])
        spikes.load_state_dict(state["spikes"])
        step, tokens_seen, best, last_ckpt = state["step"], state["tokens_seen"], state["best"], path.name
        if state.get("world_size") != world:
            log.warning("pretrain: checkpoint written by %s process(es), resumed on %d", state.get("world_size"), world)
        if main:
            ckpt.clean_partial(ckpt_root)
            records = [r for r in read_records(stage.dir / METRICS) if r["step"] <= step]
            atomic_write_jsonl(stage.dir / METRICS, records)
        log.info("pretrain: resumed from %s (step %d of %d, %s tokens seen)", path, step, tcfg.max_steps, tokens_seen)
    elif main:
        for old in (ckpt_root, stage.dir / "model", stage.dir / METRICS, stage.dir / CURVES):
            if old.is_dir():
                shutil.rmtree(old)
            elif old.exists():
                old.unlink()
    accelerator.wait_for_everyone()
    start_step = step
    if main:
        log.info(
            "pretrain: %s parameters, %d process(es) on %s, %s, global batch %d x %d tokens, %d steps, %.2f epochs",
            f"{n_params:,}", world, accelerator.device.type, precision, global_batch, T, tcfg.max_steps,
            tcfg.max_steps * global_batch / loader.windows_per_epoch,
        )  # fmt: skip
        log.info("pretrain: %s, parameters held per process: %s", "FSDP" if sharded else "unsharded",
                 " / ".join(f"{n:,}" for n in held))  # fmt: skip
        if tracker is not None:
            tracker.log_params({"pretrain": {"parameters": n_params, "precision": precision, "processes": world,
                                             "sharding": "fsdp" if sharded else "ddp", "resumed_from_step": step,
                                             "flops_per_token": flops_token}})  # fmt: skip
    metrics_file = open(stage.dir / METRICS, "a", encoding="utf-8") if main else None  # noqa: SIM115

    def write(record: dict[str, Any]) -> None:
        if metrics_file is not None:
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()

    def save_checkpoint(at: int) -> str:
        rng = gather_object([ckpt.capture_rng()])
        state = {
            "config_hash": key["config_hash"], "inputs": key["inputs"], "tokens_seen": tokens_seen,
            "world_size": world, "sharding": "fsdp" if sharded else "ddp", "precision": precision,
            "scheduler": scheduler_state(scheduler),
            "scaler": accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
            "loader": loader.state_dict(), "val_rise": val_rise.state_dict(), "spikes": spikes.state_dict(),
            "best": best,
        }  # fmt: skip
        ckpt.save(ckpt_root, at, raw_model, torch_optimizer, rng, state)  # every process: FSDP gathers the shards
        if main:
            ckpt.prune(ckpt_root, tcfg.keep_checkpoints, keep=set())
        accelerator.wait_for_everyone()
        return ckpt.step_dir(ckpt_root, at).name

    # ------------------------------------------------------------------------------------------------------------
    # the loop
    model.train()
    stop_reason = None
    throughput: list[float] = []  # tokens/s of each logging interval
    interval_start, interval_tokens = time.perf_counter(), 0
    bar = tqdm(total=tcfg.max_steps, initial=step, disable=not main, unit="step", dynamic_ncols=True, file=sys.stderr)
    redirect = logging_redirect_tqdm() if main else contextlib.nullcontext()
    try:
        with redirect:
            if step == 0:  # the initial val loss, the reference of the acceptance ratio
                first = evaluate(forward, val_tokens, val_starts, T, tcfg.micro_batch_size, accelerator)
                write({"step": 0, "val_loss": first, "val_ppl": _ppl(first)})
                log.info("step 0 | val loss %.4f | val ppl %.3f", first, _ppl(first))
                if tracker:
                    tracker.log_metrics({"val/loss": first, "val/ppl": _ppl(first)}, step=0)
                val_rise.update(0, first)
                best = {"val_loss": first, "step": 0}
                save_best(best_dir, raw_model, best)
                interval_start = time.perf_counter()
            while step < tcfg.max_steps:
                t0 = time.perf_counter()
                lr = scheduler.get_last_lr()[0]
                micro_batches = loader.next_step(tcfg.micro_batch_size, tcfg.grad_accum_steps, rank, world)
                total = torch.zeros((), device=accelerator.device)
                for i, (x, y) in enumerate(micro_batches):
                    x, y = x.to(accelerator.device, non_blocking=True), y.to(accelerator.device, non_blocking=True)
                    # DDP all-reduces once, at the last micro-batch; FSDP reduce-scatters each one, so that
                    # every process keeps only its shard of the gradients (what it is there to save)
                    sync = i == len(micro_batches) - 1 or sharded
                    with contextlib.nullcontext() if sync else accelerator.no_sync(model):
                        loss = compute_loss(forward, x, y) / tcfg.grad_accum_steps
                        accelerator.backward(loss)
                    total += loss.detach()
                accelerator.unscale_gradients()  # fp16: the norm and the clipping are of the true gradients
                grad_value = clip_grad_norm(parameters, tcfg.grad_clip or math.inf)
                loss_value = accelerator.reduce(total, "mean").item()
                check_finite(step + 1, loss_value, None if precision == "fp16" else grad_value, last_ckpt, lr)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                tokens_seen += tokens_per_step
                interval_tokens += tokens_per_step
                record = {"step": step, "loss": loss_value, "lr": lr, "grad_norm": grad_value, "time": time.time()}
                if (spike := spikes.update(step, loss_value)) is not None:
                    log.warning("pretrain: %s", spike)
                    record["spike"] = 1
                write(record)
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4f}", refresh=False)
                step_time = time.perf_counter() - t0

                if step % tcfg.log_every == 0 or step == tcfg.max_steps:
                    elapsed = time.perf_counter() - interval_start
                    tok_s = interval_tokens / elapsed if elapsed > 0 else 0.0
                    throughput.append(tok_s)
                    logged = {
                        "train/loss": loss_value, "train/lr": lr, "train/grad_norm": grad_value,
                        "train/tokens_per_s": tok_s, "train/mfu": flops_token * tok_s / peak,
                        "train/memory_gb": memory_gb(accelerator.device), "train/tokens_seen": tokens_seen,
                        "train/step_s": step_time, "train/spikes": len(spikes.spikes),
                    }  # fmt: skip
                    log.info(
                        "step %d/%d | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | MFU %.1f%% | mem %.2f GB",
                        step, tcfg.max_steps, loss_value, lr, grad_value, f"{tok_s:,.0f}", 100 * logged["train/mfu"],
                        logged["train/memory_gb"],
                    )  # fmt: skip
                    if tracker:
                        tracker.log_metrics(logged, step=step)

                evaluated = step % tcfg.eval_every == 0 or step == tcfg.max_steps
                if evaluated:
                    val_loss = evaluate(forward, val_tokens, val_starts, T, tcfg.micro_batch_size, accelerator)
                    write({"step": step, "val_loss": val_loss, "val_ppl": _ppl(val_loss)})
                    log.info("step %d | val loss %.4f | val ppl %.3f", step, val_loss, _ppl(val_loss))
                    if tracker:
                        tracker.log_metrics({"val/loss": val_loss, "val/ppl": _ppl(val_loss)}, step=step)
                    if val_loss < best["val_loss"]:
                        best = {"val_loss": val_loss, "step": step}
                        save_best(best_dir, raw_model, best)
                    if (flag := val_rise.update(step, val_loss)) is not None:
                        log.warning("pretrain: %s", flag)
                        if tracker:
                            tracker.log_metrics({"red_flags/val_rise": 1.0}, step=step)
                        if tcfg.stop_on_val_rise:
                            stop_reason = f"stopped early at step {step}: val perplexity rising (best: {best['step']})"
                checkpointed = step % tcfg.checkpoint_every == 0 or step == tcfg.max_steps or stop_reason is not None
                if checkpointed:
                    last_ckpt = save_checkpoint(step)
                if stop_reason:
                    log.warning("pretrain: %s", stop_reason)
                    break
                if evaluated or checkpointed:
                    interval_start, interval_tokens = time.perf_counter(), 0  # eval and checkpoint time excluded
    finally:
        bar.close()
        if metrics_file is not None:
            metrics_file.close()
        if main:
            plot_curves(stage.dir / METRICS, stage.dir / CURVES)

    # ------------------------------------------------------------------------------------------------------------
    # export the best weights as a transformers model directory
    if main:
        export(best_dir, stage.dir / "model", cfg, vocab, ids, tok_dir)
    accelerator.wait_for_everyone()
    records = read_records(stage.dir / METRICS)
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    train_losses = [r["loss"] for r in records if "loss" in r]
    summary = {
        "steps": float(step), "resumed_from_step": float(start_step), "tokens": float(tokens_seen),
        "parameters": float(n_params),
        "initial_val_loss": vals[0] if vals else math.nan, "final_val_loss": vals[-1] if vals else math.nan,
        "best_val_loss": best["val_loss"], "best_step": float(best["step"]), "best_val_ppl": _ppl(best["val_loss"]),
        "final_train_loss": train_losses[-1] if train_losses else math.nan,
        "val_rise_flags": float(len(val_rise.flagged_at)), "loss_spikes": float(len(spikes.spikes)),
        "stopped_early": float(stop_reason is not None),
        "tokens_per_s": statistics.median(throughput) if throughput else math.nan,
        "mfu": flops_token * statistics.median(throughput) / peak if throughput else math.nan,
    }  # fmt: skip
    return summary


# ----------------------------------------------------------------------------------------------------------------
# pieces of the loop


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


def make_optimizer(model: torch.nn.Module, tcfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with two groups: decay on matmul weights; none on norms, biases and embeddings (tied head included)."""
    embedding_params = {
        id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters(recurse=False)
    }
    decay, no_decay = [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 and id(param) not in embedding_params else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": tcfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2), eps=1e-8, fused=fused_adamw(device))


def fused_adamw(device: torch.device) -> bool:
    """The fused AdamW kernel: on CUDA, and on CPU where this torch has it."""
    return device.type in ("cuda", "cpu")


def lr_factor(step: int, tcfg: TrainConfig) -> float:
    """The learning rate at `step` as a fraction of train.lr: linear warmup, then cosine/linear decay or constant."""
    if tcfg.warmup_steps and step < tcfg.warmup_steps:
        return (step + 1) / tcfg.warmup_steps
    if tcfg.schedule == "constant":
        return 1.0
    span = max(tcfg.max_steps - tcfg.warmup_steps, 1)
    progress = min((step - tcfg.warmup_steps) / span, 1.0)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if tcfg.schedule == "cosine" else 1 - progress
    return tcfg.min_lr_ratio + (1 - tcfg.min_lr_ratio) * shape


def scheduler_state(scheduler) -> dict[str, Any]:
    return {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"} | {"lr_lambdas": [None]}


def compute_loss(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits are upcast to fp32 for the softmax."""
    logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))


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


def memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import psutil

    return psutil.Process().memory_info().rss / 2**30


def _ppl(loss: float) -> float:
    return math.exp(min(loss, 700.0))


def save_best(best_dir: Path, model: torch.nn.Module, best: dict[str, Any]) -> None:
    """The whole weights with the lowest val loss so far. Every process calls it (FSDP gathers the shards); the
    main process writes."""
    weights, _ = ckpt.full_state(model)
    if not ckpt.is_main():
        return
    with atomic_path(best_dir) as tmp:
        tmp.mkdir(parents=True)
        ckpt.write_weights(weights, tmp / "model.safetensors", model)
        (tmp / "state.json").write_text(json.dumps(best) + "\n", encoding="utf-8")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The metrics log, without a torn last line (a killed run may leave one)."""
    return read_jsonl(path)


# ----------------------------------------------------------------------------------------------------------------
# outputs: loss curves and the exported model


def plot_curves(metrics: Path, out: Path) -> None:
    plt = render.pyplot()
    records = read_records(metrics)
    train = [(r["step"], r["loss"]) for r in records if "loss" in r and math.isfinite(r["loss"])]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r and math.isfinite(r["val_loss"])]
    lrs = [(r["step"], r["lr"]) for r in records if "lr" in r]
    if not train and not val:
        return
    fig, (ax, ax_lr) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 1])
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss", linewidth=0.8, alpha=0.8)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="val loss", markersize=3)
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    if lrs:
        ax_lr.plot(*zip(*lrs, strict=True), color="tab:green")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    ax_lr.grid(alpha=0.3)
    fig.tight_layout()
    render.save_figure(fig, out)


def export(best_dir: Path, out: Path, cfg: ForgeConfig, vocab: int, ids: dict[str, int], tok_dir: Path) -> None:
    """Write the best weights as a transformers model directory, with the tokenizer and a generation config."""
    from transformers import GenerationConfig

    from models.families import family_of

    if not (best_dir / "model.safetensors").is_file():
        raise ForgeError(f"no best checkpoint in {best_dir}: the run evaluated nothing to export")
    model = initial_model(cfg, vocab, ids)
    model.load_state_dict(ckpt.read_weights(best_dir, model))  # a plain model, on the main process alone
    model.config.use_cache = True
    model.generation_config = GenerationConfig(
        bos_token_id=ids.get("bos"), eos_token_id=ids.get("eos"), pad_token_id=ids.get("pad"),
        max_length=family_of(model.config).model_config(model.config).context_length,  # a base's whole context
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
