"""Paragraph dedup, exact and bounded in memory: sorted runs of paragraph hashes on disk.

The decision is dedup.ParagraphDeduper's (the in-memory reference): the documents are written in a fixed order
(`forge data`: test, then val, then train, each in row order), and a paragraph of >= min_chars whose normalised
hash is in an EARLIER document is removed; repeats inside one document stay. The set-based version keeps every
hash in RAM (~70 B each: ~10 GB at 100M paragraphs). Here:

  1. add(): one pass over the documents to be written numbers each long paragraph's occurrence and its document
     in write order, and buffers (hash, document, occurrence); a full buffer is sorted by (hash, document) and
     saved as a run file.
  2. finish(): the hashes are cut into P ranges, P = ceil(entries x 24 B / memory), chosen once the count is
     known: a range is found in every run by binary search (each run is sorted by hash), so no repartitioning.
     Per range: the first document of each hash (the first of each run, then of those), then every occurrence
     in a later document is a removal. Removals are kept as occurrence numbers, in buckets of `memory / 8`
     consecutive numbers, so a bucket never holds more than that, whatever the skew.
  3. apply(): the write pass numbers the paragraphs the same way and reads the bucket it is in, sorted.

Memory: a few buffers of `memory` bytes (the run buffer and its sort, one hash range, one bucket), whatever the
corpus; a paragraph repeated in a million documents costs one entry per run in its range, not a million.
Not a Bloom filter: a false positive would remove a paragraph seen nowhere else (lost text), and an exact answer
needs every hash anyway; on disk the hashes cost 24 B each, written once and read twice (in runs x ranges slices:
(entries / 2.8M)^2 reads at the default 64 MB, ~130k at a billion paragraphs).

    dedup = ParagraphDedup(min_chars=50, work=Path(".work/paragraphs"))
    for stream, text in documents_in_row_order:   # stream: 0 (test), 1 (val), 2 (train)
        dedup.add(stream, text)
    dedup.finish()
    for stream in (0, 1, 2):                       # the same documents, in the same order within each stream
        text, cut = dedup.apply(stream, text)
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np

from pretrain.data.dedup import PARAGRAPH_BREAK, exact_hash

ENTRY = np.dtype([("hash", "<u8"), ("doc", "<u8"), ("occ", "<u8")])
STREAM_SHIFT = 40  # document and occurrence numbers are (stream << 40) | count: write order across streams
MEMORY = 64 << 20  # bytes per buffer (run, hash range, removal bucket)


def is_long(paragraph: str, min_chars: int) -> bool:
    return len(paragraph.strip()) >= min_chars


class ParagraphDedup:
    def __init__(self, min_chars: int, work: Path, memory: int = MEMORY):
        self.min_chars, self.work = min_chars, work
        self.capacity = max(1, memory // ENTRY.itemsize)  # entries per run
        self.bucket = max(1, memory // 8)  # occurrence numbers per removal bucket
        self.memory = memory
        shutil.rmtree(work, ignore_errors=True)  # what an attempt that did not finish left (buckets are appended to)
        work.mkdir(parents=True)
        self._buffer = np.empty(self.capacity, dtype=ENTRY)
        self._filled = 0
        self._runs: list[Path] = []
        self._docs: dict[int, int] = {}  # stream -> documents added
        self._added: dict[int, int] = {}  # stream -> long paragraphs added
        self._applied: dict[int, int] = {}  # stream -> long paragraphs numbered by apply()
        self._loaded: tuple[tuple[int, int], np.ndarray] | None = None  # ((stream, bucket), its sorted removals)

    # ------------------------------------------------------------------------------------------------------------
    # 1. the hashes, in runs sorted by (hash, document)

    def add(self, stream: int, text: str) -> None:
        hashes = [exact_hash(p) for p in PARAGRAPH_BREAK.split(text) if is_long(p, self.min_chars)]
        doc = (stream << STREAM_SHIFT) | self._docs.get(stream, 0)
        self._docs[stream] = self._docs.get(stream, 0) + 1
        first = (stream << STREAM_SHIFT) | self._added.get(stream, 0)
        self._added[stream] = self._added.get(stream, 0) + len(hashes)
        values, done = np.array(hashes, dtype=np.uint64), 0
        while done < len(values):  # a document longer than the buffer fills several runs
            take = min(len(values) - done, self.capacity - self._filled)
            part = self._buffer[self._filled : self._filled + take]
            part["hash"], part["doc"] = values[done : done + take], doc
            part["occ"] = first + np.arange(done, done + take, dtype=np.uint64)
            self._filled += take
            done += take
            if self._filled == self.capacity:
                self._save_run()

    def _save_run(self) -> None:
        if self._filled:
            run = self._buffer[: self._filled]
            path = self.work / f"run-{len(self._runs):06d}.bin"
            run[np.lexsort((run["doc"], run["hash"]))].tofile(path)
            self._runs.append(path)
            self._filled = 0

    # ------------------------------------------------------------------------------------------------------------
    # 2. per hash range: the first document of each hash, and the occurrences in later documents

    def finish(self) -> None:
        self._save_run()
        self._buffer = np.empty(0, dtype=ENTRY)
        total = sum(path.stat().st_size for path in self._runs) // ENTRY.itemsize
        ranges = max(1, math.ceil(total * ENTRY.itemsize / self.memory))
        edges = np.array([(r << 64) // ranges for r in range(1, ranges)], dtype=np.uint64)
        cuts = [self._cuts(path, edges) for path in self._runs]
        removals = _Removals(self.work, self.bucket, self.capacity)
        for r in range(ranges):
            slices = [(path, int(c[r]), int(c[r + 1])) for path, c in zip(self._runs, cuts, strict=True)]
            hashes, docs = _first_documents(slices)
            for piece in map(_read, slices):
                later = piece["doc"] > docs[np.searchsorted(hashes, piece["hash"])]
                removals.add(piece["occ"][later])
        removals.flush()
        for path in self._runs:
            path.unlink()

    @staticmethod
    def _cuts(path: Path, edges: np.ndarray) -> np.ndarray:
        """Where each hash range starts and ends in a run (binary search on the mapped file)."""
        hashes = np.memmap(path, dtype=ENTRY, mode="r")["hash"]
        return np.concatenate([[0], np.searchsorted(hashes, edges), [len(hashes)]])

    # ------------------------------------------------------------------------------------------------------------
    # 3. the write pass

    def apply(self, stream: int, text: str) -> tuple[str, int]:
        """(text without the paragraphs an earlier document holds, characters removed): ParagraphDeduper.apply."""
        kept, removed = [], 0
        for para in PARAGRAPH_BREAK.split(text):
            if is_long(para, self.min_chars):
                number = self._applied.get(stream, 0)
                self._applied[stream] = number + 1
                if self._is_removed(stream, number):
                    removed += len(para)
                    continue
            kept.append(para)
        return "\n\n".join(kept).strip(), removed

    def _is_removed(self, stream: int, number: int) -> bool:
        if number >= self._added.get(stream, 0):
            raise RuntimeError(f"paragraph dedup: stream {stream} was given more documents to apply than to add")
        key = (stream, number // self.bucket)
        if self._loaded is None or self._loaded[0] != key:
            path = _bucket_path(self.work, *key)
            self._loaded = key, np.sort(np.fromfile(path, dtype=np.uint64)) if path.exists() else np.zeros(0, "u8")
        occ = np.uint64((stream << STREAM_SHIFT) | number)
        bucket = self._loaded[1]
        at = np.searchsorted(bucket, occ)
        return bool(at < len(bucket) and bucket[at] == occ)

    def check_applied(self) -> None:
        """Every document added was applied: the write pass numbered the paragraphs as the hash pass did."""
        if self._applied != {s: n for s, n in self._added.items() if n}:
            raise RuntimeError(f"paragraph dedup: {self._added} paragraphs added but {self._applied} applied")

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def _read(piece: tuple[Path, int, int]) -> np.ndarray:
    path, lo, hi = piece
    return np.fromfile(path, dtype=ENTRY, count=hi - lo, offset=lo * ENTRY.itemsize)


def _first_documents(slices: list[tuple[Path, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct hashes of a range, the first document holding each), reading one run's slice at a time."""
    firsts = [_first_of_each_hash(_read(piece)) for piece in slices]
    merged = np.concatenate(firsts) if firsts else np.zeros(0, dtype=ENTRY)
    first = _first_of_each_hash(merged[np.lexsort((merged["doc"], merged["hash"]))])
    return first["hash"], first["doc"]


