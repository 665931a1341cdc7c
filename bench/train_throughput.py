"""Training throughput: Forge's pretraining loop against a minimal plain-PyTorch loop, same model shape, same batch.

    .venv/bin/python bench/train_throughput.py                                   # the tiny-cpu shape, on CPU
    .venv/bin/python bench/train_throughput.py --config configs/125m.yaml --steps 50 --set train.micro_batch_size=16

The plain loop is the nanoGPT style: one model, AdamW, random windows from a memory-mapped token file, autocast,
backward, clip, step; no framework, no logging. Forge's loop is the real stage (`pretrain.train.run`: Accelerate,
its loader, checkpoint and eval cadence pushed past the end, MLflow logging every `log_every` steps) on the same
synthetic shards. Both build the model with `pretrain.model.build_model`, use the same optimizer settings and the
same precision, and are timed over the same steps after `--warmup` steps; the two alternate `--repeats` times and
the median is reported, because the machine may be shared. Goal: Forge >= 0.95 x plain. On a GPU it also prints
the MFU (goal >= 40% for the 125M config in bf16).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge.config import ForgeConfig, load_config  # noqa: E402
from forge.lineage import MANIFEST  # noqa: E402
from pretrain.hardware import flops_per_token, local_hardware, peak_flops, resolve_precision  # noqa: E402
from pretrain.model import build_model  # noqa: E402
from pretrain.trainer import fused_adamw, lr_factor  # noqa: E402

VOCAB_DEFAULT = 4096


def write_synthetic_tokenizer_stage(tok_dir: Path, vocab: int, train_tokens: int, seed: int) -> None:
    """Random token shards in the token_shards format, and a minimal tokenizer.json, for a run's tokenizer dir."""
    from tokenizers import Tokenizer, models

    shards = tok_dir / "shards"
    shards.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    splits = {}
    for split, n in (("train", train_tokens), ("val", max(train_tokens // 50, 20_000)), ("test", 1000)):
        rng.integers(4, vocab, size=n, dtype=np.int64).astype(dtype).tofile(shards / f"{split}.bin")
        with open(shards / f"{split}.idx", "wb") as fh:
            np.save(fh, np.array([0, n], dtype=np.int64))
        splits[split] = {"file": f"{split}.bin", "index": f"{split}.idx", "documents": 1, "tokens": n}
    meta = {"format": "forge-token-shards/1", "dtype": np.dtype(dtype).name, "vocab_size": vocab, "pad_id": 0,
            "unk_id": 1, "bos_id": 2, "eos_id": 3, "splits": splits}  # fmt: skip
    (shards / "meta.json").write_text(json.dumps(meta))
    specials = {"[PAD]": 0, "[UNK]": 1, "[BOS]": 2, "[EOS]": 3}
    Tokenizer(models.WordLevel(specials, unk_token="[UNK]")).save(str(tok_dir / "tokenizer.json"))
    # a complete tokenizer stage as lineage.require_reads sees it: pretrain refuses to start without one
    (tok_dir / MANIFEST).write_text(json.dumps({"stage": "tokenizer", "status": "complete"}))


# ----------------------------------------------------------------------------------------------------------------
# the two loops


def forge_loop(cfg: ForgeConfig, runs: Path, steps: int, warmup: int, repeat: int) -> float:
    """tokens/s of `pretrain.train.run` over steps warmup..steps (from the per-step times in metrics.jsonl)."""
    from accelerate.state import AcceleratorState

    from pretrain.train import run

    AcceleratorState._reset_state(True)  # a fresh Accelerator per run, as a new process would have
    name = f"forge-{repeat}"
    (runs / name).mkdir()
    os.symlink(runs / "synthetic" / "tokenizer", runs / name / "tokenizer")
    t = cfg.train
    over = steps + 1  # evaluation and checkpoints only at the end, outside the timed steps
    cfg = cfg.model_copy(update={"run_name": name, "train": t.model_copy(
        update={"max_steps": steps, "eval_every": over, "checkpoint_every": over, "eval_batches": 1})})  # fmt: skip
    run(cfg, force=True)
    records = [json.loads(line) for line in (runs / name / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time"] for r in records if "time" in r}
    tokens = (steps - warmup) * t.micro_batch_size * t.grad_accum_steps * cfg.model.context_length
    return tokens / (times[steps] - times[warmup])


def plain_loop(
    cfg: ForgeConfig,
    tokens_path: Path,
    vocab: int,
    steps: int,
    warmup: int,
    device: str,
    compile_backend: str | None = None,
) -> float:
    """The nanoGPT-style loop: tokens/s over steps warmup..steps. compile_backend: the model goes through
    torch.compile with it (bench/gpu_check.py; the compile falls in the warmup steps)."""
    t, m = cfg.train, cfg.model
    torch.manual_seed(cfg.seed)
    data = np.memmap(tokens_path, dtype=np.uint16 if vocab <= 1 << 16 else np.uint32, mode="r")
    model = build_model(m, vocab).to(device)
    model.config.use_cache = False
    model.train()
    if compile_backend:
        model = torch.compile(model, backend=compile_backend)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay}, {"params": other, "weight_decay": 0}],
                            lr=t.lr, betas=(t.beta1, t.beta2), fused=fused_adamw(torch.device(device)))  # fmt: skip
    precision = resolve_precision(t.precision, local_hardware())
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")
    rng = np.random.default_rng(cfg.seed)
    T = m.context_length

    def get_batch():
        ix = rng.integers(0, len(data) - T - 1, size=t.micro_batch_size)
        rows = torch.from_numpy(np.stack([data[i : i + T + 1].astype(np.int64) for i in ix]))
        return rows[:, :-1].to(device, non_blocking=True), rows[:, 1:].to(device, non_blocking=True)

    start = 0.0
    for step in range(steps):
        if step == warmup:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = t.lr * lr_factor(step, t)
        for _ in range(t.grad_accum_steps):
            x, y = get_batch()
            with torch.autocast(device, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logits = model(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1)) / t.grad_accum_steps
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip or math.inf)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the loss is read every step in both loops (Forge checks it for NaN)
    if device == "cuda":
        torch.cuda.synchronize()
    tokens = (steps - warmup) * t.micro_batch_size * t.grad_accum_steps * T
    return tokens / (time.perf_counter() - start)


# ----------------------------------------------------------------------------------------------------------------
# main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/tiny-cpu.yaml")
    parser.add_argument("--set", action="append", default=[], help="config override, e.g. train.micro_batch_size=4")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=None, help="default: model.vocab_size, else 4096")
    args = parser.parse_args()

    import logging

    logging.basicConfig(level=logging.WARNING)
    cfg = load_config(args.config, args.set)
    vocab = args.vocab or cfg.model.vocab_size or VOCAB_DEFAULT
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"vocab_size": vocab})})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = cfg.train
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        os.environ["FORGE_RUNS_DIR"] = str(runs)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        need = 4 * args.steps * t.micro_batch_size * t.grad_accum_steps * (cfg.model.context_length + 1)
        write_synthetic_tokenizer_stage(runs / "synthetic" / "tokenizer", vocab, max(need, 1_000_000), cfg.seed)
        train_bin = runs / "synthetic" / "tokenizer" / "shards" / "train.bin"
        forge, plain = [], []
        for repeat in range(args.repeats):
            plain.append(plain_loop(cfg, train_bin, vocab, args.steps, args.warmup, device))
            forge.append(forge_loop(cfg, runs, args.steps, args.warmup, repeat))
            print(f"repeat {repeat}: plain {plain[-1]:,.0f} tok/s, forge {forge[-1]:,.0f} tok/s", flush=True)
    f, p = statistics.median(forge), statistics.median(plain)
    precision = resolve_precision(t.precision, local_hardware())
    peak = peak_flops(device, precision, cfg)
    fpt = flops_per_token(cfg.model, vocab)
    m = cfg.model
    shape = (f"{m.architecture} h{m.hidden_size} L{m.num_layers} ctx{m.context_length} vocab {vocab}, "
             f"micro {t.micro_batch_size} x accum {t.grad_accum_steps}, {precision} on {device}")  # fmt: skip
    print(f"shape: {shape}")
    print(f"plain PyTorch loop: {p:,.0f} tok/s (MFU {100 * fpt * p / peak:.1f}%)")
    print(f"Forge loop:         {f:,.0f} tok/s (MFU {100 * fpt * f / peak:.1f}%)")
    print(f"ratio Forge / plain: {f / p:.3f} (goal >= 0.95)")


if __name__ == "__main__":
    from results import recorded  # bench/results.py: the output goes to RESULTS.md too

    with recorded(__file__):
        main()
