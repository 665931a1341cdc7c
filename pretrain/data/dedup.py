"""Deduplication: exact (normalised hash), near (MinHash + LSH, verified), paragraph-level, and across splits.

Near-duplicates, as datatrove does it but verified:
  1. normalise (NFKC, lowercase, digits -> 0, words only) and hash word n-grams to 32 bits (numpy, per batch);
  2. MinHash signature of `bands * rows` affine permutations `(a*x + b) mod (2^61-1)`, computed for a whole batch
     of documents in one numpy pass (no per-token Python);
  3. LSH with EXPLICIT bands x rows: one 64-bit key per band; documents sharing a key are candidates. Candidate
     pairs come from sorting each band's keys (no in-memory hash tables: ~112 B per document);
  4. each candidate pair is verified by its true Jaccard similarity on the n-gram sets (>= threshold);
  5. union-find over verified pairs; one document kept per cluster (see `keep_order`).

    deduper = NearDeduper(cfg.dedup, seed=cfg.seed)
    keys = deduper.band_keys(deduper.signatures([deduper.shingles(t) for t in texts]))
    pairs = candidate_pairs(keys)
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

import numpy as np
import xxhash

from forge.config import DedupConfig

GROUP_SHINGLES = 1 << 14  # shingles per numpy pass: num_perm x this x 8 B of scratch (~15 MB at 112 perms)
FULL_PAIRS_RUN = 16  # a band bucket up to this size yields all its pairs; bigger ones a star plus a chain

_WORD = re.compile(r"\w+")
PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_DIGIT = re.compile(r"\d")


# ----------------------------------------------------------------------------------------------------------------
# normalisation and hashes


def normalized_words(text: str) -> list[str]:
    return _WORD.findall(_DIGIT.sub("0", unicodedata.normalize("NFKC", text).lower()))


def exact_hash(text: str) -> int:
    """Hash of the normalised text: case, punctuation, whitespace and digit changes are exact duplicates."""
    return xxhash.xxh3_64_intdigest(" ".join(normalized_words(text)).encode())


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (uint64 arithmetic wraps, which is what we want)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


_NGRAM_MULT = _mix64(np.arange(1, 65, dtype=np.uint64)) | np.uint64(1)  # odd per-position multipliers


_WORD_BYTE = np.zeros(256, dtype=bool)  # [0-9a-z_] and every non-ASCII byte: \\w on lowercased text, near enough
_WORD_BYTE[[*range(48, 58), *range(97, 123), 95, *range(128, 256)]] = True
_DIGITS_TO_ZERO = str.maketrans("123456789", "000000000")
_BASE = np.uint64(0x100000001B3)  # odd, so invertible modulo 2^64
_CHUNK = 1 << 20  # bytes per prefix-hash pass (bounds the power tables)


def _powers(base: int, n: int) -> np.ndarray:
    """base^0 .. base^(n-1) modulo 2^64."""
    return np.concatenate([np.ones(1, dtype=np.uint64), np.cumprod(np.full(n - 1, base, dtype=np.uint64))])


_POW = _powers(int(_BASE), _CHUNK + 1)
_INV_POW = _powers(pow(int(_BASE), -1, 1 << 64), _CHUNK + 1)  # so a word's hash does not depend on its offset


def word_hashes(text: str) -> np.ndarray:
    """64-bit hashes of the normalised words, all in numpy: a polynomial hash from prefix sums.

    Normalisation as datatrove's: NFKC, lowercase, digits -> 0, words are runs of word characters.
    """
    data = np.frombuffer(unicodedata.normalize("NFKC", text).lower().translate(_DIGITS_TO_ZERO).encode(), np.uint8)
    out = []
    lo = 0
    while lo < len(data):
        hi = min(lo + _CHUNK, len(data))
        while lo + 1 < hi < len(data) and _WORD_BYTE[data[hi - 1]] and _WORD_BYTE[data[hi]]:
            hi -= 1  # cut between words: a word's hash does not depend on where its chunk starts
        out.append(_chunk_word_hashes(data[lo:hi]))
        lo = hi
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


def _chunk_word_hashes(data: np.ndarray) -> np.ndarray:
    is_word = _WORD_BYTE[data]
    edges = np.diff(np.concatenate([[False], is_word, [False]]).astype(np.int8))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if not len(starts):
        return np.zeros(0, dtype=np.uint64)
    prefix = np.zeros(len(data) + 1, dtype=np.uint64)
    np.cumsum(data.astype(np.uint64) * _POW[: len(data)], out=prefix[1:])
    raw = (prefix[ends] - prefix[starts]) * _INV_POW[starts]  # = sum data[s+k] * BASE^k: position-free
    return _mix64(raw ^ (ends - starts).astype(np.uint64))


def shingles(text: str, n: int) -> np.ndarray:
    """Sorted distinct 32-bit hashes of the word n-grams (a document shorter than n words is one shingle)."""
    w = word_hashes(text)
    if not len(w):
        return np.zeros(0, dtype=np.uint32)
    k = min(n, len(w))
    grams = np.zeros(len(w) - k + 1, dtype=np.uint64)
    for j in range(k):
        grams += w[j : len(w) - k + 1 + j] * _NGRAM_MULT[j]
    return np.unique((_mix64(grams) >> np.uint64(32)).astype(np.uint32))


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted distinct hash arrays."""
    if not len(a) and not len(b):
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


