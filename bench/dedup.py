"""Benchmark: Forge's near-duplicate detection against a plain datasketch baseline, on the same generated corpus.

    .venv/bin/python bench/dedup.py               # 20,000 documents (~2 KB each), both methods, one process each
    .venv/bin/python bench/dedup.py --docs 50000

Corpus: random-word documents (80-500 words); a quarter of them get a near-duplicate made by random word
substitutions, insertions and deletions, and the true Jaccard of every planted pair (word 5-gram sets) is computed.
  forge:    numpy MinHash (14 bands x 8 rows, multiply-shift hashing of 32-bit n-gram hashes, batched), sort-based
            LSH, candidates verified at J >= 0.8, union-find (pretrain/data/dedup.py, as the data stage runs it).
  baseline: datasketch MinHash(num_perm=128) fed one 5-gram at a time with `update`, MinHashLSH(threshold=0.8):
            query, then insert, per document (the usage of datasketch's README).
  tuned:    datasketch at its best documented usage: `MinHash.bulk` (signatures of many documents in one call) with
            Forge's 14 bands x 8 rows (num_perm=112, MinHashLSH(params=(14, 8))), query then insert.
Each method runs in its own child process (same seed, same corpus) so peak RSS is measured per method. Neither
datasketch variant verifies its candidates (datasketch has no such step); Forge drops those below J 0.8.
Recall = planted pairs found / planted pairs, per true-Jaccard bucket; "false merges" = merged pairs with J < 0.5.
Goal: forge >= 5x the plain baseline's docs/s at higher recall; the tuned row shows how much of that is usage.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from forge.config import DedupConfig  # noqa: E402
from pretrain.data import dedup  # noqa: E402

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def make_corpus(n_docs: int, seed: int = 0) -> tuple[list[str], list[tuple[int, int, float]]]:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 9))) for _ in range(30_000)]
    n_dups = n_docs // 4
    bases = [[rng.choice(vocab) for _ in range(rng.randint(80, 500))] for _ in range(n_docs - n_dups)]
    docs = [" ".join(b) for b in bases]
    planted = []
    for k in range(n_dups):
        words = list(bases[k])
        for _ in range(int(len(words) * 0.04 * rng.random())):
            pos = rng.randrange(len(words))
            op = rng.random()
            if op < 0.4:
                words[pos] = rng.choice(vocab)
            elif op < 0.7:
                words.insert(pos, rng.choice(vocab))
            else:
                del words[pos]
        docs.append(" ".join(words))
        planted.append((k, len(docs) - 1))
    order = list(range(len(docs)))
    rng.shuffle(order)  # duplicates are not next to their originals
    where = {old: new for new, old in enumerate(order)}
    docs = [docs[i] for i in order]
    pairs = [(where[a], where[b]) for a, b in planted]
    truth = [(a, b, dedup.jaccard(dedup.shingles(docs[a], 5), dedup.shingles(docs[b], 5))) for a, b in pairs]
    return docs, truth


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------------------------------------------------
# the two methods: each returns the set of document pairs it would merge


def run_forge(docs: list[str]) -> set[tuple[int, int]]:
    cfg = DedupConfig()  # 14 x 8, J >= 0.8, 5-grams
    deduper = dedup.NearDeduper(cfg)
    keys = []
    for lo in range(0, len(docs), 256):  # batches, as the stage's workers do
        batch = docs[lo : lo + 256]
        keys.append(deduper.band_keys(deduper.signatures([deduper.shingles(t) for t in batch])))
    pairs = dedup.candidate_pairs(np.concatenate(keys))
    # the stage re-reads candidates' text to verify; here they are in memory, their n-grams recomputed the same way
    sets = {i: deduper.shingles(docs[i]) for i in np.unique(pairs).tolist()}
    labels, _ = dedup.verified_clusters(len(docs), pairs, lambda i, j: dedup.jaccard(sets[i], sets[j]),
                                        cfg.jaccard_threshold)  # fmt: skip
    return {(i, j) for i, j in pairs.tolist() if labels[i] == labels[j]}


def run_baseline(docs: list[str]) -> set[tuple[int, int]]:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    merged = set()
    for i, text in enumerate(docs):
        words = dedup.normalized_words(text)
        m = MinHash(num_perm=128)
        for k in range(max(len(words) - 4, 1)):
            m.update(" ".join(words[k : k + 5]).encode())
        for j in lsh.query(m):
            merged.add((min(i, j), max(i, j)))
        lsh.insert(i, m)
    return merged


def run_tuned(docs: list[str]) -> set[tuple[int, int]]:
    from datasketch import MinHash, MinHashLSH

    cfg = DedupConfig()
    num_perm = cfg.bands * cfg.rows
    lsh = MinHashLSH(num_perm=num_perm, params=(cfg.bands, cfg.rows))
    grams = []
    for text in docs:
        words = dedup.normalized_words(text)
        grams.append([" ".join(words[k : k + 5]).encode() for k in range(max(len(words) - 4, 1))])
    merged = set()
    for i, m in enumerate(MinHash.bulk(grams, num_perm=num_perm)):
        for j in lsh.query(m):
            merged.add((min(i, j), max(i, j)))
        lsh.insert(i, m)
    return merged


METHODS = {"forge": run_forge, "baseline": run_baseline, "tuned": run_tuned}


def child(method: str, n_docs: int) -> None:
    docs, truth = make_corpus(n_docs)
    base_rss = rss_mb()
    start, cpu_start = time.perf_counter(), time.process_time()
    merged = METHODS[method](docs)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    found = {(min(a, b), max(a, b)) for a, b, _ in truth} & merged
    js = {(min(a, b), max(a, b)): j for a, b, j in truth}
    result = {
        "method": method, "docs": len(docs), "seconds": seconds, "docs_per_s": len(docs) / seconds,
        "cpu_seconds": cpu_seconds, "docs_per_cpu_s": len(docs) / cpu_seconds,
        "peak_rss_mb": rss_mb(), "rss_before_mb": base_rss,
        "recall": {
            f">={t}": float(np.mean([p in found for p, j in js.items() if j >= t])) for t in (0.8, 0.85, 0.9)
        },
        "pairs_at": {f">={t}": sum(j >= t for j in js.values()) for t in (0.8, 0.85, 0.9)},
        "merged_pairs": len(merged),
        "planted_found": len(found),
        "false_merges_below_0.5": sum(1 for p in merged if js.get(p, 0.0) < 0.5),
    }  # fmt: skip
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--child", choices=list(METHODS))
    args = parser.parse_args()
    if args.child:
        child(args.child, args.docs)
        return
    results = {}
    for method in METHODS:
        print(f"running {method} on {args.docs:,} documents ...", flush=True)
        out = subprocess.run([sys.executable, __file__, "--child", method, "--docs", str(args.docs)],
                             capture_output=True, text=True, check=True)  # fmt: skip
        results[method] = json.loads(out.stdout.strip().splitlines()[-1])
    f, b, t = results["forge"], results["baseline"], results["tuned"]
    print(f"\n{'':<10}{'docs/s':>10}{'docs/cpu-s':>11}{'seconds':>10}{'recall J>=.8':>14}{'J>=.85':>8}{'J>=.9':>8}"
          f"{'false merges':>14}{'peak RSS MB':>13}{'(before)':>10}")  # fmt: skip
    for name, r in results.items():
        rec = r["recall"]
        print(f"{name:<10}{r['docs_per_s']:>10.0f}{r['docs_per_cpu_s']:>11.0f}{r['seconds']:>10.1f}{rec['>=0.8']:>14.3f}{rec['>=0.85']:>8.3f}"
              f"{rec['>=0.9']:>8.3f}{r['false_merges_below_0.5']:>14}{r['peak_rss_mb']:>13.0f}"
              f"{r['rss_before_mb']:>10.0f}")  # fmt: skip
    print(f"\nplanted pairs: {f['pairs_at']}")
    ratio = f["docs_per_s"] / b["docs_per_s"]
    cpu_ratio = f["docs_per_cpu_s"] / b["docs_per_cpu_s"]
    better = f["recall"][">=0.8"] > b["recall"][">=0.8"]
    print(
        f"throughput ratio forge/baseline: {ratio:.1f}x wall, {cpu_ratio:.1f}x per CPU second (goal >= 5x); "
        f"recall at J>=0.8 higher: {better}"
    )
    print(f"throughput ratio forge/tuned datasketch: {f['docs_per_s'] / t['docs_per_s']:.1f}x wall, "
          f"{f['docs_per_cpu_s'] / t['docs_per_cpu_s']:.1f}x per CPU second")  # fmt: skip


if __name__ == "__main__":
    from results import recorded  # bench/results.py: the output goes to RESULTS.md too

    with recorded(__file__):
        main()
