"""Token shards: every split of the cleaned corpus encoded once, for a memory-mapped pretraining loader.

Layout under `runs/<run>/tokenizer/shards/`, one token shard per data-stage shard (`<split>-NNNNN.parquet`, the
NNNNN-th of its split in name order):
  <split>-NNNNN.bin   flat token ids, uint16 when the vocabulary has <= 65,536 ids else uint32, little-endian; every
                      document is followed by one EOS id: doc0 EOS doc1 EOS ... docN EOS
  <split>-NNNNN.idx   a .npy int64 array of n_docs + 1 offsets into its .bin: document i is
                      bin[idx[i] : idx[i + 1] - 1] and bin[idx[i + 1] - 1] is its EOS; idx[-1] == len(bin)
  meta.json           dtype, vocab size, special ids and, per split, documents, doc_tokens (the sum of the
                      per-document token counts), tokens (doc_tokens + one EOS per document) and its shards in
                      order, each with its files and counts

A split is its shards end to end: documents in the data stage's order (shards sorted by name, rows in order).
`load_split` reads them as one flat array (pretrain/sharded_tokens.py) and one offset array, exactly what one
`<split>.bin` holding them all would give. A document's text is encoded as plain text: a literal "[EOS]" or
"<|user|>" inside a document stays ordinary bytes, never a control token (transformers:
`tok(text, add_special_tokens=False, split_special_tokens=True)`).

Each data shard is encoded by one worker: in this process (one worker, or a small corpus: the tokenizers thread
pool spreads each batch over the cores), in a process pool (one tokenizers thread per worker, so the pool does
not oversubscribe the cores), or as Ray tasks when data.executor is "ray" (the data stage's session: its cluster,
or a local instance). On Ray the workers read runs/<run>/data/ and write the shards where they are, so on more
than one node runs/ must be on storage every node sees, as for the data stage. The bytes are the same every way.

    tokens, offsets = load_split(shards_dir, "train")   # ShardedTokens, np.ndarray
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from forge import ForgeError
from forge.hashing import sha256_file
from forge.io import atomic_path
from forge.machine import usable_cores
from forge.progress import progress
from pretrain.sharded_tokens import ShardedTokens

if TYPE_CHECKING:
    from forge.config import DataConfig

log = logging.getLogger("forge.tokenizer")

FORMAT = "forge-token-shards/2"
ONE_FILE_FORMAT = "forge-token-shards/1"  # one <split>.bin + <split>.idx per split: still read, as one shard
READ_BATCH_DOCS = 1024  # documents per encode_batch call: enough work for the Rust thread pool, little RAM
# About 8% of encoding is Python on one thread (ids into arrays, the histograms), so the tokenizers thread pool speeds
# up a shard ~1 / (0.08 + 0.92 / cores) times and a process pool ~cores times, less its start (~1.3 s for two
# spawned workers on 2 busy cores). Below this much data (~20 s on one thread) the difference does not repay it.
POOL_MIN_BYTES = 64 << 20


def token_dtype(vocab_size: int) -> np.dtype:
    """Little-endian uint16 when every id fits (vocab_size <= 65,536), else uint32."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def iter_text_batches(shards: list[Path], batch_docs: int = READ_BATCH_DOCS) -> Iterator[list[str]]:
    """Stream the `text` column of parquet shards in order, `batch_docs` documents at a time."""
    for shard in shards:
        parquet = pq.ParquetFile(shard)
        if "text" not in parquet.schema_arrow.names:
            raise ForgeError(f"{shard} has no 'text' column (columns: {parquet.schema_arrow.names}); re-run forge data")
        for batch in parquet.iter_batches(batch_size=batch_docs, columns=["text"]):
            column = batch.column(0)
            if column.null_count:
                raise ForgeError(f"{shard} has {column.null_count} documents with a null text; re-run forge data")
            yield column.to_pylist()


# ----------------------------------------------------------------------------------------------------------------
# encoding one data shard