def _first_of_each_hash(entries: np.ndarray) -> np.ndarray:
    """The first entry of each run of equal hashes (entries sorted by hash, then document)."""
    new = np.ones(len(entries), dtype=bool)
    new[1:] = entries["hash"][1:] != entries["hash"][:-1]
    return entries[new]


def _bucket_path(work: Path, stream: int, bucket: int) -> Path:
    return work / f"removed-{stream}-{bucket:06d}.bin"


class _Removals:
    """Occurrence numbers to remove, appended to their bucket file (unsorted within it) a buffer at a time."""

    def __init__(self, work: Path, bucket: int, capacity: int):
        self.work, self.bucket, self.capacity = work, bucket, capacity
        self._parts: list[np.ndarray] = []
        self._held = 0

    def add(self, occurrences: np.ndarray) -> None:
        self._parts.append(occurrences)
        self._held += len(occurrences)
        if self._held >= self.capacity:
            self.flush()

    def flush(self) -> None:
        if not self._held:
            return
        occ = np.sort(np.concatenate(self._parts))
        stream = occ >> np.uint64(STREAM_SHIFT)
        number = occ & np.uint64((1 << STREAM_SHIFT) - 1)
        key = (stream << np.uint64(STREAM_SHIFT)) | (number // np.uint64(self.bucket))  # sorted: a bucket is one run
        starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
        for lo, hi in zip(starts, [*starts[1:], len(occ)], strict=True):
            path = _bucket_path(self.work, int(stream[lo]), int(number[lo]) // self.bucket)
            with open(path, "ab") as fh:
                occ[lo:hi].tofile(fh)
        self._parts, self._held = [], 0
