"""`forge data` on Ray Data (`data.executor: ray`): the same per-record passes and the same banding rule as the
local process pool, so the output is identical; only where the work runs changes.

    forge data --config run.yaml --executor ray                               # a local Ray instance, data.workers CPUs
    forge data --config run.yaml --executor ray --ray-address HOST:6379       # an existing cluster

  ray_map:         `passes.parallel_map`'s contract (fn over batches, results in input order) on Ray Data. The
                   batches reach the cluster through a Parquet file under runs/<run>/data/.work/, so on more than
                   one node runs/ must be on storage every node sees (as for training checkpoints).
  candidate_pairs: the LSH band keys become (band, key, row) rows, hash-partitioned on (band, key) by a Ray
                   groupby (a distributed shuffle) so every bucket lands whole in one partition; each partition
                   runs `dedup.bucket_pairs`, the function the local path runs one band at a time. No node holds
                   an index: a partition's memory is its share of the band rows (~24 B each).

The driver still streams every record through itself (ingest, the report's counters, the spill files) and keeps
the per-document arrays the dedup decision needs, as the local path does (exact hash, split, the 14 band keys it
hands to the cluster: ~130 B/doc, plus the ids).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import socket
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from forge import ForgeError
from forge.config import DataConfig
from pretrain.data.dedup import bucket_pairs, unique_pairs

log = logging.getLogger("forge.data")

BAND_ROWS_PER_PARTITION = 2_000_000  # band rows (32 B each) per banding task, whatever the corpus size
BATCHES_PER_ROW_GROUP = 8  # pool batches per Parquet row group of the pass input (Ray reads by row group)


@contextlib.contextmanager
def session(cfg: DataConfig, workers: int) -> Iterator[int]:
    """Connect to data.ray_address or start a local instance of `workers` CPUs; yields the CPUs to use."""
    try:
        import ray
    except ImportError:
        raise ForgeError(
            "data.executor=ray needs Ray, an optional part of Forge: pip install 'forge-slm[ray]' (in a checkout: "
            "pip install -e '.[ray]'), or set data.executor=local"
        ) from None
    if ray.is_initialized():  # a caller (a notebook, a bench) already connected: use that, leave it running
        yield _configure(ray, cfg, workers)
        return
    if cfg.ray_address and not _reachable(cfg.ray_address):  # ray.init would retry for minutes
        raise ForgeError(
            f"data.ray_address={cfg.ray_address!r}: nothing answers there; start the cluster (ray start --head) "
            "or fix the address (HOST:6379 or ray://HOST:10001), or leave it unset for a local instance"
        )
    try:
        if cfg.ray_address:
            ray.init(address=cfg.ray_address, log_to_driver=False, logging_level=logging.WARNING)
        else:
            # address="local": a new instance even where `ray start` left a cluster recorded under /tmp/ray, which
            # a bare ray.init() would join (and refuse num_cpus there)
            ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as exc:
        if not cfg.ray_address:
            raise ForgeError(f"data.executor=ray: a local Ray instance did not start ({exc}); set data.ray_address "
                             "to a running cluster or use data.executor=local") from None  # fmt: skip
        raise ForgeError(
            f"data.ray_address={cfg.ray_address!r}: cannot connect to Ray ({exc}); give a running cluster's "
            f"address (HOST:6379 or ray://HOST:10001) or leave it unset for a local instance{_auth_hint()}"
        ) from None
    try:
        yield _configure(ray, cfg, workers)
    finally:
        ray.shutdown()  # disconnects from a cluster; stops a local instance this run started


def _auth_hint() -> str:
    """The likeliest cause when a cluster that answers refuses this process: Ray turns token authentication on for
    a cluster whose head finds a token (~/.ray/auth_token, which any local ray.init writes), and a client must
    then turn it on itself; Ray's own error says only "failed to connect"."""
    if os.environ.get("RAY_AUTH_MODE"):
        return ""
    return ("; a cluster with token authentication (`ray start` turns it on where ~/.ray/auth_token exists) "
            "needs RAY_AUTH_MODE=token here too, with its token in ~/.ray/auth_token or RAY_AUTH_TOKEN")  # fmt: skip


