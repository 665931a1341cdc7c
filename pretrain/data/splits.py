"""Train/val/test: a stable hash of the document id, with val and test sized for evaluation.

Every document has a point u in [0, 1) from the hash of its id. With ratios (train, val, test) a document is train
below `train`, val up to `train + val`, test above. The ratios are data.split, except that val and test each grow
(test downwards from u = 1, val below it) until they hold data.min_eval_tokens, up to data.max_eval_fraction of the
corpus each (and the one document past it that reaches the minimum, documents being whole), sized with EVAL_HEADROOM
for what cleaning removes: 98:1:1 of a 1,000-page manual is a handful of documents and a few thousand tokens, and
perplexity on that is noise.

The sizes are measured once, on the text of every document as read (an HTML page's visible text: its markup gone,
nothing judged yet), so no cleaning setting (extraction, filter, threshold, dedup, profile) can move a document
between splits; only the corpus itself (adding or removing documents) moves the edges. The resulting ratios are
recorded in report.json and in the manifest's metrics (split_ratio_train/val/test): `split_of(id, ratios)` gives
any document's split again.

Tokens are estimated before a tokenizer exists (words.est_tokens): whitespace words x 1.3, what a byte-level BPE
trained on the domain gives on English (the tokenizer stage warns above 1.4), and Chinese and Japanese, written
without spaces, by the character (1.0 and 0.7 tokens each). Bytes / 4 would count HTML-escaped and multi-byte UTF-8
text (accents, Cyrillic) as more tokens than it is.

    plan = plan_split(units, tokens, cfg.data)        # units: hash_unit(id) per document, tokens: est_tokens(text)
    split = split_of(doc_id, plan.ratios)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import xxhash

from forge.config import DataConfig
from pretrain.data.words import TOKENS_PER_WORD, est_tokens

__all__ = ["SPLITS", "TOKENS_PER_WORD", "est_tokens", "plan_split", "split_of"]
SPLITS = ("train", "val", "test")
# val and test are sized on the text as read, and cleaning then removes part of it (page chrome, boilerplate lines,
# dropped pages, copies): 2-18% of the val/test text of the Debian manuals in tests/test_data_debian.py. Sizing them
# at 1.5x data.min_eval_tokens keeps the minimum after cleaning unless cleaning takes a third; the report gives both
# figures and the log warns when cleaning took more.
EVAL_HEADROOM = 1.5


def hash_unit(doc_id: str) -> float:
    """The document's point in [0, 1): the stable hash of its id, nothing else."""
    return xxhash.xxh64_intdigest(doc_id.encode(), seed=0x5EED) / 2**64


def split_of(doc_id: str, ratios: dict[str, float]) -> str:
    """train/val/test from a stable hash of the id only: filters and their thresholds never move a document."""
    return split_at(hash_unit(doc_id), ratios)


@dataclass
class SplitPlan:
    ratios: dict[str, float]  # what split_of is called with
    assigned_tokens: dict[str, int]  # estimated tokens per split at assignment (before cleaning)
    total_tokens: int
    notes: list[str] = field(default_factory=list)  # plain sentences for the report and the log, when short


def plan_split(units: np.ndarray, tokens: np.ndarray, cfg: DataConfig) -> SplitPlan:
    """The ratios: data.split, with val and test grown to min_eval_tokens each (at most max_eval_fraction each)."""
    units = np.asarray(units, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.int64)
    total = int(tokens.sum())
    order = np.argsort(-units, kind="stable")  # from u = 1 downwards: test first, then val
    u_desc, t_desc = units[order], tokens[order]
    cap = cfg.max_eval_fraction * total
    want = min(cfg.min_eval_tokens * EVAL_HEADROOM, cap)
    notes: list[str] = []

    upper = 1.0
    ratios = dict(cfg.split)  # exactly as configured where nothing grows (the old split stays the same)
    for split in ("test", "val"):
        lower = upper - cfg.split[split]
        inside = (u_desc >= lower) & (u_desc < upper)
        if t_desc[inside].sum() < want:
            # grow: take the next documents below `upper` until `want` tokens, not past the cap, except by the one
            # document that reaches min_eval_tokens when the cap allows that much (documents come whole)
            below = np.flatnonzero(u_desc < upper)
            cum = np.cumsum(t_desc[below])
            k = int(np.searchsorted(cum, want)) + 1  # documents needed
            k = min(k, len(below))
            reaches_minimum = cap >= cfg.min_eval_tokens
            while k > 0 and cum[k - 1] > cap and not (reaches_minimum and (k == 1 or cum[k - 2] < cfg.min_eval_tokens)):
                k -= 1
            if k > 0:
                last = u_desc[below[k - 1]]
                following = u_desc[below[k]] if k < len(below) else 0.0
                if (last + following) / 2 < lower:
                    lower = (last + following) / 2
                    ratios[split] = upper - lower
        upper = lower
    if ratios != cfg.split:
        ratios["train"] = 1.0 - ratios["val"] - ratios["test"]
    assigned = {s: 0 for s in SPLITS}
    for u, t in zip(units.tolist(), tokens.tolist(), strict=True):
        assigned[split_at(u, ratios)] += t
    for split in ("val", "test"):
        if assigned[split] < cfg.min_eval_tokens:
            if cap < cfg.min_eval_tokens:
                why = (f"the corpus holds only ~{total:,} estimated tokens and val and test may take at most "
                       f"data.max_eval_fraction={cfg.max_eval_fraction:g} of it each")  # fmt: skip
            else:
                why = "the documents are too few or too large to reach it without passing that cap"
            notes.append(
                f"{split} holds ~{assigned[split]:,} estimated tokens, fewer than data.min_eval_tokens="
                f"{cfg.min_eval_tokens:,}: {why}. Its perplexity is noisier; add documents, or lower "
                "data.min_eval_tokens to silence this."
            )
    return SplitPlan(ratios, assigned, total, notes)


def split_at(u: float, ratios: dict[str, float]) -> str:
    edge = 0.0
    for split in SPLITS:
        edge += ratios[split]
        if u < edge:
            return split
    return SPLITS[-1]
