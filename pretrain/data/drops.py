"""Every way the data stage can remove a document (FILTERS, in pipeline and report order) and the record of one
removal (Drop), which every cleaning step returns instead of the text it would have kept."""

from __future__ import annotations

from dataclasses import dataclass

# Every way a document can be removed, in pipeline (and report) order.
FILTERS = (
    "unreadable",
    "html_extraction",
    "boilerplate",
    "metadata",
    "language",
    "gopher_quality",
    "gopher_repetition",
    "c4",
    "fineweb",
    "exact_dedup",
    "near_dedup",
    "decontamination",
    "paragraph_dedup",
)


@dataclass(frozen=True)
class Drop:
    filter: str  # one of FILTERS
    reason: str  # the rule and the measured value, e.g. "min_words: 12 < 50"
    rule: str = ""  # the rule that fired (a Rule.name, or a fixed name such as "no main content"); "" -> filter
    value: float | None = None  # its measured value, where it has one
