"""A PDF's text layer as Markdown-like text, with its structure: headings, paragraphs, list items and code.

pypdfium2 (Apache-2.0/BSD, Google's PDFium) reads each character with its font and position: 320-380 pages/s for
plain text on 2 cores, 10x pypdf and 50-100x pdfminer.six on the Debian Reference PDFs (bench/pdf_extract.py; the
comparison is in the README's data section). From them:

  lines       PDFium's own line breaks, each with its font size, how much of it is set in a monospace or bold font,
              its top and its right end on the page
  running     the first and last lines of a page that recur on other pages once digits are masked ("Debian Reference
              12 / 233", a chapter title, a bare page number) are page furniture: removed, and their characters
              credited to the boilerplate step, page by page; so are the pages of a table of contents (dot leaders)
  headings    a line matching an outline (bookmark) entry of its page, or set larger than the body text: a "#" line,
              its level from the outline, else from the rank of its font size
  code        lines mostly in a monospace font, between ``` fences, one per line
  paragraphs  body lines joined (a hyphen PDFium marks as a line-end hyphen is dropped) until a gap wider than the
              usual line spacing, a short last line ending a sentence, or a change of kind; "•"/"–" lines are items

A PDF without a text layer (a scan) raises Unreadable("scanned") naming what OCR would take; a password raises
Unreadable("encrypted").
"""

from __future__ import annotations

import ctypes
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pretrain.data.textblocks import FENCE, MONOSPACE, Unreadable, heading
from pretrain.data.words import has_cjk

BULLET = re.compile(r"^\s*([•◦▪‣●○■□–—*-]|\(?\d{1,2}[.)]|\(?[a-z][.)])\s+")
SCANNED_SHARE = 0.9  # a document with no text on this share of its pages is a scan
RUNNING_MIN_PAGES, RUNNING_MIN_SHARE = 3, 0.05  # a top or bottom line on this many pages (and share) is furniture
RUNNING_EDGE = 2  # lines looked at at each edge of a page
PAGE_NUMBERS = frozenset({"0", "- 0 -", "page 0", "0 / 0", "page 0 of 0"})  # masked: a bare page number
HEADING_SIZE = 1.15  # a line this much larger than the body text is a heading
# Lines of a paragraph sit ~1.2 font sizes apart (baseline to baseline); paragraphs ~1.7 (the Debian Reference
# PDFs, dblatex): a gap above 1.45 sizes starts a new paragraph.
LEADING = 1.45
MAX_HEADING_WORDS = 20
DOT_LEADER = re.compile(r"(\.\s?){4,}\s*[\dIVXLCivxlc]+\s*$")  # "1.1 Console basics . . . . . 12"
CONTENTS_SHARE = 0.5  # a page whose lines mostly end in dot leaders and a page number is a table of contents


@dataclass
class Line:
    text: str
    size: float  # the font size of most of its characters
    mono: float  # share of its characters in a monospace font
    bold: float
    baseline: float  # of its first character, in page coordinates (y grows upwards)
    left: float
    right: float
    hyphen: bool  # ends with a hyphen PDFium marks as breaking a word across lines


def read_pdf(path: Path, doc_id: str) -> dict[str, Any]:
    """{"id", "text", "format": "pdf", "meta", "pages": [(offset, label, running chars removed)]}."""
    import pypdfium2 as pdfium

    try:
        document = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as exc:
        if "password" in str(exc).lower():
            raise Unreadable("encrypted", "the PDF needs a password: save a copy without it (qpdf --decrypt "
                             "in.pdf out.pdf) and read that") from None  # fmt: skip
        raise Unreadable("damaged", f"PDFium cannot open it: {exc}") from None
    try:
        pages = [page_lines(document[i]) for i in range(len(document))]
        labels = [_label(document, i) for i in range(len(document))]
        outline = [(b.level, _norm(b.get_title()), b.get_dest().get_index() if b.get_dest() else None)
                   for b in document.get_toc()]  # fmt: skip
    finally:
        document.close()
    empty = sum(1 for p in pages if not p)
    if not pages or empty >= SCANNED_SHARE * len(pages):
        raise Unreadable("scanned", f"no text layer on {empty} of {len(pages)} pages: a scan; OCR would make it "
                         "readable (e.g. `ocrmypdf in.pdf out.pdf`, Tesseract), then give Forge that")  # fmt: skip
    removed = [a + b for a, b in zip(remove_running_lines(pages), remove_contents_pages(pages), strict=True)]
    text, offsets = to_markdown(pages, outline)
    if not text.strip():
        raise Unreadable("empty", "no text once page headers and footers are set aside")
    meta = {"pages": f"{labels[0]}-{labels[-1]}" if len(labels) > 1 else labels[0]}
    if empty:
        meta["pages_without_text"] = empty
    return {"id": doc_id, "text": text, "format": "pdf", "meta": meta,
            "pages": [(offsets[i], labels[i], removed[i]) for i in range(len(pages))]}  # fmt: skip