@dataclass
class SplitStats:
    """What encoding a shard or a split measured: sizes, and token and byte histograms for the compression report.
    Every field but `seconds` is a sum of integers, so a split's stats are its shards' added in any order."""

    documents: int = 0
    doc_tokens: int = 0  # sum of the per-document token counts, separators excluded
    chars: int = 0
    bytes: int = 0
    words: int = 0  # whitespace-separated words (str.split())
    token_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    byte_counts: np.ndarray = field(default_factory=lambda: np.zeros(256, dtype=np.int64))
    seconds: float = 0.0  # encoding time, summed over the workers

    @property
    def tokens(self) -> int:
        """Length of the token array: the documents' tokens plus one EOS per document."""
        return self.doc_tokens + self.documents

    def count_batch(self, texts: list[str], flat: np.ndarray, eos_id: int) -> None:
        """Add one encoded batch: its texts and their tokens, each document followed by its EOS."""
        vocab = len(self.token_counts)
        self.documents += len(texts)
        self.doc_tokens += len(flat) - len(texts)
        self.token_counts += np.bincount(flat, minlength=vocab)[:vocab]
        self.token_counts[eos_id] -= len(texts)  # the histogram counts document tokens, not separators
        joined = "".join(texts)
        self.chars += len(joined)
        raw = joined.encode("utf-8")
        self.bytes += len(raw)
        self.byte_counts += np.bincount(np.frombuffer(raw, dtype=np.uint8), minlength=256)
        self.words += sum(len(t.split()) for t in texts)

    def add(self, other: SplitStats) -> None:
        """Add another shard's stats to these."""
        for name in ("documents", "doc_tokens", "chars", "bytes", "words", "seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.token_counts = self.token_counts + other.token_counts
        self.byte_counts = self.byte_counts + other.byte_counts


def encode_batch(tokenizer: Tokenizer, texts: list[str], dtype: np.dtype, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch's documents as one flat array, each followed by `eos_id`, and each document's end (after its EOS)."""
    encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    flat = np.empty(int(lengths.sum()) + len(texts), dtype=dtype)
    ends = np.cumsum(lengths + 1)
    for encoding, end, length in zip(encodings, ends, lengths, strict=True):
        flat[end - 1 - length : end - 1] = encoding.ids
    flat[ends - 1] = eos_id
    return flat, ends


def encode_shard(tokenizer: Tokenizer, source: Path, out_dir: Path, name: str, eos_id: int,
                 on_batch: Callable[[int], Any] | None = None) -> SplitStats:  # fmt: skip
    """Encode one parquet shard into out_dir/<name>.bin + .idx, streaming; return what was measured.
    `on_batch(documents)` follows the progress."""
    start = time.time()
    vocab = tokenizer.get_vocab_size()
    dtype = token_dtype(vocab)
    stats = SplitStats(token_counts=np.zeros(vocab, dtype=np.int64))
    offsets = [np.zeros(1, dtype=np.int64)]
    with open(out_dir / f"{name}.bin", "wb") as out:
        for texts in iter_text_batches([source]):
            flat, ends = encode_batch(tokenizer, texts, dtype, eos_id)
            out.write(flat.tobytes())
            offsets.append(stats.tokens + ends)
            stats.count_batch(texts, flat, eos_id)
            if on_batch:
                on_batch(len(texts))
    with open(out_dir / f"{name}.idx", "wb") as fh:  # a file handle: np.save would append ".npy" to the name
        np.save(fh, np.concatenate(offsets))
    stats.seconds = time.time() - start
    return stats


# ----------------------------------------------------------------------------------------------------------------
# where the shards are encoded: here, a process pool, or Ray tasks


@dataclass(frozen=True)
class ShardJob:
    """One data shard to encode: the `index`-th shard of `split`, into out_dir/<split>-<index>.{bin,idx}."""

    split: str
    index: int
    source: Path
    out_dir: Path
    size_bytes: int  # uncompressed, all columns, from the parquet footer: to plan the work

    @property
    def name(self) -> str:
        return f"{self.split}-{self.index:05d}"


_WORKER: dict[str, Any] = {}  # a pool or Ray worker's tokenizer, built once per process


def init_encoder(tokenizer_json: str, eos_id: int) -> None:
    """A worker's tokenizer, on one thread: the pool has a worker per core, so one more thread each would
    oversubscribe them (TOKENIZERS_PARALLELISM is read at every encode_batch call; RAYON_NUM_THREADS sizes the
    Rust thread pool should anything start it)."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.encode_special_tokens = True  # document text is plain text, never control tokens
    _WORKER.update(tokenizer_json=tokenizer_json, tokenizer=tokenizer, eos_id=eos_id)


def encode_job(job: ShardJob) -> SplitStats:
    return encode_shard(_WORKER["tokenizer"], job.source, job.out_dir, job.name, _WORKER["eos_id"])


def encode_shard_task(tokenizer_json: str, eos_id: int, job: ShardJob) -> SplitStats:
    """A Ray task. Ray reuses its worker processes: the tokenizer is rebuilt only when it changes."""
    if _WORKER.get("tokenizer_json") != tokenizer_json or _WORKER.get("eos_id") != eos_id:
        init_encoder(tokenizer_json, eos_id)
    return encode_job(job)


Encoded = Iterator[tuple[ShardJob, SplitStats]]  # every job once, in the order they finish


def encode_here(tokenizer: Tokenizer, jobs: list[ShardJob], eos_id: int, bar: Any) -> Encoded:
    for job in jobs:
        yield job, encode_shard(tokenizer, job.source, job.out_dir, job.name, eos_id, on_batch=bar.update)


def encode_in_pool(tokenizer: Tokenizer, jobs: list[ShardJob], eos_id: int, workers: int, bar: Any) -> Encoded:
    """Workers are spawned, not forked: the parent may hold MLflow's threads and the tokenizers thread pool."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=init_encoder,
                               initargs=(tokenizer.to_str(), eos_id))  # fmt: skip
    try:
        pending = {pool.submit(encode_job, job): job for job in jobs}
        for future in as_completed(pending):
            job, stats = pending.pop(future), future.result()
            bar.update(stats.documents)
            yield job, stats
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def encode_on_ray(tokenizer: Tokenizer, jobs: list[ShardJob], eos_id: int, data_cfg: DataConfig, bar: Any) -> Encoded:
    """One Ray task per shard, spread over the nodes, in the data stage's Ray session (data.ray_address)."""
    import ray

    from pretrain.data.ray_executor import session

    with session(data_cfg, data_cfg.workers or usable_cores()) as cpus:  # the CPUs of a local instance
        task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(encode_shard_task)
        tokenizer_ref = ray.put(tokenizer.to_str())
        pending = {task.remote(tokenizer_ref, eos_id, job): job for job in jobs}
        log.info("tokenizer: %d shards as Ray tasks on %d CPUs", len(jobs), cpus)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            job, stats = pending.pop(done[0]), ray.get(done[0])
            bar.update(stats.documents)
            yield job, stats


def pool_size(jobs: list[ShardJob], workers: int | None) -> int:
    """How many processes encode: `workers` when given (1: this one), else one per core when that pays off:
    enough text to repay the workers' start, and no shard so large that the others would wait for it while the
    tokenizers thread pool of this process would have spread it over every core."""
    if workers is not None:
        return max(1, min(workers, len(jobs)))
    workers = min(usable_cores(), len(jobs))
    total = sum(job.size_bytes for job in jobs)
    if workers <= 1 or total < POOL_MIN_BYTES or max(job.size_bytes for job in jobs) * workers > total:
        return 1
    return workers


# ----------------------------------------------------------------------------------------------------------------
# writing every split


def shard_jobs(split_shards: dict[str, list[Path]], out_dir: Path) -> list[ShardJob]:
    """A job per data shard, largest first (the long ones start early; the output order is the shards' own)."""
    jobs = []
    for split, sources in split_shards.items():
        for index, source in enumerate(sources):
            metadata = pq.ParquetFile(source).metadata
            size = sum(metadata.row_group(g).total_byte_size for g in range(metadata.num_row_groups))
            jobs.append(ShardJob(split, index, Path(source), out_dir, size))
    return sorted(jobs, key=lambda job: -job.size_bytes)


def write_shards(
    tokenizer: Tokenizer, split_shards: dict[str, list[Path]], shards_dir: Path, special_ids: dict[str, int],
    workers: int | None = None, data_cfg: DataConfig | None = None,
) -> dict[str, SplitStats]:  # fmt: skip
    """Encode every split into `shards_dir` (written atomically as a whole) and write meta.json.

    `special_ids` maps names ("eos", "pad", "user"...) to ids; meta.json records each as `<name>_id`. `workers`:
    the processes that encode (None: one per core where that pays off, see `pool_size`); `data_cfg`: the run's
    data section, whose executor "ray" encodes on its Ray session instead. The files are the same every way.
    """
    eos_id = special_ids["eos"]
    vocab = tokenizer.get_vocab_size()
    was_encoding_special = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True  # document text is plain text, never control tokens
    try:
        with atomic_path(shards_dir) as tmp:
            tmp.mkdir(parents=True)
            jobs = shard_jobs(split_shards, tmp)
            totals = {split: SplitStats(token_counts=np.zeros(vocab, dtype=np.int64)) for split in split_shards}
            per_shard: dict[ShardJob, dict[str, int]] = {}
            documents = sum(pq.ParquetFile(job.source).metadata.num_rows for job in jobs)
            with progress(total=documents, desc="tokenizer: encode", unit="doc", logger=log) as bar:
                for job, stats in _encoded(tokenizer, jobs, eos_id, workers, data_cfg, bar):
                    totals[job.split].add(stats)
                    per_shard[job] = counts(stats)
            meta = shards_meta(vocab, special_ids, totals, per_shard)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    finally:
        tokenizer.encode_special_tokens = was_encoding_special
    return totals


def _encoded(tokenizer: Tokenizer, jobs: list[ShardJob], eos_id: int, workers: int | None,
             data_cfg: DataConfig | None, bar: Any) -> Encoded:  # fmt: skip
    if data_cfg is not None and data_cfg.executor == "ray":
        return encode_on_ray(tokenizer, jobs, eos_id, data_cfg, bar)
    size = pool_size(jobs, workers)
    log.info("tokenizer: encoding %d shards %s", len(jobs), "here" if size == 1 else f"in {size} processes")
    if size == 1:
        return encode_here(tokenizer, jobs, eos_id, bar)
    return encode_in_pool(tokenizer, jobs, eos_id, size, bar)


def counts(stats: SplitStats) -> dict[str, int]:
    """What meta.json records of a split and of each of its shards."""
    return {"documents": stats.documents, "doc_tokens": stats.doc_tokens, "tokens": stats.tokens}


def shards_meta(vocab: int, special_ids: dict[str, int], totals: dict[str, SplitStats],
                per_shard: dict[ShardJob, dict[str, int]]) -> dict[str, Any]:  # fmt: skip
    """meta.json: the same whatever encoded the shards and in whatever order they finished."""
    ordered = sorted(per_shard.items(), key=lambda item: (item[0].split, item[0].index))
    return {
        "format": FORMAT,
        "dtype": token_dtype(vocab).name,
        "byte_order": "little",
        "vocab_size": vocab,
        **{f"{name}_id": value for name, value in special_ids.items()},
        "separator": "one EOS after every document",
        "index": "<shard>.idx: .npy int64 offsets, n_docs + 1; doc i = bin[idx[i]:idx[i+1]-1], then EOS",
        "splits": {
            split: {
                **counts(total),
                "shards": [
                    {"file": f"{job.name}.bin", "index": f"{job.name}.idx", **shard}
                    for job, shard in ordered
                    if job.split == split
                ],
            }
            for split, total in totals.items()
        },
    }


# ----------------------------------------------------------------------------------------------------------------
# reading


def read_meta(shards_dir: Path) -> dict[str, Any]:
    path = Path(shards_dir) / "meta.json"
    if not path.is_file():
        raise ForgeError(f"{path} not found: run `forge tokenizer` first")
    return json.loads(path.read_text(encoding="utf-8"))


def split_files(shards_dir: Path, split: str) -> list[tuple[Path, Path]]:
    """The split's (tokens, offsets) files in order; a split of the one-file layout is one shard."""
    shards_dir = Path(shards_dir)
    meta = read_meta(shards_dir)
    if meta.get("format") not in (FORMAT, ONE_FILE_FORMAT):
        raise ForgeError(
            f"{shards_dir / 'meta.json'} has format {meta.get('format')!r}, this Forge reads {FORMAT!r}: re-run "
            "forge tokenizer --force"
        )
    if split not in meta["splits"]:
        raise ForgeError(f"no {split!r} token shard in {shards_dir} (splits: {', '.join(meta['splits'])})")
    info = meta["splits"][split]
    shards = info["shards"] if meta["format"] == FORMAT else [info]
    return [(shards_dir / shard["file"], shards_dir / shard["index"]) for shard in shards]


def load_split(shards_dir: Path, split: str) -> tuple[ShardedTokens, np.ndarray]:
    """The split's tokens, its shards memory-mapped end to end as one flat array, and its document offsets
    (see the module docstring)."""
    dtype = np.dtype(read_meta(shards_dir)["dtype"]).newbyteorder("<")
    parts, offsets, position = [], [np.zeros(1, dtype=np.int64)], 0
    for bin_path, idx_path in split_files(shards_dir, split):
        # np.memmap refuses an empty file: an empty shard (an empty split's) gets an empty array instead
        parts.append(np.memmap(bin_path, dtype=dtype, mode="r") if bin_path.stat().st_size else np.zeros(0, dtype))
        offsets.append(np.load(idx_path)[1:] + position)
        position += len(parts[-1])
    return ShardedTokens(parts, dtype), np.concatenate(offsets)


def split_digest(shards_dir: Path, split: str) -> str:
    """A content id of a split's token shards (their names and sha256), for a later stage's skip key."""
    return "\n".join(f"{b.name} {sha256_file(b)} {i.name} {sha256_file(i)}" for b, i in split_files(shards_dir, split))
