"""Near-duplicate Q&A pairs: the data stage's MinHash + LSH (`pretrain.data.dedup`), verified by Jaccard, sized for
pairs, and the held-out side always preferred (a train copy of a held-out answer is decontamination, not data).

    keep = near_duplicate_mask(answers, cfg.data.dedup, cfg.seed, priority)
    held, train, removed = deduplicate(held, train, cfg.data.dedup, cfg.seed, short_qtypes=("module",))
    train, held = split_held_out(user_records, eval_fraction=0.05, dedup_cfg=cfg.data.dedup, seed=cfg.seed)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from forge.config import DedupConfig
from pretrain.data.dedup import NearDeduper, candidate_pairs, jaccard, keep_mask, verified_clusters

QA_NGRAM = 2  # word n-gram size of near-duplicate detection on Q&A pairs (see near_duplicate_labels)
# An answer of one or two words is a value (a name, a number, a setting, a colour) that many questions share by design:
# decontaminating on it alone would drop every train pair whose value also answers a held-out question, so such pairs
# are compared by question and answer together. A longer answer ("It returns the sorted list.") identifies its pair.
SHORT_ANSWER_WORDS = 2
HOLD_OUT_HASH_SEED = 0x5F7  # the hash of held-out questions and objects (independent of the data stage's split hash)


def near_duplicate_labels(texts: Sequence[str], dedup_cfg: DedupConfig, seed: int) -> np.ndarray:
    """Cluster label per text: texts with a verified Jaccard >= threshold (transitively) share a label.

    The data stage's settings, with word n-grams of at most QA_NGRAM: a Q&A pair is a few dozen words, and with the
    5-word shingles built for documents a one-word edit of a 20-word answer leaves a Jaccard of ~0.6 (not caught).
    """
    if not texts:
        return np.zeros(0, dtype=np.int64)
    dedup_cfg = dedup_cfg.model_copy(update={"ngram": min(dedup_cfg.ngram, QA_NGRAM)})
    deduper = NearDeduper(dedup_cfg, seed)
    sets = [deduper.shingles(t) for t in texts]
    pairs = candidate_pairs(deduper.band_keys(deduper.signatures(sets)))
    labels, _ = verified_clusters(
        len(texts), pairs, lambda i, j: jaccard(sets[i], sets[j]), dedup_cfg.jaccard_threshold
    )
    return labels


def near_duplicate_mask(
    texts: Sequence[str], dedup_cfg: DedupConfig, seed: int, priority: Sequence[int] | None = None
) -> np.ndarray:
    """Keep mask: one text per cluster of near-duplicates; the lowest (priority, index) wins."""
    labels = near_duplicate_labels(texts, dedup_cfg, seed)
    order = np.zeros(len(texts), dtype=np.int64) if priority is None else np.asarray(priority, dtype=np.int64)
    return keep_mask(labels, order) if len(texts) else np.zeros(0, dtype=bool)


def deduplicate(
    held: list[dict[str, Any]],
    train: list[dict[str, Any]],
    dedup_cfg: DedupConfig,
    seed: int,
    short_qtypes: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    """(held-out, train, removed counts): one pair per cluster of near-duplicate answers, a held-out one when the
    cluster has one (the train copies are then decontamination). Short answers of `short_qtypes` repeat by design
    (one module for many functions): for them the question is what makes a pair unique, so they are deduplicated on
    the exact (question, answer) only."""
    ordered = held + train
    priority = np.array([0] * len(held) + [1] * len(train), dtype=np.int64)
    labels = np.arange(len(ordered), dtype=np.int64)
    long = [i for i, p in enumerate(ordered) if p["qtype"] not in short_qtypes]
    labels[long] = len(ordered) + near_duplicate_labels([ordered[i]["answer"] for i in long], dedup_cfg, seed)
    exact: dict[tuple[str, str], int] = {}
    for i, p in enumerate(ordered):
        if p["qtype"] in short_qtypes:
            key = (" ".join(p["question"].lower().split()), " ".join(p["answer"].lower().split()))
            labels[i] = exact.setdefault(key, i)
    keep = keep_mask(labels, priority) if len(ordered) else np.zeros(0, dtype=bool)
    held_labels = set(labels[: len(held)].tolist())
    removed_train = [i for i in range(len(held), len(ordered)) if not keep[i]]
    decontaminated = sum(1 for i in removed_train if labels[i] in held_labels)
    counts = {"near_duplicates": int(len(ordered) - keep.sum()) - decontaminated, "decontaminated": decontaminated}
    kept_held = [p for p, k in zip(held, keep[: len(held)], strict=True) if k]
    kept_train = [p for p, k in zip(train, keep[len(held) :], strict=True) if k]
    return kept_held, kept_train, counts


def example_text(record: dict[str, Any]) -> str:
    """What near-duplicate detection compares for a user's pair: every turn's text (roles and system left out)."""
    turns = record.get("messages") or [{"role": "user", "content": record["question"]},
                                       {"role": "assistant", "content": record["answer"]}]  # fmt: skip
    return "\n".join(m["content"] for m in turns if m["role"] != "system")


def hold_out_hash(text: str) -> float:
    """A stable number in [0, 1) from a text (case and whitespace ignored)."""
    return xxhash.xxh64_intdigest(" ".join(text.lower().split()).encode(), seed=HOLD_OUT_HASH_SEED) / 2**64


def split_held_out(
    records: list[dict[str, Any]], eval_fraction: float, dedup_cfg: DedupConfig, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) of a user's file, by a stable hash of each conversation's first question. Near-duplicate
    conversations are removed (held-out ones preferred), then every train record whose answer near-duplicates a
    held-out answer (decontamination: the answer is what `forge eval` scores; for a short answer, its question and
    answer together, see SHORT_ANSWER_WORDS)."""

    def first_question(r: dict[str, Any]) -> str:
        return next((m["content"] for m in r.get("messages") or () if m["role"] == "user"), r["question"])

    held = [hold_out_hash(first_question(r)) < eval_fraction for r in records]
    ordered = [r for r, h in zip(records, held, strict=True) if h]
    n_eval = len(ordered)
    ordered += [r for r, h in zip(records, held, strict=True) if not h]
    priority = [0] * n_eval + [1] * (len(ordered) - n_eval)
    keep = near_duplicate_mask([example_text(r) for r in ordered], dedup_cfg, seed, priority)
    held_out = [r for r, k in zip(ordered[:n_eval], keep[:n_eval], strict=True) if k]
    train = [r for r, k in zip(ordered[n_eval:], keep[n_eval:], strict=True) if k]
    if held_out and train:
        keys = [r["answer"] if len(r["answer"].split()) > SHORT_ANSWER_WORDS else example_text(r)
                for r in held_out + train]  # fmt: skip
        labels = near_duplicate_labels(keys, dedup_cfg, seed)
        leaked = set(labels[: len(held_out)].tolist())
        train = [r for r, label in zip(train, labels[len(held_out) :], strict=True) if label not in leaked]
    return train, held_out
