"""Live red flags of a pretraining run, checked as it trains.

    ValRise     validation perplexity above its minimum for `patience` consecutive evaluations: the learning rate
                is too high or the corpus too small (the model has started to memorise it). Warn, and optionally
                stop early: the best checkpoint is kept and exported.
    LossSpikes  a train loss more than `zscore` standard deviations above the mean of the last `window` losses
                (the check OLMo's stability monitor makes). Spikes are logged and counted, not fatal.
    non-finite  a NaN or infinite loss or gradient norm stops the run before the optimizer step, so the weights
                of the last checkpoint stay the last good ones (`check_finite` raises `Diverged`).

Each monitor's state is a small JSON-able dict saved in every checkpoint, so a resumed run raises the same flags
at the same steps as an uninterrupted one.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from forge import ForgeError


class Diverged(ForgeError):
    """The loss or gradient norm became NaN/inf: the run stopped before the bad update was applied."""


def check_finite(step: int, loss: float, grad_norm: float | None, last_good: str | None, lr: float) -> None:
    bad = [f"{name} is {value}" for name, value in (("loss", loss), ("grad norm", grad_norm))
           if value is not None and not math.isfinite(value)]  # fmt: skip
    if bad:
        kept = f"the last good checkpoint is {last_good}" if last_good else "no checkpoint was written yet"
        raise Diverged(
            f"training diverged at step {step}: {' and '.join(bad)} (lr {lr:.3g}); stopped before the update, "
            f"{kept}. Lower train.lr, raise train.warmup_steps or set train.grad_clip, then re-run with --force"
        )


class ValRise:
    """Counts consecutive evaluations whose loss is above the best one; flags at `patience`."""

    def __init__(self, patience: int):
        self.patience = patience
        self.best = math.inf
        self.best_step = -1
        self.rising = 0  # consecutive evaluations above the minimum
        self.flagged_at: list[int] = []

    def update(self, step: int, val_loss: float) -> str | None:
        """Record an evaluation; return a warning when the flag is raised (once per rise)."""
        if val_loss < self.best:
            self.best, self.best_step, self.rising = val_loss, step, 0
            return None
        self.rising += 1
        if self.rising == self.patience:
            self.flagged_at.append(step)
            return (
                f"red flag: val perplexity {math.exp(min(val_loss, 700)):.4g} has stayed above its minimum "
                f"{math.exp(min(self.best, 700)):.4g} (step {self.best_step}) for {self.rising} evaluations: the "
                "learning rate is too high or the corpus too small (lower train.lr, add data or train fewer steps)"
            )
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "rising": self.rising, "flagged_at": self.flagged_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_step = float(state["best"]), int(state["best_step"])
        self.rising, self.flagged_at = int(state["rising"]), list(state["flagged_at"])


class LossSpikes:
    """z-score of each train loss against the previous `window` losses; spikes stay out of the window."""

    def __init__(self, window: int, zscore: float):
        self.window, self.zscore = window, zscore
        self.history: deque[float] = deque(maxlen=window)
        self.spikes: list[int] = []

    def update(self, step: int, loss: float) -> str | None:
        message = None
        if len(self.history) >= self.window // 2:
            n = len(self.history)
            mean = sum(self.history) / n
            std = math.sqrt(sum((x - mean) ** 2 for x in self.history) / max(n - 1, 1))
            z = (loss - mean) / std if std > 0 else 0.0
            if z > self.zscore:
                self.spikes.append(step)
                message = (
                    f"red flag: loss spike at step {step}: {loss:.4f} is {z:.1f} standard deviations above the mean "
                    f"{mean:.4f} of the last {n} steps (spikes so far: {len(self.spikes)})"
                )
                return message
        self.history.append(loss)
        return message

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "spikes": self.spikes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = deque(state["history"], maxlen=self.window)
        self.spikes = list(state["spikes"])