# ----------------------------------------------------------------------------------------------------------------
# MinHash signatures and LSH band keys


class NearDeduper:
    def __init__(self, cfg: DedupConfig, seed: int = 1337):
        self.cfg = cfg
        self.num_perm = cfg.bands * cfg.rows
        rng = np.random.default_rng(seed)
        # Multiply-shift hashing (Dietzfelbinger): h(x) = (a*x + b mod 2^64) >> 32 for 32-bit x, a universal
        # family at three numpy ops per value (a Mersenne-prime modulus costs several times more).
        self.a = rng.integers(0, 1 << 63, self.num_perm, dtype=np.uint64)[:, None] * np.uint64(2) + np.uint64(1)
        self.b = rng.integers(0, 1 << 63, self.num_perm, dtype=np.uint64)[:, None] * np.uint64(2)
        self.row_mult = _mix64(np.arange(1, cfg.rows + 1, dtype=np.uint64)) | np.uint64(1)

    def shingles(self, text: str) -> np.ndarray:
        return shingles(text, self.cfg.ngram)

    def _permuted_min(self, values: np.ndarray, starts: np.ndarray) -> np.ndarray:
        hashed = (self.a * values[None, :].astype(np.uint64) + self.b) >> np.uint64(32)
        return np.minimum.reduceat(hashed, starts, axis=1).T.astype(np.uint32)

    def signatures(self, shingle_sets: Sequence[np.ndarray]) -> np.ndarray:
        """[docs, bands*rows] uint32 MinHash signatures, computed a group of documents per numpy pass."""
        out = np.full((len(shingle_sets), self.num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
        group: list[int] = []
        size = 0

        def flush() -> None:
            nonlocal group, size
            if group:
                sets = [shingle_sets[i] for i in group]
                starts = np.cumsum([0] + [len(s) for s in sets[:-1]])
                out[group] = self._permuted_min(np.concatenate(sets), starts)
            group, size = [], 0

        for i, s in enumerate(shingle_sets):
            if not len(s):
                continue
            if len(s) > GROUP_SHINGLES:  # a long document alone, in chunks
                flush()
                for lo in range(0, len(s), GROUP_SHINGLES):
                    part = self._permuted_min(s[lo : lo + GROUP_SHINGLES], np.zeros(1, dtype=np.int64))[0]
                    np.minimum(out[i], part, out=out[i])
                continue
            if size + len(s) > GROUP_SHINGLES:
                flush()
            group.append(i)
            size += len(s)
        flush()
        return out

    def band_keys(self, sigs: np.ndarray) -> np.ndarray:
        """[docs, bands] uint64: one 64-bit key per band of `rows` signature values (vectorised over docs)."""
        blocks = sigs.reshape(len(sigs), self.cfg.bands, self.cfg.rows).astype(np.uint64)
        combined = (blocks * self.row_mult).sum(axis=2, dtype=np.uint64)
        return _mix64(combined ^ np.arange(self.cfg.bands, dtype=np.uint64))


def candidate_probability(j: float, bands: int, rows: int) -> float:
    """Chance that a pair with Jaccard j shares at least one band: 1 - (1 - j^r)^b."""
    return 1.0 - (1.0 - j**rows) ** bands


# ----------------------------------------------------------------------------------------------------------------
# candidates by sorting each band, verification, union-find


def bucket_pairs(bands: np.ndarray, keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[m, 2] int64 pairs of rows sharing a (band, key) bucket; unordered, may repeat (see `unique_pairs`).

    The one banding rule, for any slice of band rows that holds whole buckets (one band in memory here, a hash
    partition of (band, key) on Ray): sort by (band, key, row), and a run of equal (band, key) is a bucket. A
    bucket of up to FULL_PAIRS_RUN rows gives all its pairs; a bigger one gives each member paired with the
    bucket's first and with its predecessor (linear in the bucket size, enough for union-find to connect it).
    """
    n = len(rows)
    if n < 2:
        return np.zeros((0, 2), dtype=np.int64)
    order = np.lexsort((rows, keys, bands))
    band, col, members = bands[order], keys[order], rows[order].astype(np.int64)
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = (col[1:] != col[:-1]) | (band[1:] != band[:-1])
    run_id = np.cumsum(new_run) - 1
    run_start = np.flatnonzero(new_run)
    run_len = np.diff(np.append(run_start, n))
    in_dup = run_len[run_id] > 1
    if not in_dup.any():
        return np.zeros((0, 2), dtype=np.int64)
    first = members[run_start[run_id]]
    idx = np.flatnonzero(in_dup & ~new_run)
    found = [np.stack([first[idx], members[idx]], axis=1), np.stack([members[idx - 1], members[idx]], axis=1)]
    small = (run_len > 2) & (run_len <= FULL_PAIRS_RUN)
    for start, length in zip(run_start[small], run_len[small], strict=True):
        ii, jj = np.triu_indices(length, k=1)
        found.append(np.stack([members[start + ii], members[start + jj]], axis=1))
    return np.concatenate(found)


def unique_pairs(found: Sequence[np.ndarray],
                 allowed: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> np.ndarray:  # fmt: skip
    """Bucket pairs as sorted, distinct (i < j) rows, in lexicographic order (the order verification runs in)."""
    found = [f for f in found if len(f)]
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    pairs = np.sort(np.concatenate(found).astype(np.int64), axis=1)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    pairs = np.unique(pairs, axis=0)
    if allowed is not None and len(pairs):
        pairs = pairs[allowed(pairs[:, 0], pairs[:, 1])]
    return pairs


def candidate_pairs(
    keys: np.ndarray, allowed: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
) -> np.ndarray:
    """[m, 2] int64 pairs (i < j) of rows of `keys` ([docs, bands]) sharing a band key, deduplicated.

    In memory, one band at a time (scratch ~24 B per document); pretrain/data/ray_executor.py runs the same
    `bucket_pairs` on hash partitions of the band rows instead.
    """
    n, bands = keys.shape
    rows = np.arange(n, dtype=np.int64)
    return unique_pairs(
        [bucket_pairs(np.full(n, band, dtype=np.int64), keys[:, band], rows) for band in range(bands)], allowed
    )


class UnionFind:
    def __init__(self, n: int):
        self.parent = np.arange(n, dtype=np.int64)

    def find(self, x: int) -> int:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:  # path compression
            self.parent[x], x = root, self.parent[x]
        return int(root)

    def union(self, x: int, y: int) -> None:
        rx, ry = self.find(x), self.find(y)
        if rx != ry:
            self.parent[max(rx, ry)] = min(rx, ry)

    def labels(self) -> np.ndarray:
        return np.array([self.find(i) for i in range(len(self.parent))], dtype=np.int64)


def verified_clusters(n: int, pairs: np.ndarray, similarity: Callable[[int, int], float],
                      threshold: float) -> tuple[np.ndarray, list[tuple[int, int, float]]]:  # fmt: skip
    """Union-find over the candidate pairs whose similarity >= threshold: (label per row, verified pairs)."""
    uf = UnionFind(n)
    verified = []
    for i, j in pairs.tolist():
        if uf.find(i) == uf.find(j):
            continue  # already connected: no need to verify
        sim = similarity(i, j)
        if sim >= threshold:
            uf.union(i, j)
            verified.append((i, j, sim))
    return uf.labels(), verified


def keep_mask(labels: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """One row kept per cluster: the lowest (priority, row index)."""
    order = np.lexsort((np.arange(len(labels)), priority, labels))
    first = np.ones(len(labels), dtype=bool)
    first[1:] = labels[order][1:] != labels[order][:-1]
    keep = np.zeros(len(labels), dtype=bool)
    keep[order[first]] = True
    return keep


def near_duplicates(texts: Sequence[str], cfg: DedupConfig, seed: int = 1337) -> tuple[np.ndarray, list]:
    """In-memory convenience (tests, bench): (keep mask, verified pairs) for a list of texts."""
    deduper = NearDeduper(cfg, seed)
    sets = [deduper.shingles(t) for t in texts]
    keys = deduper.band_keys(deduper.signatures(sets))
    pairs = candidate_pairs(keys)
    labels, verified = verified_clusters(len(texts), pairs, lambda i, j: jaccard(sets[i], sets[j]),
                                         cfg.jaccard_threshold)  # fmt: skip
    return keep_mask(labels, np.zeros(len(texts), dtype=np.int64)), verified


# ----------------------------------------------------------------------------------------------------------------
# paragraphs


class ParagraphDeduper:
    """Drops a paragraph (>= min_chars) already seen in another document; the set holds 64-bit hashes only.

    The in-memory reference (tests, bench/paragraph_dedup.py): `forge data` runs paragraphs.ParagraphDedup, the
    same decisions from sorted runs on disk, bounded in memory.
    """

    def __init__(self, min_chars: int):
        self.min_chars = min_chars
        self.seen: set[int] = set()

    def apply(self, text: str) -> tuple[str, int]:
        """(text without already-seen paragraphs, characters removed)."""
        kept, removed, mine = [], 0, set()
        for para in PARAGRAPH_BREAK.split(text):
            if len(para.strip()) >= self.min_chars:
                h = xxhash.xxh3_64_intdigest(" ".join(normalized_words(para)).encode())
                if h in self.seen:
                    removed += len(para)
                    continue
                mine.add(h)
            kept.append(para)
        self.seen |= mine
        return "\n\n".join(kept).strip(), removed