def _label(document: Any, index: int) -> str:
    try:
        return document.get_page_label(index) or str(index + 1)
    except Exception:  # noqa: BLE001 - a malformed label tree: the physical number is still right
        return str(index + 1)


def _norm(text: str) -> str:
    """A heading without its number ("1.1 Console basics", "Chapter 2 ..."), lowercased: how outline entries match."""
    text = re.sub(r"^(chapter|appendix|part)?\s*[\dIVXivx.]+\s+", "", text.strip(), flags=re.I)
    return " ".join(text.lower().split())


# ----------------------------------------------------------------------------------------------------------------
# characters -> lines


def page_lines(page: Any) -> list[Line]:
    import pypdfium2.raw as pdfium_c

    textpage = page.get_textpage()
    try:
        n = textpage.count_chars()
        text = textpage.get_text_range(0, n) if n else ""
        fonts: dict[int, tuple[bool, bool]] = {}
        lines: list[Line] = []
        start = 0
        for end in [m.start() for m in re.finditer("\n", text)] + [len(text)]:
            chars = range(start, min(end, n))
            raw = text[start : chars.stop]
            start = end + 1
            if raw.strip():
                lines.append(_line(textpage.raw, raw, chars, fonts, pdfium_c))
        return lines
    finally:
        textpage.close()


def _line(tp: Any, text: str, chars: range, fonts: dict[int, tuple[bool, bool]], c: Any) -> Line:
    sizes: Counter[float] = Counter()
    mono = bold = counted = 0
    last_obj = None
    for i in chars:
        if text[i - chars.start : i - chars.start + 1].isspace() or c.FPDFText_IsGenerated(tp, i):
            continue
        obj = c.FPDFText_GetTextObject(tp, i)
        key = ctypes.cast(obj, ctypes.c_void_p).value or 0
        if key != last_obj:  # one font lookup per text run
            last_obj, size = key, round(c.FPDFText_GetFontSize(tp, i), 1)
            is_mono, is_bold = fonts.get(key) or fonts.setdefault(key, _font(obj, c))
        sizes[size] += 1
        mono += is_mono
        bold += is_bold
        counted += 1
    first = next((i for i in chars if not text[i - chars.start].isspace()), chars.start)
    last = next((i for i in reversed(chars) if not text[i - chars.start].isspace()), chars.start)
    x, y = ctypes.c_double(), ctypes.c_double()
    c.FPDFText_GetCharOrigin(tp, first, ctypes.byref(x), ctypes.byref(y))
    box = [ctypes.c_double() for _ in range(4)]
    c.FPDFText_GetCharBox(tp, last, *[ctypes.byref(b) for b in box])
    counted = max(counted, 1)
    return Line(text=" ".join(text.split()), size=sizes.most_common(1)[0][0] if sizes else 0.0, mono=mono / counted,
                bold=bold / counted, baseline=y.value, left=x.value, right=box[1].value,
                hyphen=bool(c.FPDFText_IsHyphen(tp, last)))  # fmt: skip


