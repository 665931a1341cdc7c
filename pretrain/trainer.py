"""What a pretraining run trains, and with what: the data, the model, its optimizer and learning-rate schedule,
gathered in one Trainer that the steps of pretrain/train.py read and advance, and pretrain/resume.py saves and
restores.

The seed is set right before the model's initial weights are drawn, so every process draws the same ones; the
train order does not use that RNG (it is a pure function of the seed, see pretrain/loader.py), and a resumed run
restores the RNG state of its checkpoint after all of this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from forge import ForgeError
from forge.config import ForgeConfig, TrainConfig
from forge.lineage import Stage
from forge.paths import run_dir
from pretrain.hardware import flops_per_token, local_hardware, peak_flops, resolve_precision
from pretrain.loader import WindowLoader, eval_windows
from pretrain.metrics import METRICS, MetricsLog
from pretrain.monitor import LossSpikes, ValRise
from pretrain.sharding import local_parameters, shard, use_fsdp
from pretrain.token_shards import load_split, read_meta
from pretrain.weights import initial_model


@dataclass
class Data:
    """Memory-mapped token shards: random train windows, fixed val windows (never the test split)."""

    tok_dir: Path
    vocab: int  # the tokenizer's
    ids: dict[str, int]  # bos, eos, pad where the tokenizer has them
    loader: WindowLoader
    val_tokens: np.ndarray
    val_starts: np.ndarray
    context_length: int
    global_batch: int  # windows per optimizer step, all processes together

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.context_length


def load_data(cfg: ForgeConfig, world: int) -> Data:
    """The tokenizer stage's shards, for `world` processes."""
    from pretrain.model import model_config

    tok_dir, tcfg = run_dir(cfg) / "tokenizer", cfg.train
    T = model_config(cfg).context_length
    meta = read_meta(tok_dir / "shards")
    ids = {name: int(meta[f"{name}_id"]) for name in ("bos", "eos", "pad") if f"{name}_id" in meta}
    train_tokens, _ = load_split(tok_dir / "shards", "train")
    val_tokens, _ = load_split(tok_dir / "shards", "val")
    loader = WindowLoader(train_tokens, T, seed=cfg.seed)
    global_batch = tcfg.micro_batch_size * tcfg.grad_accum_steps * world
    val_starts = eval_windows(val_tokens, T, tcfg.eval_batches * global_batch)  # the same for any process count
    return Data(tok_dir, int(meta["vocab_size"]), ids, loader, val_tokens, val_starts, T, global_batch)


@dataclass
class Trainer:
    """One training run: its data, model and optimizer, and where it stands (step, best val loss, early stop)."""

    stage: Stage
    accelerator: Any
    key: dict[str, Any]  # the stage's skip key: a checkpoint of another config or input is not resumed
    precision: str
    data: Data
    model: torch.nn.Module  # as Accelerate prepared it (DDP), or the FSDP-sharded model
    raw_model: torch.nn.Module  # unwrapped; under fsdp, the sharded model itself
    parameters: list[torch.nn.Parameter]
    forward: Any  # the model, compiled with train.compile
    optimizer: Any  # Accelerate's wrapper; .optimizer is the torch one, what torch.distributed.checkpoint reads
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sharded: bool
    vocab: int  # the model's embedding rows: a base may have more than its tokenizer has tokens
    n_params: int
    held: list[int]  # the parameters each process holds: all, or 1/N under fsdp
    flops_token: float
    peak: float  # FLOP/s of all the processes' devices, for the MFU
    val_rise: ValRise
    spikes: LossSpikes
    metrics: MetricsLog
    step: int = 0
    tokens_seen: int = 0
    start_step: int = 0
    last_ckpt: str | None = None
    best: dict[str, Any] = field(default_factory=lambda: {"val_loss": math.inf, "step": -1})
    stop_reason: str | None = None
    throughput: list[float] = field(default_factory=list)  # tokens/s of each logging interval

    @property
    def tcfg(self) -> TrainConfig:
        return self.stage.cfg.train

    @property
    def main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def tracker(self) -> Any:
        return self.stage.tracker if self.main else None

    @property
    def ckpt_root(self) -> Path:
        return self.stage.dir / "checkpoints"

    @property
    def best_dir(self) -> Path:
        return self.ckpt_root / "best"


def build_trainer(stage: Stage, accelerator, key: dict[str, Any], data: Data) -> Trainer:
    """The model (the same initial weights in every process: seeded), its optimizer and learning-rate schedule."""
    from accelerate.utils import gather_object, set_seed

    from pretrain.model import count_parameters, model_config

    cfg, tcfg, mcfg = stage.cfg, stage.cfg.train, model_config(stage.cfg)
    precision = resolve_precision(tcfg.precision, local_hardware())
    set_seed(cfg.seed)
    model = initial_model(cfg, data.vocab, data.ids)
    vocab = model.config.vocab_size  # a base may have more embedding rows than its tokenizer has tokens
    model.config.use_cache = False
    if tcfg.gradient_checkpointing:
        checkpoint_layers(model)
    n_params = count_parameters(mcfg, vocab)
    model, optimizer, sharded = prepare(model, tcfg, accelerator, precision)
    raw_model = accelerator.unwrap_model(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer, lambda step: lr_factor(step, tcfg))
    held = gather_object([local_parameters(raw_model)])
    parameters = list(model.parameters())
    forward = torch.compile(model) if tcfg.compile else model
    device = accelerator.device.type
    # one peak per GPU; CPU processes share one socket
    peak = peak_flops(device, precision, cfg) * (accelerator.num_processes if device == "cuda" else 1)
    return Trainer(
        stage, accelerator, key, precision, data, model, raw_model, parameters, forward, optimizer, scheduler,
        sharded, vocab, n_params, held, flops_per_token(mcfg, vocab), peak, ValRise(tcfg.val_rise_patience),
        LossSpikes(tcfg.spike_window, tcfg.spike_zscore), MetricsLog(stage.dir / METRICS, accelerator.is_main_process),
    )  # fmt: skip


def checkpoint_layers(model: Any) -> None:
    """Gradient checkpointing of each decoder layer, as transformers does it for the family (its layers, the
    classes of `_no_split_modules`, are the checkpointed blocks); a family without it is refused with the fix."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ForgeError(
            f"train.gradient_checkpointing=true: {type(model).__name__} has no gradient checkpointing in "
            "transformers; set train.gradient_checkpointing=false (forge plan shows the memory without it)"
        )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def prepare(model: torch.nn.Module, tcfg: TrainConfig, accelerator, precision: str):
    """The model and optimizer to train and whether the model is sharded: FSDP2 over the processes, or handed to
    Accelerate (DDP, device placement, autocast). The optimizer goes to Accelerate either way (fp16 loss scaling)."""
    if use_fsdp(tcfg, accelerator.num_processes, precision):
        shard(model, accelerator.device.type, precision)  # first: the optimizer must hold the sharded parameters
        return model, accelerator.prepare(make_optimizer(model, tcfg, accelerator.device)), True
    model, optimizer = accelerator.prepare(model, make_optimizer(model, tcfg, accelerator.device))
    return model, optimizer, False


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
