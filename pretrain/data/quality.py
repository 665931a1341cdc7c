"""The document quality rules (Gopher quality and repetition, C4, FineWeb; the table is forge/quality_rules.py) and
the prose they judge.

The rules are data, not code: `measure` computes every rule's value on a document (all of them, so the
calibration in calibrate.py sees each rule's distribution over the corpus, not only the first rule that fired), and
`first_failure` compares those values with the thresholds of `data.quality` in pipeline order.

    values = measure(text, cfg.quality, lang="en")
    drop = first_failure(values, cfg.quality)          # Drop("c4", "c4_min_sentences: 1 < 5", ...) or None

What the rules judge. A reference manual mixes running text with code listings, synopses, option lists and
tables; the web-crawl thresholds (Gopher, C4, FineWeb) were fit on running text and misfire on the rest (code
repeats lines, option lists have no sentence punctuation). `prose_view` keeps the lines of running text: outside
code fences, at least PROSE_MIN_WORDS words made of letters, and words are most of the line. The language is
detected on those words only (filters.language_sample), and with `quality.measure_on: prose` (the docs profile)
every quality rule measures them too; `measure_on: text` measures the whole document, as the published rules do
(the web profile).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from forge.config import QualityConfig
from forge.quality_rules import QUALITY_RULES
from pretrain.data import words
from pretrain.data.drops import Drop
from pretrain.data.textblocks import FENCE

# ----------------------------------------------------------------------------------------------------------------
# prose: the running text of a document, without its code, listings, option lists and table scaffolding

PROSE_MIN_WORDS = 4  # a line of fewer words is a heading, a label or a menu entry, not running text
# Japanese is cut into shorter units (SudachiPy's mode A gives ~1.27 words per English word of the same manual), so
# a line needs 5 of them: the rule then calls 96.5% of the Japanese manual's lines as it does the English one's.
PROSE_MIN_WORDS_JA = 5
PROSE_MIN_WORD_SHARE = 0.6  # ... and one whose tokens are mostly not words is code, a synopsis or an option list
# A word: letters, with inner hyphens or apostrophes (e-mail, don't, l'option), opening and closing punctuation
# around it. Identifiers (sqlite3_open, --all, <file>), numbers and operators are not words.
_WORD = re.compile(r"^[(\"'“‘«„¿¡]*[^\W\d_]+(?:[-'’][^\W\d_]+)*[.,;:!?)\"'”’»“]*$")


def is_word(token: str) -> bool:
    return _WORD.match(token) is not None


def prose_view(text: str, lang: str | None = None) -> str:
    """The document's prose lines; every other line becomes a blank line, so paragraphs stay apart. A line of
    Chinese or Japanese is cut into words by its segmenter (words.py); `lang` picks it for Han-only lines."""
    out, in_code = [], False
    for line in text.split("\n"):
        if line.strip() == FENCE:
            in_code = not in_code
            out.append("")
            continue
        out.append(line if not in_code and _is_prose(line, lang) else "")
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def _is_prose(line: str, lang: str | None) -> bool:
    if _is_table_row(line):
        return False
    tokens = words.segment(line, lang) if words.has_cjk(line) else line.split()
    n = sum(is_word(t) for t in tokens)
    least = PROSE_MIN_WORDS_JA if words.has_cjk(line) and words.cjk_language(line, lang) == "ja" else PROSE_MIN_WORDS
    return n >= least and n >= PROSE_MIN_WORD_SHARE * len(tokens)


def _is_table_row(line: str) -> bool:
    """Table rows (rendered "cell | cell", or Markdown's "| cell |") are data laid out in cells, not prose."""
    return " | " in line or line.lstrip().startswith("|")


# ----------------------------------------------------------------------------------------------------------------
# the rules' values and thresholds

# Gopher's stop-word rule: a document of real sentences has function words. Eight of the most frequent function
# words per language (datatrove's English set; the others are the same kinds of word: articles, prepositions,
# conjunctions, the copula). A language missing here skips the rule.
STOP_WORDS = {
    "en": {"the", "be", "to", "of", "and", "that", "have", "with"},
    "nl": {"de", "het", "een", "en", "van", "dat", "is", "niet"},
    "es": {"de", "la", "que", "el", "en", "y", "los", "se"},
    "pl": {"i", "w", "nie", "na", "się", "z", "do", "jest"},
    "de": {"der", "die", "und", "in", "den", "von", "zu", "das"},
    "fr": {"de", "la", "le", "et", "les", "des", "en", "un"},
    "it": {"di", "e", "il", "la", "che", "in", "a", "per"},
    "pt": {"de", "a", "o", "que", "e", "do", "da", "em"},
    "ru": {"и", "в", "не", "на", "что", "с", "по", "для"},
    "sv": {"och", "i", "att", "det", "som", "en", "på", "är"},
    "da": {"og", "i", "at", "det", "en", "den", "til", "er"},
    "cs": {"a", "v", "se", "na", "je", "že", "s", "z"},
    "tr": {"ve", "bir", "bu", "da", "de", "için", "ile", "olarak"},
    # The particles and function words their segmenters cut out (rjieba, SudachiPy mode A).
    "zh": {"的", "了", "是", "在", "和", "有", "不", "这"},
    "ja": {"の", "に", "は", "を", "た", "が", "で", "て"},
}
# Word-length thresholds are fit on alphabets: a Chinese or Japanese word is 1-3 characters long.
NO_WORD_LENGTH = words.CJK_LANGUAGES
PUNCTUATION = set(string.punctuation) | {"…", "“", "”", "‘", "’", "«", "»", "–", "—"}
BULLETS = ("•", "‣", "◦", "▪", "-", "*", "·")
TERMINAL_PUNCT = (".", "!", "?", '"', "'", "”", "’", ":", ";", ")", "…", "。", "！", "？", "」", "』", "）", "：", "；")


@dataclass(frozen=True)
class Rule:
    """One check: a rule of forge/quality_rules.py (an n-gram rule at one size, `key`); `value(metric) <op>
    data.quality.<setting>[key]` keeps the document."""

    filter: str  # the FILTERS entry it reports under
    name: str  # the setting's own name (+ [n] for an n-gram size): what the report tells a user to change
    metric: str  # the key of `measure`'s result
    kind: Literal["min", "max", "flag"]  # keep value >= threshold / value <= threshold / drop when on and value 1
    setting: str  # attribute of QualityConfig
    key: int | None = None  # for the n-gram dicts

    def threshold(self, q: QualityConfig) -> Any:
        value = getattr(q, self.setting)
        return value.get(self.key) if self.key is not None else value

    def fails(self, value: float, q: QualityConfig) -> bool:
        return fails(self.kind, value, self.threshold(q))

    @property
    def path(self) -> str:
        return f"data.quality.{self.setting}" + (f"[{self.key}]" if self.key is not None else "")


def fails(kind: str, value: float | None, limit: Any) -> bool:
    """Whether `value` breaks the threshold `limit` of a rule of this kind (min, max, flag)."""
    if limit is None or value is None or math.isnan(value):
        return False  # switched off, or not measurable on this document (no stop-word list, no lines)
    if kind == "flag":
        return bool(limit) and value >= 1
    return value < limit if kind == "min" else value > limit


def rules(q: QualityConfig) -> list[Rule]:
    """Every quality check, in pipeline order: each rule of forge/quality_rules.py, an n-gram rule once per size."""
    out = []
    for rule in QUALITY_RULES:
        if "{n}" not in rule.metric:
            out.append(Rule(rule.filter, rule.setting, rule.metric, rule.kind, rule.setting))
            continue
        for n in sorted(getattr(q, rule.setting)):
            out.append(Rule(rule.filter, f"{rule.setting}[{n}]", rule.metric.format(n=n), rule.kind, rule.setting, n))
    return out


def count_sentences(text: str) -> int:
    """Sentences ending in . ! ? (then a space or the end), or in a CJK full stop, which needs no space after it."""
    return len(re.findall(r"[^.!?\n]{3,}[.!?]+(?=\s|$)|[^。！？\n]{2,}[。！？]+", text))


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


def measure(text: str, q: QualityConfig, lang: str = "en") -> dict[str, float]:
    """Every quality rule's value on the document (its prose, with quality.measure_on=prose). NaN: not measurable."""
    if q.measure_on == "prose":
        text = prose_view(text, lang)
    nan = float("nan")
    tokens = words.segment(text, lang)
    n_words = max(len(tokens), 1)
    non_symbol = [w for w in tokens if any(ch not in PUNCTUATION for ch in w)]
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    paragraphs = [p for p in re.split(r"\n{2,}", text.strip()) if p.strip()]
    raw_lines = [line for line in text.split("\n") if line.strip()]
    total = max(len(text), 1)
    # a CJK text cut into 2-character chunks (no segmenter installed) has no particles to count
    chunked = lang in words.CJK_LANGUAGES and words.segmenter("ja" if lang == "ja" else "zh")[1] is None
    stop_words = None if chunked else STOP_WORDS.get(lang)
    values = {
        "words": len(non_symbol),
        "mean_word_length": sum(len(w) for w in non_symbol) / len(non_symbol)
        if non_symbol and lang not in NO_WORD_LENGTH else nan,
        "symbol_word_ratio": max(text.count(s) for s in ("#", "...", "…")) / n_words,
        "bullet_lines_ratio": sum(line.startswith(BULLETS) for line in lines) / len(lines) if lines else nan,
        "ellipsis_lines_ratio": sum(line.endswith(("...", "…")) for line in lines) / len(lines) if lines else nan,
        "alpha_words_ratio": sum(any(ch.isalpha() for ch in w) for w in tokens) / n_words if tokens else nan,
        "stop_words": nan if stop_words is None else sum(w.lower().strip(string.punctuation) in stop_words
                                                         for w in tokens),
        "lorem_ipsum": float("lorem ipsum" in text.lower()),
        "curly_brace": float("{" in text),
        "sentences": count_sentences(text),
    }  # fmt: skip
    dup, chars = duplicate_stats(paragraphs)
    values["duplicate_paragraphs_ratio"] = dup / len(paragraphs) if paragraphs else nan
    values["duplicate_paragraph_chars_ratio"] = chars / total
    dup, chars = duplicate_stats(raw_lines)
    values["duplicate_lines_ratio"] = dup / len(raw_lines) if raw_lines else nan
    values["duplicate_line_chars_ratio"] = chars / total
    lowered = [w.lower() for w in tokens]
    for n in q.max_top_ngram_chars_ratio:
        values[f"top_{n}gram_chars_ratio"] = top_ngram_char_ratio(lowered, n, total)
    for n in q.max_dup_ngram_chars_ratio:
        values[f"dup_{n}gram_chars_ratio"] = dup_ngram_char_ratio(lowered, n, total)
    values["punct_lines_ratio"] = sum(line.endswith(TERMINAL_PUNCT) for line in lines) / len(lines) if lines else nan
    values["short_lines_ratio"] = sum(_width(line) <= 30 for line in lines) / len(lines) if lines else nan
    values["fineweb_dup_line_chars_ratio"] = duplicate_stats(lines)[1] / max(len(text.replace("\n", "")), 1)
    values["newlines_per_word"] = text.count("\n") / n_words
    if not words.segmented(lang) or words.unsegmented_script(text):  # no word segmenter for this script
        values.update(dict.fromkeys(WORD_METRICS, nan) | _ngram_keys(q, nan))
    return {k: float(v) for k, v in values.items()}


# What the rules that count words measure: skipped (NaN) for a language written without spaces and no segmenter.
WORD_METRICS = ("words", "mean_word_length", "symbol_word_ratio", "alpha_words_ratio", "stop_words",
                "newlines_per_word")  # fmt: skip


def _ngram_keys(q: QualityConfig, value: float) -> dict[str, float]:
    return {rule.metric: value for rule in rules(q) if rule.key is not None}


def _width(line: str) -> int:
    """A line's length in Latin-script characters: a CJK character carries about as much as four of them (one
    token against a word's ~1.3 tokens of ~5 letters and a space), so FineWeb's 30 characters hold ~8 of them."""
    return len(line) + 3 * words.cjk_chars(line)


def first_failure(values: dict[str, float], q: QualityConfig) -> Drop | None:
    """The first rule (in pipeline order) the document fails, as a Drop naming the rule, its value and threshold."""
    if not q.enabled:
        return None
    for rule in rules(q):
        value = values.get(rule.metric, float("nan"))
        if rule.fails(value, q):
            return Drop(rule.filter, describe(rule, value, q), rule.name, value)
    return None


def describe(rule: Rule, value: float, q: QualityConfig) -> str:
    if rule.kind == "flag":
        return f"{rule.name} ({rule.metric} found)"
    op = "<" if rule.kind == "min" else ">"
    shown = f"{value:.0f}" if float(value).is_integer() else f"{value:.3f}"
    return f"{rule.name}: {shown} {op} {rule.threshold(q)}"
