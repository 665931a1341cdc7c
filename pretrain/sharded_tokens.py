"""Several token shards read as one flat token array, without copying the split into RAM.

    tokens = ShardedTokens([np.memmap(...), np.memmap(...)], np.uint16)
    len(tokens); tokens[s : s + window]; tokens[i]; np.asarray(tokens[a:b], dtype=np.int64)

Each shard stays what it was (a read-only memory map). A slice inside one shard is a view of it; a slice across a
shard border is a copy of that slice only, so its values are exactly those of the concatenated array's slice.
`np.asarray(tokens)` of the whole split copies it: the one way to get it into RAM, asked for explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class ShardedTokens:
    """A read-only 1-D array made of `parts` end to end: len, shape, dtype, integer, slice and integer-array
    indexing, np.asarray. What the users of `load_split` do with a split's tokens, with the same results."""

    ndim = 1

    def __init__(self, parts: Sequence[np.ndarray], dtype: np.dtype | type):
        self.dtype = np.dtype(dtype)
        self.parts = [part for part in parts if len(part)]  # empty shards hold no index: searchsorted skips them
        self.starts = np.cumsum([0, *(len(part) for part in self.parts)], dtype=np.int64)  # starts[-1] == len

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __repr__(self) -> str:
        return f"ShardedTokens({len(self):,} tokens, {self.dtype.name}, {len(self.parts)} non-empty shards)"

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                return self._span(start, stop)
            return self.take(np.arange(start, stop, step, dtype=np.int64))
        if isinstance(key, int | np.integer):
            index = int(key) + len(self) if key < 0 else int(key)
            if not 0 <= index < len(self):
                raise IndexError(f"index {int(key)} is out of bounds for {len(self):,} tokens")
            part = int(np.searchsorted(self.starts, index, side="right")) - 1
            return self.parts[part][index - self.starts[part]]
        indices = np.asarray(key)
        if indices.dtype.kind in "iu":
            return self.take(indices)
        raise TypeError(f"ShardedTokens takes an integer, a slice or an integer array, not {type(key).__name__}")

    def _span(self, start: int, stop: int) -> np.ndarray:
        """tokens[start:stop] for 0 <= start, stop <= len: a view inside one shard, else a copy of the span."""
        if start >= stop:
            return np.zeros(0, dtype=self.dtype)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        last = int(np.searchsorted(self.starts, stop, side="left")) - 1  # the shard holding stop - 1
        if first == last:
            base = self.starts[first]
            return self.parts[first][start - base : stop - base]
        pieces = [
            self.parts[i][max(start - self.starts[i], 0) : min(stop, self.starts[i + 1]) - self.starts[i]]
            for i in range(first, last + 1)
        ]
        return np.concatenate(pieces)

    def take(self, indices: np.ndarray) -> np.ndarray:
        """tokens[indices] for an integer array (negative indices count from the end, as numpy's do)."""
        flat = np.asarray(indices, dtype=np.int64)
        flat = np.where(flat < 0, flat + len(self), flat)
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"an index is out of bounds for {len(self):,} tokens")
        out = np.empty(flat.shape, dtype=self.dtype)
        part_of = np.searchsorted(self.starts, flat, side="right") - 1
        for part in np.unique(part_of):
            mask = part_of == part
            out[mask] = self.parts[part][flat[mask] - self.starts[part]]
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        whole = np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=self.dtype)
        return whole if dtype is None else whole.astype(dtype, copy=False)
