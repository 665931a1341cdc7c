"""Benchmark: memory per document of Forge's sort-based LSH banding against an in-memory LSH index, and throughput
against core count.

    .venv/bin/python bench/dedup_scale.py                       # 1M documents (memory), 20k texts (throughput)
    .venv/bin/python bench/dedup_scale.py --docs 200000 --texts 5000 --skip-ray

Memory, at --docs synthetic documents (random MinHash signatures, 14 bands x 8 rows, a few planted duplicates;
signatures stand in for documents because the banding never sees text). Each method runs in its own child
process. "held" is what stays allocated once the structure is built, "peak" adds the work's scratch; both per
document. The numpy paths are measured with tracemalloc (numpy reports its buffers to it, so the figure is exact);
the index by RSS growth (tracemalloc would slow its millions of small Python objects several-fold):
  sort:  what `forge data` holds for banding: the [docs, 14] uint64 band keys plus the scratch of
         dedup.candidate_pairs (one band sorted at a time).
  ray:   one partition of the Ray executor's banding (pretrain/data/ray_executor.py): its share of the band rows
         and dedup.bucket_pairs' scratch. Constant in --docs: more documents make more partitions, not bigger ones.
  index: datasketch MinHashLSH(params=(14, 8)) with every document inserted (LeanMinHash), the in-memory index
         a one-machine pipeline keeps (datasketch 2.0; the issue's "about 4 KB per document").
Throughput: --texts synthetic ~2 KB texts through shingling + MinHash + band keys on the process pool `forge data`
uses (passes.parallel_map) with 1 and 2 workers (pool start-up excluded: timed from the first result), and the
banding of --ray-docs documents' keys on Ray with 1 and 2 CPUs (Ray start-up excluded). The load average is
printed: on a machine shared with other work the 2-core speed-up is a floor.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from forge.config import DataConfig, DedupConfig  # noqa: E402
from pretrain.data import dedup, passes  # noqa: E402

CFG = DedupConfig()  # 14 bands x 8 rows, as the data stage runs
CHUNK = 50_000  # signatures generated per step (the stage's workers make them a batch at a time, too)
RAY_TASKS_PER_NODE = 2  # banding tasks a node runs at once: its CPUs (2 here)


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def signatures(lo: int, hi: int) -> np.ndarray:
    """Random uint32 signatures for documents lo..hi-1; every 1000th document copies its predecessor (a duplicate)."""
    rng = np.random.default_rng(lo)
    sigs = rng.integers(0, 2**32, (hi - lo, CFG.bands * CFG.rows), dtype=np.uint64).astype(np.uint32)
    dup = np.arange(1, hi - lo)[(np.arange(lo + 1, hi) % 1000) == 0]
    sigs[dup] = sigs[dup - 1]
    return sigs


# ----------------------------------------------------------------------------------------------------------------
# memory, one method per child process


def memory_sort(n: int) -> dict:
    deduper = dedup.NearDeduper(CFG)
    keys = np.concatenate([deduper.band_keys(signatures(lo, min(lo + CHUNK, n))) for lo in range(0, n, CHUNK)])
    tracemalloc.start()
    start = time.perf_counter()
    pairs = dedup.candidate_pairs(keys)
    seconds = time.perf_counter() - start
    _, scratch = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"held": keys.nbytes, "peak": keys.nbytes + scratch, "pairs": len(pairs), "seconds": seconds}


def memory_ray_partition(n: int) -> dict:
    from pretrain.data.ray_executor import BAND_ROWS_PER_PARTITION

    rows = min(n * CFG.bands, BAND_ROWS_PER_PARTITION)  # one partition's band rows, at most
    rng = np.random.default_rng(0)
    band = rng.integers(0, CFG.bands, rows, dtype=np.int64)
    key = rng.integers(0, 2**63, rows, dtype=np.uint64)
    row = rng.integers(0, n, rows, dtype=np.int64)
    held = band.nbytes + key.nbytes + row.nbytes
    tracemalloc.start()
    start = time.perf_counter()
    dedup.bucket_pairs(band, key, row)
    seconds = time.perf_counter() - start
    _, scratch = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"held": held, "peak": held + scratch, "rows": rows, "seconds": seconds}


def memory_index(n: int) -> dict:
    from datasketch import LeanMinHash, MinHashLSH

    lsh = MinHashLSH(num_perm=CFG.bands * CFG.rows, params=(CFG.bands, CFG.rows))
    base = current_rss()
    start = time.perf_counter()
    for lo in range(0, n, CHUNK):
        sigs = signatures(lo, min(lo + CHUNK, n))
        for i, sig in enumerate(sigs):
            lsh.insert(lo + i, LeanMinHash(seed=1, hashvalues=sig, scheme="affine32"), check_duplication=False)
    seconds = time.perf_counter() - start
    held = current_rss() - base
    return {"held": held, "peak": max(held, peak_rss() - base), "seconds": seconds}


def child(method: str, n: int) -> None:
    fn = {"sort": memory_sort, "ray": memory_ray_partition, "index": memory_index}[method]
    print(json.dumps(fn(n)))


def run_child(method: str, n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", method, "--docs", str(n)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------------------
# throughput against cores


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(30_000)]
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(250, 400))) for _ in range(n)]


def keys_batch(batch: list[str]) -> np.ndarray:
    """What the stage's clean pass computes per batch for dedup: shingles, MinHash, band keys."""
    deduper: dedup.NearDeduper = passes._WORKER["deduper"]
    return deduper.band_keys(deduper.signatures([deduper.shingles(t) for t in batch]))


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the pool's workers, once the pool has closed)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def throughput_pool(docs: list[str], workers: int) -> tuple[float, float]:
    """(docs/s after the first result: the pool's start-up excluded, cores actually got: CPU-s / wall-s)."""
    batches = [docs[i : i + 64] for i in range(0, len(docs), 64)]
    first, done = None, 0
    start, cpu = time.perf_counter(), cpu_seconds()
    for _ in passes.parallel_map(keys_batch, batches, workers, (DataConfig(), 1337)):
        if first is None:
            first = time.perf_counter()
        else:
            done += 64
    end = time.perf_counter()
    return done / (end - first), (cpu_seconds() - cpu) / (end - start)