def _reachable(address: str, timeout: float = 10.0) -> bool:
    """Whether HOST:PORT (or ray://HOST:PORT) accepts a TCP connection; other forms ("auto") are left to Ray."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return True
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
        return True
    except OSError:
        return False


def _configure(ray: Any, cfg: DataConfig, workers: int) -> int:
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # results in input order: same rows, tie-breaks, identical output
    ctx.enable_progress_bars = False
    # the sort-based shuffle: no long-lived aggregator actors (the default's) holding CPUs on a small instance
    ctx.shuffle_strategy = ray.data.context.ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    # the V1 Parquet reader splits the pass input into override_num_blocks blocks, one map task each; Ray 2.60's
    # V2 reader reads the file in one task with the map fused into it: one task per pass, on one node
    ctx.use_datasource_v2 = False
    cpus = max(1, int(ray.cluster_resources().get("CPU", workers)))
    log.info("data: Ray %s, %d CPUs", cfg.ray_address or "local instance", cpus)
    return cpus


# ----------------------------------------------------------------------------------------------------------------
# the per-record passes


def _run_batches(table: pa.Table, fn: Callable[[Any], Any], initargs: tuple) -> pa.Table:
    """A Ray Data task: one worker's settings (passes.init_worker), then fn over the pickled batches. Tasks, not
    actors: an actor holds its CPU for the whole pass and starves the read tasks on a small instance. Pickle only
    travels between this run's own processes."""
    from pretrain.data.passes import init_worker

    init_worker(*initargs)  # cheap (the sketch table arrives zero-copy from the object store)
    out = [pickle.dumps(fn(pickle.loads(b)), protocol=5) for b in table.column("batch").to_pylist()]
    return pa.table({"result": pa.array(out, type=pa.large_binary())})


def ray_map(fn: Callable[[Any], Any], batches: Iterable[Any], cpus: int, initargs: tuple, work: Path) -> Iterator[Any]:
    """fn over batches on Ray Data, results in input order (passes.parallel_map's contract)."""
    import ray

    path = work / f"ray-{fn.__name__}.parquet"
    schema = pa.schema([("batch", pa.large_binary())])
    blocks = 0
    with pq.ParquetWriter(path, schema) as writer:
        group: list[bytes] = []
        for batch in batches:
            group.append(pickle.dumps(batch, protocol=5))
            if len(group) >= BATCHES_PER_ROW_GROUP:
                writer.write_table(pa.table({"batch": group}, schema=schema))
                blocks += 1
                group = []
        if group:
            writer.write_table(pa.table({"batch": group}, schema=schema))
            blocks += 1
    ds = ray.data.read_parquet(str(path), override_num_blocks=max(blocks, 1)).map_batches(
        _run_batches, fn_kwargs={"fn": fn, "initargs": initargs}, batch_size=None, batch_format="pyarrow"
    )
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            for blob in batch.column("result").to_pylist():
                yield pickle.loads(blob)
    finally:
        path.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------------------------
# LSH banding as a distributed shuffle


def _band_rows(table: pa.Table, partitions: int) -> pa.Table:
    """Documents' band keys -> one row per (document, band), with the hash partition of its bucket."""
    rows = table.column("row").to_numpy()
    keys = np.stack([table.column(c).to_numpy() for c in table.column_names if c != "row"], axis=1)
    bands = np.broadcast_to(np.arange(keys.shape[1], dtype=np.int64), keys.shape).ravel()
    flat = keys.ravel()
    part = ((flat ^ bands.astype(np.uint64)) % np.uint64(partitions)).astype(np.int64)
    return pa.table({"part": part, "band": bands, "key": flat, "row": np.repeat(rows, keys.shape[1])})


def _partition_pairs(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    pairs = bucket_pairs(batch["band"], batch["key"], batch["row"])
    return {"i": pairs[:, 0], "j": pairs[:, 1]}


def candidate_pairs(keys: np.ndarray, allowed: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
                    cpus: int = 2) -> np.ndarray:  # fmt: skip
    """dedup.candidate_pairs on Ray: the same pairs, in the same order."""
    import ray

    n, bands = keys.shape
    if n < 2:
        return np.zeros((0, 2), dtype=np.int64)
    partitions = max(2 * cpus, math.ceil(n * bands / BAND_ROWS_PER_PARTITION))
    chunk = max(1, BAND_ROWS_PER_PARTITION // bands)
    tables = [
        pa.table({"row": np.arange(lo, min(lo + chunk, n), dtype=np.int64),
                  **{f"k{b}": keys[lo : lo + chunk, b] for b in range(bands)}})
        for lo in range(0, n, chunk)
    ]  # fmt: skip
    ds = (
        ray.data.from_arrow(tables)
        .map_batches(_band_rows, fn_kwargs={"partitions": partitions}, batch_format="pyarrow", batch_size=None)
        .groupby("part", num_partitions=partitions)
        .map_groups(_partition_pairs, batch_format="numpy")
    )
    found = [np.stack([b["i"], b["j"]], axis=1) for b in ds.iter_batches(batch_format="numpy", batch_size=None)]
    return unique_pairs(found, allowed)
