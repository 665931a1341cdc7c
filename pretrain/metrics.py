"""The pretrain stage's metrics log and its plot.

    metrics.jsonl     one line per step (loss, lr, grad norm) and per evaluation (val loss, perplexity), appended
                      by the main process as the run goes; a resumed run first drops the lines past its checkpoint
    loss_curves.png   train and val loss, and the learning rate, against the step

Both are the main process's alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any

from forge import render
from forge.io import atomic_write_jsonl, read_jsonl

METRICS = "metrics.jsonl"
CURVES = "loss_curves.png"


class MetricsLog:
    """metrics.jsonl, appended to while open (`with log:`) on the main process; on the others, writing does nothing.
    Opened late on purpose: a resumed run cuts the file back to its checkpoint first."""

    def __init__(self, path: Path, main: bool):
        self.path, self.main = path, main
        self.file: IO[str] | None = None

    def __enter__(self) -> MetricsLog:
        if self.main:
            self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by __exit__
        return self

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()  # a killed run keeps every step it logged

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def read_records(path: Path) -> list[dict[str, Any]]:
    """The metrics log, without a torn last line (a killed run may leave one)."""
    return read_jsonl(path)


def keep_records_until(path: Path, step: int) -> None:
    """Drop the lines past `step`: a resumed run logs those steps again."""
    atomic_write_jsonl(path, [r for r in read_records(path) if r["step"] <= step])


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