def throughput_ray(n: int, cpus: int) -> float:
    """Docs/s of the Ray banding of n documents' keys on a local instance of `cpus` CPUs (start-up excluded)."""
    import ray

    from pretrain.data import ray_executor

    deduper = dedup.NearDeduper(CFG)
    keys = np.concatenate([deduper.band_keys(signatures(lo, min(lo + CHUNK, n))) for lo in range(0, n, CHUNK)])
    with ray_executor.session(DataConfig(workers=cpus), cpus) as got:
        ray_executor.candidate_pairs(keys[:1000], cpus=got)  # warm the workers
        start = time.perf_counter()
        pairs = ray_executor.candidate_pairs(keys, cpus=got)
        seconds = time.perf_counter() - start
    assert ray.is_initialized() is False
    assert np.array_equal(pairs, dedup.candidate_pairs(keys)), "Ray banding must give the local pairs"
    return n / seconds


# ----------------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--texts", type=int, default=20_000)
    parser.add_argument("--ray-docs", type=int, default=200_000, help="documents for the Ray banding throughput")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--child", choices=["sort", "ray", "index"])
    args = parser.parse_args()
    if args.child:
        child(args.child, args.docs)
        return

    n = args.docs
    print(f"memory at {n:,} documents (14 bands x 8 rows), each method in its own process ...", flush=True)
    mem = {m: run_child(m, n) for m in ("sort", "ray", "index")}
    part = dict(mem["ray"])
    mem["ray"] = {k: part[k] * RAY_TASKS_PER_NODE for k in ("held", "peak")} | {"seconds": part["seconds"]}
    print(f"\n{'method':<44}{'held B/doc':>12}{'peak B/doc':>12}{'seconds':>10}")
    labels = {"sort": "sort-based banding, one machine", "index": "datasketch MinHashLSH index, one machine",
              "ray": f"Ray banding, per node ({RAY_TASKS_PER_NODE} tasks at once)"}  # fmt: skip
    for m in ("index", "sort", "ray"):
        r = mem[m]
        print(f"{labels[m]:<44}{r['held'] / n:>12.1f}{r['peak'] / n:>12.1f}{r['seconds']:>10.1f}")
    print(f"  Ray: a banding task holds at most {part['rows']:,} band rows whatever the corpus "
          f"({part['peak'] / 2**20:.0f} MiB peak); a node holds {RAY_TASKS_PER_NODE} (its CPUs), so its share "
          f"per document falls as the corpus grows")  # fmt: skip
    ratio = mem["index"]["peak"] / mem["sort"]["peak"]
    held_ratio = mem["index"]["held"] / mem["sort"]["held"]
    print(f"index / sort-based: {held_ratio:.1f}x held, {ratio:.1f}x peak per document; "
          f"index / Ray node: {mem['index']['peak'] / mem['ray']['peak']:.1f}x peak")  # fmt: skip

    print(f"\nthroughput: {args.texts:,} texts (~2 KB) -> shingles + MinHash + band keys, process pool", flush=True)
    docs = texts(args.texts)
    measured = {w: throughput_pool(docs, w) for w in (1, 2)}
    pool = {w: r[0] for w, r in measured.items()}
    got = {w: r[1] for w, r in measured.items()}
    rows = [("pool, MinHash + band keys (docs/s)", pool)]
    if not args.skip_ray:
        print(f"throughput: Ray banding of {args.ray_docs:,} documents' keys, 1 and 2 CPUs", flush=True)
        rows.append(("Ray banding (docs/s)", {c: throughput_ray(args.ray_docs, c) for c in (1, 2)}))
    print(f"\n{'':<36}{'1 core':>10}{'2 cores':>10}{'speed-up':>10}   (load average {os.getloadavg()[0]:.1f})")
    for name, r in rows:
        print(f"{name:<36}{r[1]:>10.0f}{r[2]:>10.0f}{r[2] / r[1]:>9.2f}x")
    print(f"  cores the pool actually got (CPU-s / wall-s, start-up included): {got[1]:.2f} with 1 worker, "
          f"{got[2]:.2f} with 2")  # fmt: skip


if __name__ == "__main__":
    from results import recorded  # bench/results.py: the output goes to RESULTS.md too

    with recorded(__file__):
        main()