def _font(obj: Any, c: Any) -> tuple[bool, bool]:
    """(monospace, bold) of a text object's font: the FixedPitch flag or a monospace name; weight or a bold name."""
    font = c.FPDFTextObj_GetFont(obj)
    buf = ctypes.create_string_buffer(256)
    length = c.FPDFFont_GetBaseFontName(font, buf, 256)  # fills buf: read it after the call
    name = buf.raw[: max(length - 1, 0)].decode("utf-8", "replace")
    flags = c.FPDFFont_GetFlags(font)
    mono = bool(flags & 1) or bool(MONOSPACE.search(name))
    bold = c.FPDFFont_GetWeight(font) >= 600 or bool(re.search(r"bold|black|heavy", name, re.I))
    return mono, bold


# ----------------------------------------------------------------------------------------------------------------
# page furniture


def remove_running_lines(pages: list[list[Line]]) -> list[int]:
    """Drop the running headers and footers (and bare page numbers) of every page; the characters removed per page.

    The candidates of a page are its edge lines: the first and last RUNNING_EDGE lines as PDFium orders them (the
    content stream's order, which may put a footer first) and its topmost and bottommost lines on the page. One
    is furniture when, digits and roman numerals masked, it is a candidate on several pages (RUNNING_MIN_PAGES, and
    RUNNING_MIN_SHARE of a long document), or is a bare page number. A line set larger than the body text never is
    (a chapter's opening heading recurs at the top of pages too: "Chapter 1", "Chapter 2")."""
    body = _body_size(pages)

    def key(line: Line) -> str | None:
        if line.size > body * 1.05:
            return None
        return re.sub(r"\d+|\b[ivxlc]+\b", "0", line.text.lower())

    candidates = [_edge_lines(lines) for lines in pages]
    counts = Counter(k for page, edge in zip(pages, candidates, strict=True) for k in {key(page[i]) for i in edge})
    least = max(min(RUNNING_MIN_PAGES, len(pages)), RUNNING_MIN_SHARE * len(pages), 2)
    removed = []
    for lines, edge in zip(pages, candidates, strict=True):
        drop = {i for i in edge if (k := key(lines[i])) is not None and (counts[k] >= least or k in PAGE_NUMBERS)}
        removed.append(sum(len(lines[i].text) + 1 for i in drop))
        lines[:] = [x for i, x in enumerate(lines) if i not in drop]
    return removed


def _edge_lines(lines: list[Line]) -> set[int]:
    if not lines:
        return set()
    n = len(lines)
    by_height = sorted(range(n), key=lambda i: lines[i].baseline)
    return {*range(min(RUNNING_EDGE, n)), *range(max(n - RUNNING_EDGE, 0), n), by_height[0], by_height[-1]}


def remove_contents_pages(pages: list[list[Line]]) -> list[int]:
    """Empty the table-of-contents pages (and lists of tables and figures): most of their lines lead to a page number
    with dots. They are the PDF's navigation, as a site's menu is an HTML page's; the outline gives the headings."""
    removed = []
    for lines in pages:
        leaders = sum(bool(DOT_LEADER.search(x.text)) for x in lines)
        if len(lines) >= 5 and leaders >= CONTENTS_SHARE * len(lines):
            removed.append(sum(len(x.text) + 1 for x in lines))
            lines.clear()
        else:
            removed.append(0)
    return removed


# ----------------------------------------------------------------------------------------------------------------
# lines -> Markdown


def to_markdown(pages: list[list[Line]], outline: list[tuple[int, str, int | None]]) -> tuple[str, list[int]]:
    """(the text, the offset in it where each page begins: the start of the block open at the page break)."""
    body = _body_size(pages)
    sizes = sorted({x.size for p in pages for x in p if x.size > body * HEADING_SIZE}, reverse=True)
    width = _text_width(pages, body)
    titles: dict[int, dict[str, int]] = {}
    for level, title, page in outline:
        if page is not None:
            titles.setdefault(page, {})[title] = level + 1
    out = _Writer()
    previous: Line | None = None
    for index, lines in enumerate(pages):
        out.page_starts.append(out.size)
        on_page = titles.get(index, {}) | titles.get(index - 1, {})  # an entry may point just above its heading
        for line in lines:
            level = _heading_level(line, body, sizes, on_page)
            if level:
                out.heading(level, line.text, merge=previous is not None and previous.size <= line.size)
            else:
                this = "code" if line.mono > 0.6 else "li" if BULLET.match(line.text) else "p"
                if out.kind and not _continues(previous, line, out.kind, this, width):
                    out.close()
                out.add(line, this)
            previous = line
    out.close()
    return "\n\n".join(out.blocks), out.page_starts


