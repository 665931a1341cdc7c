"""The data stage's settings (`data:`): inputs, split, cleaning (HTML extraction, boilerplate, language, the
quality rules of forge/quality_rules.py and their profiles) and deduplication. Part of the run config
(forge/config.py), which re-exports every name here.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, model_validator

from forge.config_section import Section
from forge.quality_rules import config_fields, profile_thresholds

BUILTIN_CORPUS = "builtin:python-stdlib"

# The cleaning profiles: named sets of thresholds, one table. `data.profile` picks one; any setting given explicitly
# (data.quality.min_words: 10, --set data.min_language_score=0.5) overrides its profile's value.
#   web:  crawled web pages, the rules as published (datatrove's Gopher, C4 and FineWeb defaults, fastText's 0.65
#         language score as in FineWeb/RefinedWeb) measured on the whole document; HTML extraction favours
#         precision (drops more chrome).
#   docs: curated domain text (manuals, reference pages, legal or medical text, books, any language): the same
#         rules measured on the prose only (code, listings, option lists and tables set aside), so they mean what
#         they were fit for; HTML extraction favours recall (keeps definition lists and option tables).
DATA_PROFILES: dict[str, dict[str, Any]] = {
    "web": {
        "html_extraction_favor": "precision",
        "boilerplate_min_line_words": 3,  # C4: lines of fewer than 3 words are menus and buttons
        "min_language_score": 0.65,
        "quality.measure_on": "text",
        **profile_thresholds("web"),
    },
}
DATA_PROFILES["docs"] = {
    **DATA_PROFILES["web"],
    "html_extraction_favor": "recall",
    # Headings, list items and option names are short lines of real content; recurring chrome is still caught by
    # the recurring-line rule.
    "boilerplate_min_line_words": 0,
    "quality.measure_on": "prose",
    **profile_thresholds("docs"),  # each rule's docs threshold, with its reason: forge/quality_rules.py
}


class QualitySwitches(Section):
    """What every quality rule shares: whether they run and what they measure. QualityConfig adds one setting per
    rule of forge/quality_rules.py."""

    enabled: bool = True
    # What the rules measure: "prose" (lines of running text; code blocks, listings, option lists and table
    # scaffolding set aside) or "text" (the whole document, as the rules were published).
    measure_on: Literal["prose", "text"] | None = None


_QUALITY_DOC = """Document quality heuristics (Gopher quality + repetition, C4, FineWeb), see pretrain/data/quality.py.

    Unset values come from `data.profile` (DATA_PROFILES); read the data report's calibration section to see
    what each rule removed from your corpus and which setting to change.
    """
if TYPE_CHECKING:  # mypy cannot see fields made at run time: to it, a rule's setting is what getattr gives

    class QualityConfig(QualitySwitches):
        def __getattr__(self, name: str) -> Any: ...

else:
    QualityConfig = create_model(
        "QualityConfig", __base__=QualitySwitches, __module__=__name__, __doc__=_QUALITY_DOC, **config_fields()
    )


class DedupConfig(Section):
    """Exact + MinHash near-duplicate removal at document level, then paragraph dedup.

    LSH uses explicit bands x rows: datasketch's threshold-derived default (9x13 at t=0.8) catches only ~40% of
    pairs at J=0.8. Candidates are verified against `jaccard_threshold` before they are merged.
    """

    exact: bool = True
    near: bool = True
    ngram: int = Field(5, ge=1)
    bands: int = Field(14, ge=1)
    rows: int = Field(8, ge=1)
    jaccard_threshold: float = Field(0.8, ge=0.0, le=1.0)
    paragraph: bool = True
    min_paragraph_chars: int = Field(50, ge=1)
    decontaminate: bool = True  # drop train documents that near-duplicate a val/test document


class DataConfig(Section):
    EXECUTION_ONLY = frozenset({"workers", "executor", "ray_address"})  # the same documents come out either way

    inputs: list[str] = [BUILTIN_CORPUS]
    text_field: str = "text"  # the text column of .jsonl / .parquet inputs
    # The cleaning thresholds' defaults (DATA_PROFILES): docs for curated domain text, web for crawled pages.
    profile: Literal["docs", "web"] = "docs"
    # Split ratios by a stable hash of the document id. val and test each also get at least min_eval_tokens
    # (estimated as words x 1.3 on the text as read, before any cleaning) if the ratio gives fewer, up to
    # max_eval_fraction of the corpus each: see pretrain/data/splits.py.
    split: dict[Literal["train", "val", "test"], float] = {"train": 0.98, "val": 0.01, "test": 0.01}
    # What the gate's evidence needs with room: its 30 items (registry min_items) of bits per byte at up to
    # eval.text_item_tokens (512) each are ~15k tokens of test text; val's loss curve needs no more.
    min_eval_tokens: int = Field(20_000, ge=0)
    # A document of more estimated tokens than this is cut into sections (by its headings, else at paragraphs)
    # before the split is assigned, so one long PDF or a manual of a few chapters still gives val and test their
    # share; each section is a document from then on (pretrain/data/sections.py). 0: never cut.
    max_section_tokens: int = Field(2048, ge=0)
    # The evaluation's minimum is absolute (an interval over 30 items needs the text whatever the corpus), so a
    # small corpus gives it a larger share: one 250-page manual (~150k estimated tokens as read) needs a fifth to
    # a quarter of itself for val and test each once cleaning has taken its contents pages and untranslated parts.
    max_eval_fraction: float = Field(0.25, gt=0.0, lt=0.5)
    html_extraction: bool = True
    html_extraction_favor: Literal["precision", "recall"] | None = None  # trafilatura's trade-off; None: profile
    boilerplate: bool = True
    boilerplate_min_doc_fraction: float = Field(0.05, gt=0.0, le=1.0)  # a line in >= this share of docs is boilerplate
    boilerplate_min_docs: int = Field(5, ge=2)
    # Lines of fewer words than this are dropped (C4: menus, buttons, stray labels); 0 keeps short lines, which
    # headings, list items and code-like lines of curated text need. None: the profile's.
    boilerplate_min_line_words: int | None = Field(None, ge=0)
    language: bool = True
    languages: list[str] = ["en"]  # ISO 639-1 codes as fastText's lid.176 names them (en, de, fr, pt, zh...)
    # The detector's probability of data.languages together (a page mixing two of them is not half wanted);
    # None: the profile's.
    min_language_score: float | None = Field(None, ge=0.0, le=1.0)
    # A document with fewer prose words than this is not judged by the language rule (too little to tell).
    language_min_words: int = Field(20, ge=1)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    # The calibration (pretrain/data/calibrate.py) flags any rule that alone would drop more than this share of
    # the train split's documents, with examples and the setting to change.
    calibration_max_drop_share: float = Field(0.1, gt=0.0, le=1.0)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    date_field: str = "date"
    date_before: str | None = None  # ISO date: keep only documents dated before it
    max_doc_bytes: int = Field(10_000_000, ge=1)
    shard_docs: int = Field(50_000, ge=1)
    workers: int = Field(0, ge=0)  # 0: one per core
    executor: Literal["local", "ray"] = Field(
        "local",
        description="Where the per-record passes and LSH banding run: this machine's process pool (local) or Ray "
        "Data (ray: a cluster at data.ray_address, or a local Ray instance of data.workers CPUs). Same output.",
    )
    ray_address: str | None = Field(
        None,
        description="The Ray cluster to connect to (ray://host:10001 or host:6379, as ray.init takes it); None: "
        "start a local Ray instance for this run. Only read with data.executor=ray.",
    )

    @model_validator(mode="after")
    def _split_sums_to_one(self) -> DataConfig:
        total = sum(self.split.values())
        if abs(total - 1.0) > 1e-6 or set(self.split) != {"train", "val", "test"}:
            raise ValueError(
                f"data.split={self.split} must give train, val and test ratios summing to 1 (they sum to {total:g})"
            )
        if min(self.split.values()) <= 0:
            raise ValueError(f"data.split={self.split}: every ratio must be > 0 (val and test must not be empty)")
        return self

    @model_validator(mode="after")
    def _profile_fills_unset(self) -> DataConfig:
        # Written into __dict__ (not assigned) so they stay "unset": changing data.profile later refills them.
        for dotted, value in DATA_PROFILES[self.profile].items():
            section, _, name = dotted.rpartition(".")
            target = self.quality if section == "quality" else self
            if name not in target.model_fields_set:
                target.__dict__[name] = copy.deepcopy(value)
        return self
