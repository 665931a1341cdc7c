"""The data stage's document quality rules, one row each: Gopher quality and repetition (Rae et al. 2021, as in
datatrove), C4 and FineWeb. Everything else is derived from this table:

  - the `data.quality` settings (forge/data_config.py QualityConfig): one per rule, of the rule's type;
  - the profiles' thresholds (DATA_PROFILES): `web` the published values, `docs` (curated domain text) changes a
    few, each with its reason;
  - the checks pretrain/data/quality.py runs, in this order: the first rule a document fails is the one its drop
    names, so the order is the pipeline's, not alphabetical.

A rule's `metric` is the key of quality.measure's result that its threshold is compared with; an n-gram rule's
threshold is a {size: share} dict and its metric has "{n}" in it: one check per size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

SAME = "same as web"  # a profile value equal to the web profile's


@dataclass(frozen=True)
class QualityRule:
    setting: str  # the data.quality field holding its threshold: what the report tells a user to change
    filter: str  # the stage it reports under (pretrain/data/drops.py FILTERS)
    metric: str  # the key of quality.measure's result it judges; "{n}": one check per n-gram size of the threshold
    kind: Literal["min", "max", "flag"]  # keep value >= threshold / value <= threshold / drop when on and value 1
    type: Any  # the threshold's type (a flag's is bool)
    web: Any  # the web profile's threshold; a flag's default, whatever the profile (flags are not profile settings)
    docs: Any = SAME  # the docs profile's threshold
    ge: int | None = None  # the lowest value the setting accepts, where there is one

    def profile_value(self, profile: str) -> Any:
        return self.docs if profile == "docs" and self.docs != SAME else self.web


GOPHER, REPETITION = "gopher_quality", "gopher_repetition"

# fmt: off
QUALITY_RULES = (
    # docs: curated reference entries (a constant, a glossary term) are short by design; a page with less prose than 20
    # words is a stub, a redirect or navigation.
    QualityRule("min_words", GOPHER, "words", "min", int, web=50, docs=20, ge=0),
    # docs: a book, or a whole manual in one file.
    QualityRule("max_words", GOPHER, "words", "max", int, web=100_000, docs=1_000_000, ge=1),
    QualityRule("min_mean_word_length", GOPHER, "mean_word_length", "min", float, web=3.0),
    QualityRule("max_mean_word_length", GOPHER, "mean_word_length", "max", float, web=10.0),
    QualityRule("max_symbol_word_ratio", GOPHER, "symbol_word_ratio", "max", float, web=0.1),
    # docs: list items are how reference pages give options and constants (navigation link lists have no prose at all).
    QualityRule("max_bullet_lines_ratio", GOPHER, "bullet_lines_ratio", "max", float, web=0.9, docs=1.0),
    QualityRule("max_ellipsis_lines_ratio", GOPHER, "ellipsis_lines_ratio", "max", float, web=0.3),
    QualityRule("min_alpha_words_ratio", GOPHER, "alpha_words_ratio", "min", float, web=0.8),
    QualityRule("min_stop_words", GOPHER, "stop_words", "min", int, web=2),
    QualityRule("max_duplicate_paragraphs_ratio", REPETITION, "duplicate_paragraphs_ratio", "max", float, web=0.3),
    QualityRule("max_duplicate_paragraph_chars_ratio", REPETITION, "duplicate_paragraph_chars_ratio", "max", float,
                web=0.2),
    QualityRule("max_duplicate_lines_ratio", REPETITION, "duplicate_lines_ratio", "max", float, web=0.3),
    QualityRule("max_duplicate_line_chars_ratio", REPETITION, "duplicate_line_chars_ratio", "max", float, web=0.2),
    QualityRule("max_top_ngram_chars_ratio", REPETITION, "top_{n}gram_chars_ratio", "max", dict[int, float],
                web={2: 0.20, 3: 0.18, 4: 0.16}),
    # docs: reference text is templated (every directive or function described in the same frame): twice
    # Gopher's shares of repeated n-grams; generated spam repeats far more.
    QualityRule("max_dup_ngram_chars_ratio", REPETITION, "dup_{n}gram_chars_ratio", "max", dict[int, float],
                web={5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10},
                docs={5: 0.30, 6: 0.28, 7: 0.26, 8: 0.24, 9: 0.22, 10: 0.20}),
    QualityRule("c4_drop_lorem_ipsum", "c4", "lorem_ipsum", "flag", bool, web=True),
    # C4 drops documents with a "{": wrong for code and technical domains.
    QualityRule("c4_drop_curly_brace", "c4", "curly_brace", "flag", bool, web=False),
    # docs: C4's 5 is a web-page length rule; a short reference entry states what it needs in one.
    QualityRule("c4_min_sentences", "c4", "sentences", "min", int, web=5, docs=1),
    QualityRule("fineweb_min_punct_lines_ratio", "fineweb", "punct_lines_ratio", "min", float, web=0.12),
    QualityRule("fineweb_max_short_lines_ratio", "fineweb", "short_lines_ratio", "max", float, web=0.67),
    # docs: FineWeb's 1% targets crawl chrome repeated within a page (removed here before, by the recurring-line rule);
    # a note repeated under each entry of a manual is content.
    QualityRule("fineweb_max_dup_line_chars_ratio", "fineweb", "fineweb_dup_line_chars_ratio", "max", float,
                web=0.01, docs=0.1),
    QualityRule("fineweb_max_newlines_per_word", "fineweb", "newlines_per_word", "max", float, web=0.3),
)
# fmt: on


def profile_thresholds(profile: str) -> dict[str, Any]:
    """The profile's threshold of every rule but the flags, as DATA_PROFILES entries ("quality.min_words": 20)."""
    return {f"quality.{r.setting}": r.profile_value(profile) for r in QUALITY_RULES if r.kind != "flag"}


def config_fields() -> dict[str, Any]:
    """The QualityConfig field of every rule, as pydantic.create_model takes them: a flag is a bool with its
    default; a threshold is optional, None until data.profile fills it."""
    return {
        r.setting: (r.type, r.web) if r.kind == "flag" else (r.type | None, Field(None, ge=r.ge)) for r in QUALITY_RULES
    }