class _Writer:
    """Blocks of Markdown, written as lines come: the open block, the offsets, one heading per run of them."""

    def __init__(self) -> None:
        self.blocks: list[str] = []
        self.page_starts: list[int] = []
        self.lines: list[str] = []
        self.kind = ""  # of the open block: "p", "li" or "code"
        self.size = 0  # characters written so far (the blocks are joined by a blank line)
        self.last_heading = 0  # the level of the block just written when it is a heading, else 0

    def add(self, line: Line, kind: str) -> None:
        self.kind = self.kind or kind
        text = line.text
        if line.hyphen and kind != "code":  # a word broken across lines: joined without its hyphen
            text = text.rstrip("-\u00ad\ufffe\u2010\x02") + "\u0000"
        self.lines.append(text)

    def heading(self, level: int, text: str, merge: bool) -> None:
        self.close()
        if merge and self.last_heading:  # "Chapter 1" set over "GNU/Linux tutorials": one heading
            merged = self.blocks.pop()
            self.size -= len(merged) + 2
            level, text = min(level, self.last_heading), merged.lstrip("# ") + " " + text
        self._write(heading(level, text))
        self.last_heading = level

    def close(self) -> None:
        if self.lines:
            lines = [x.replace("\u0000", "") for x in self.lines]
            self._write("\n".join([FENCE, *lines, FENCE]) if self.kind == "code" else _join(self.lines, self.kind))
            self.last_heading = 0
        self.lines, self.kind = [], ""

    def _write(self, block: str) -> None:
        self.blocks.append(block)
        self.size += len(block) + 2


def _body_size(pages: list[list[Line]]) -> float:
    counts: Counter[float] = Counter()
    for lines in pages:
        for x in lines:
            counts[x.size] += len(x.text)
    return counts.most_common(1)[0][0] if counts else 0.0


def _heading_level(line: Line, body: float, sizes: list[float], titles: dict[str, int]) -> int:
    """The heading level of a line (0: not a heading): its outline entry's, else its font size's rank."""
    if line.mono > 0.6 or len(line.text.split()) > MAX_HEADING_WORDS:
        return 0
    if (level := titles.get(_norm(line.text))) is not None:
        return min(level, 6)
    if line.size in sizes and not line.text.endswith((".", ",", ";")):
        return min(sizes.index(line.size) + 1, 6)
    return 0


def _continues(previous: Line | None, line: Line, kind: str, this: str, width: float) -> bool:
    """Whether `line` goes on with the open block of `kind` (`this`: what the line alone would be)."""
    if previous is None:
        return False
    if kind == "code" or this == "code":
        return kind == this
    if this == "li" or abs(previous.size - line.size) > 0.5:
        return False
    gap = previous.baseline - line.baseline  # negative: the line is on the next page (or column)
    if gap > LEADING * previous.size:  # wider than the usual line spacing: a new paragraph
        return False
    short = previous.right - previous.left < 0.85 * width  # a paragraph's last line stops short of the margin
    return not (short and previous.text.endswith((".", ":", "!", "?", "。", "：")))


def _text_width(pages: list[list[Line]], body: float) -> float:
    """The width of a full line of body text: the 90th percentile of the body lines' widths."""
    widths = sorted(x.right - x.left for p in pages for x in p if x.size == body)
    return widths[int(0.9 * (len(widths) - 1))] if widths else 0.0


def _join(lines: list[str], kind: str) -> str:
    """A paragraph's lines as one line: a space between words, none after a broken word or between CJK characters."""
    out = ""
    for line in lines:
        if not out:
            out = line
        elif out.endswith("\u0000"):
            out = out[:-1] + line
        elif has_cjk(out[-1:]) and has_cjk(line[:1]):
            out += line
        else:
            out += " " + line
    out = out.replace("\u0000", "")
    return "- " + BULLET.sub("", out, count=1) if kind == "li" else out
