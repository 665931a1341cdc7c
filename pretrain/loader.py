"""The pretraining data loader: windows of `context_length + 1` tokens cut from a memory-mapped token shard.

The train split is cut into non-overlapping windows; every epoch visits all of them in a fresh random order,
starting from a random phase (so window borders move between epochs). The order is a pure function of
(seed, epoch), so the loader's whole state is one integer, the number of windows served so far: resuming a
run is `loader.load_state_dict(state)` and gives the exact same batches as an uninterrupted run.

Every optimizer step draws one *global* batch of `micro_batch_size * grad_accum_steps * world_size` windows;
process `rank` trains on its own contiguous slice of it, micro-batch by micro-batch. The global batch is the
same whatever the number of processes, which is what makes 1 process x 8 windows and 2 processes x 4 windows
the same training run.

    loader = WindowLoader(tokens, context_length=256, seed=1337)
    for micro in loader.next_step(micro_batch_size=8, grad_accum_steps=4, rank=0, world_size=1):
        x, y = micro          # int64 tensors [8, 256]: inputs and next-token targets
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from forge import ForgeError


class WindowLoader:
    """Random windows of `context_length + 1` tokens over a 1-D token array, resumable by position."""

    def __init__(self, tokens: np.ndarray, context_length: int, seed: int, split: str = "train"):
        self.tokens = tokens
        self.context_length = context_length
        self.window = context_length + 1
        self.seed = seed
        self.position = 0  # windows served so far, across epochs
        if len(tokens) < 2 * self.window:
            raise ForgeError(
                f"the {split} split has {len(tokens):,} tokens, fewer than two windows of model.context_length + 1 = "
                f"{self.window}; add data or lower model.context_length"
            )
        # One window is kept spare so that a random phase in [0, window) never runs past the end.
        self.windows_per_epoch = (len(tokens) - self.window) // self.window
        self._epoch_cache: tuple[int, np.ndarray, int] | None = None

    def _epoch(self, epoch: int) -> tuple[np.ndarray, int]:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            phase = int(rng.integers(0, self.window))
            order = rng.permutation(self.windows_per_epoch)
            self._epoch_cache = (epoch, order, phase)
        return self._epoch_cache[1], self._epoch_cache[2]

    def starts(self, first: int, count: int) -> np.ndarray:
        """Token offsets of windows number first .. first + count - 1 (a pure function of the seed)."""
        out = np.empty(count, dtype=np.int64)
        for i in range(count):
            epoch, index = divmod(first + i, self.windows_per_epoch)
            order, phase = self._epoch(epoch)
            out[i] = phase + int(order[index]) * self.window
        return out

    def batch(self, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.stack([np.asarray(self.tokens[s : s + self.window], dtype=np.int64) for s in starts])
        data = torch.from_numpy(rows)
        return data[:, :-1], data[:, 1:]

    def next_step(
        self, micro_batch_size: int, grad_accum_steps: int, rank: int = 0, world_size: int = 1
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The micro-batches of this process for the next optimizer step; advances the position by a global batch."""
        per_rank = micro_batch_size * grad_accum_steps
        starts = self.starts(self.position + rank * per_rank, per_rank)
        self.position += per_rank * world_size
        return [self.batch(starts[i : i + micro_batch_size]) for i in range(0, per_rank, micro_batch_size)]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "seed": self.seed, "windows_per_epoch": self.windows_per_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["seed"] != self.seed or state["windows_per_epoch"] != self.windows_per_epoch:
            raise ForgeError(
                f"the checkpoint's data position (seed {state['seed']}, {state['windows_per_epoch']} windows per "
                f"epoch) does not fit this data (seed {self.seed}, {self.windows_per_epoch}); re-run with --force"
            )
        self.position = int(state["position"])

    @property
    def epoch(self) -> float:
        return self.position / self.windows_per_epoch


def eval_windows(tokens: np.ndarray, context_length: int, count: int) -> np.ndarray:
    """Start offsets of `count` fixed windows spread evenly over a split (the same at every evaluation)."""
    window = context_length + 1
    if len(tokens) < window:
        raise ForgeError(
            f"the val split has {len(tokens):,} tokens, fewer than one window of model.context_length + 1 = "
            f"{window}; add data, raise data.split.val or lower model.context_length"
        )
    available = len(tokens) // window
    count = min(count, available)
    return (np.linspace(0, available - 1, count).round().astype(np.int64)) * window


IGNORE = -100  # the target cross-entropy skips (torch's default ignore_index)


def iter_eval_batches(
    tokens: np.ndarray, starts: np.ndarray, context_length: int, batch_size: int, rank: int = 0, world_size: int = 1
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This process's share of the eval windows (round-robin), `batch_size` at a time.

    Every process yields the same number of batches: under FSDP each forward gathers the weights with the others,
    so a process that has run out of windows still runs one, a window whose targets are all IGNORE (counted
    nowhere)."""
    window = context_length + 1
    mine = starts[rank::world_size]
    rounds = math.ceil(math.ceil(len(starts) / world_size) / batch_size)  # of the process with the most windows
    for i in range(0, rounds * batch_size, batch_size):
        chunk = mine[i : i + batch_size]
        padding = len(chunk) == 0
        rows = [np.asarray(tokens[s : s + window], dtype=np.int64) for s in (starts[:1] if padding else chunk)]
        data = torch.from_numpy(np.stack(rows))
        yield data[:, :-1], torch.full_like(data[:, 1:], IGNORE) if padding else data[:, 1:]
