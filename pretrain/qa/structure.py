"""The structure of a reference page: titled sections of prose, defined terms, labelled fields and code.

    page = parse_html(markup)          # h1-h6, p/li, dl/dt/dd, tables, pre
    page = parse_text(text)            # Markdown, reStructuredText, AsciiDoc and rendered man pages

A `Page` is its title and its sections in document order; a `Section` is a heading (empty before the first one),
its level and its blocks:

  prose  a paragraph or list item, its lines as written
  term   a defined term with its definition: <dt>/<dd>, AsciiDoc `term::`, an RST or man-page definition (a short
         line followed by a more indented block), an option line (`-f, --force   Overwrite the target.`), a table row
         whose first cell names something and whose other cell describes it
  field  a labelled value: a two-column row whose label is a header cell or ends with ":" (`Syntax: | Alias ...`)
  code   a <pre> block, a fenced or delimited block, an RST literal block

Nothing here decides what is worth asking about (pretrain/qa/extract.py does); it only recovers what the markup
says, which HTML extraction in the data stage throws away. Parsing never raises on bad markup: a page it cannot
read is an empty Page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pretrain.data.html import runs_and_blocks, utf8_parser

HEADING_LEVELS = {f"h{i}": i for i in range(1, 7)}
SKIPPED_TAGS = {
    "script", "style", "noscript", "svg", "form", "button", "select", "nav", "iframe", "object", "template", "head",
    "footer", "map", "canvas", "audio", "video",
}  # fmt: skip
INLINE_TAGS = {
    "a", "abbr", "b", "big", "cite", "code", "em", "i", "kbd", "q", "s", "samp", "small", "span", "strong", "sub",
    "sup", "tt", "u", "var", "font", "br", "img", "wbr", "del", "ins", "mark", "time", "data", "bdi", "bdo", "label",
    "dfn", "nobr",
}  # fmt: skip
LAYOUT_TABLE_WORDS = 80  # a table cell longer than this holds page content, not a value: the table is layout
MAX_TERM_WORDS = 12  # a defined term or a field label is short; longer first cells are sentences, not names


@dataclass
class Block:
    kind: str  # prose | term | field | code
    text: str
    term: str = ""


@dataclass
class Section:
    heading: str
    level: int
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Page:
    title: str
    sections: list[Section]

    def headings(self) -> list[str]:
        return [s.heading for s in self.sections if s.heading]


def words(text: str) -> int:
    return len(text.split())


def clean_heading(text: str) -> str:
    """A heading as a reader names it: no section number ("1.2. "), permalink sign or trailing colon/anchor."""
    text = " ".join(text.replace("\u00b6", " ").split())
    text = re.sub(r"\[\[[^\]]*\]\]", "", text)  # AsciiDoc anchors: OPTIONS[[OPTIONS]]
    text = re.sub(r"^(\d+(\.\d+)*\.?|[A-Z]\.)\s+", "", text)
    return text.strip(" #:>").strip()


# ----------------------------------------------------------------------------------------------------------------
# HTML


def parse_html(markup: str) -> Page:
    import lxml.html
    from lxml import etree

    try:
        # bytes: lxml refuses a str that carries its own encoding declaration
        root = lxml.html.fromstring(markup.encode("utf-8", "surrogatepass"), parser=utf8_parser())
    except (etree.ParserError, ValueError):
        return Page("", [])
    title = " ".join((root.findtext(".//title") or "").split())
    walker = _HtmlWalker()
    walker.walk(root)
    sections = [s for s in walker.sections if s.blocks or s.heading]
    return Page(title or next((s.heading for s in sections if s.heading), ""), sections)


def _tag(el) -> str | None:
    return el.tag.lower() if isinstance(el.tag, str) else None  # comments and processing instructions: None


def _inline_text(el) -> str:
    tag = _tag(el)
    if tag == "br":
        return "\n"
    if tag is None or tag in SKIPPED_TAGS:  # a comment's text is not the page's
        return ""
    parts = [el.text or ""]
    for child in el:
        parts += [_inline_text(child), child.tail or ""]
    return "".join(parts)


def _is_block(el) -> bool:
    """Every element that is not inline markup (comments are neither)."""
    tag = _tag(el)
    return tag is not None and tag not in INLINE_TAGS


class _HtmlWalker:
    """Document-order walk (pretrain/data/html.py runs_and_blocks, as the data stage renders trafilatura's tree):
    inline runs become prose, block elements their own blocks, headings open sections."""

    def __init__(self) -> None:
        self.sections = [Section("", 0)]
        self.sink: list[Block] | None = None  # set while a <dd> collects its definition

    def emit(self, block: Block) -> None:
        if block.text.strip():
            (self.sink if self.sink is not None else self.sections[-1].blocks).append(block)

    def walk(self, el) -> None:
        for part in runs_and_blocks(el, _is_block, _inline_text):
            if isinstance(part, str):
                self.emit(Block("prose", part.strip()))  # emit drops an empty run
            else:
                self.block(part, _tag(part))

    def block(self, el, tag: str) -> None:
        if tag in SKIPPED_TAGS:
            return
        if tag in HEADING_LEVELS:
            if self.sink is None:
                self.sections.append(Section(clean_heading(el.text_content()), HEADING_LEVELS[tag]))
            return
        if tag == "pre":
            self.emit(Block("code", code_text(el.text_content())))
        elif tag == "dl":
            self.definitions(el)
        elif tag == "table" and not self.is_layout(el):
            self.table(el)
        else:
            self.walk(el)

    def definitions(self, dl) -> None:
        terms: list[str] = []
        for item in dl.iter("dt", "dd"):
            if item.getparent() is not dl and item.getparent().getparent() is not dl:
                continue  # a nested list's items: walked with its own <dd>
            if item.tag == "dt":
                terms.append(" ".join(_inline_text(item).split()))
                continue
            outer, self.sink = self.sink, []
            self.walk(item)
            collected, self.sink = self.sink, outer
            prose = []
            for b in collected:
                if b.kind != "prose":
                    break
                prose.append(b.text)
            term = ", ".join(t for t in terms if t)
            if term and prose:
                self.emit(Block("term", "\n\n".join(prose), term))
            for b in collected[len(prose) :]:
                self.emit(b)  # nested options, examples: blocks of the same section
            terms = []

    @staticmethod
    def is_layout(table) -> bool:
        nested = (e for e in table.iter("table", "h1", "h2", "h3", "h4", "pre", "dl") if e is not table)
        if next(nested, None) is not None:
            return True
        return any(words(cell.text_content()) > LAYOUT_TABLE_WORDS for cell in table.iter("td", "th"))

    def table(self, table) -> None:
        rows = []
        for tr in table.iter("tr"):
            cells = [c for c in tr if _tag(c) in ("td", "th")]
            if cells:
                rows.append([(_tag(c), " ".join(_inline_text(c).split())) for c in cells])
        for row in rows:
            if all(tag == "th" for tag, _ in row):
                continue  # a header row
            (label_tag, label), rest = row[0], [text for _, text in row[1:] if text]
            if not rest or not label or words(label) > MAX_TERM_WORDS:
                continue
            if len(row) == 2 and (label_tag == "th" or label.endswith(":")):
                self.emit(Block("field", rest[0], label.rstrip(":").strip()))
            else:
                self.emit(Block("term", max(rest, key=len), label))


def code_text(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\t", "    ").split("\n")]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# plain-text markups

_ATX = re.compile(r"^(#{1,6}|={1,6})\s+(\S.*?)\s*#*$")  # Markdown "## Title", AsciiDoc "== Title"
_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+.])\1{2,}\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_DELIMITED = re.compile(r"^(-{4,}|\.{4,}|_{4,}|\+{4,})\s*$")  # AsciiDoc listing/literal blocks
_MAN_HEADING = re.compile(r"^[A-Z][A-Z0-9 /&_-]*[A-Z0-9]$")
_ASCIIDOC_TERM = re.compile(r"^(\S.*?)(::|;;)(\s+(\S.*))?$")
_OPTION = r"-{1,2}[A-Za-z0-9?][\w.?-]*(?:[ =][<\[]?[\w.|-]+[>\]]?)?"  # -f, --force, -o FILE, --level=<n>
_OPTION_LINE = re.compile(  # "-f, --force   Overwrite it.", and a man page's "FILE   the file to read"
    rf"^\s*({_OPTION}(?:,\s*{_OPTION})*|[A-Z][A-Z0-9_]+(?:\.\.\.)?)\s{{2,}}(\S.*)$"
)
_DEFINITION_LINE = re.compile(r"^:\s+(\S.*)$")  # Pandoc/PHP Markdown Extra: "Term\n: definition"
_FIELD = re.compile(r"^:([^:\s][^:]*):\s*(\S.*)?$")  # reStructuredText field lists ":param name: ..."
_LIST_ITEM = re.compile(r"^\s*([-*+\u2022]|\d+[.)])\s+")
_ASCIIDOC_MARKUP = re.compile(r"^(\[[^\]]*\]|include::.*|ifn?def::.*|endif::.*|//.*|:[\w-]+:.*)$")


def _indent_of(line: str) -> int:
    expanded = line.replace("\t", "        ")
    return len(expanded) - len(expanded.lstrip(" "))


def parse_text(text: str) -> Page:
    return _TextParser(text.replace("\r\n", "\n").replace("\r", "\n").split("\n")).parse()


class _TextParser:
    """Line by line: headings (ATX, underlined, overlined, man-page capitals), fenced and delimited code, defined terms
    (AsciiDoc `term::`, option lines, RST fields, Pandoc definitions, a short line over a more indented block) and
    paragraphs. A term's definition is the paragraph that follows it."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        self.sections = [Section("", 0)]
        self.underline_levels: list[str] = []  # underline characters in order of first use: their heading levels
        self.para: list[str] = []
        self.kind = "prose"
        self.terms: list[str] = []

    def parse(self) -> Page:
        i = 0
        while i < len(self.lines):
            i = self.step(i)
        self.flush()
        sections = [s for s in self.sections if s.blocks or s.heading]
        return Page(next((s.heading for s in sections if s.heading), ""), sections)

    def line(self, i: int) -> str:
        return self.lines[i] if i < len(self.lines) else ""

    def flush(self) -> None:
        blocks = self.sections[-1].blocks
        if self.kind == "prose" and blocks and blocks[-1].kind == "prose" and blocks[-1].text.endswith("::"):
            self.kind = "code"  # reStructuredText: a paragraph ending in "::" introduces a literal block
        if self.kind == "code":
            body = code_text("\n".join(self.para))
        else:
            body = "\n".join(x.strip() for x in self.para).strip()
        if body:
            if self.terms and self.kind == "prose":
                blocks.append(Block("term", body, ", ".join(self.terms)))
            else:
                blocks.append(Block(self.kind, body))
            self.terms = []
        self.para, self.kind = [], "prose"

    def heading(self, title: str, level: int) -> None:
        self.flush()
        self.terms = []
        self.sections.append(Section(clean_heading(title), level))

    def step(self, i: int) -> int:
        """Read the construct that starts at line i; return the line after it."""
        line, stripped, nxt = self.lines[i], self.lines[i].strip(), self.line(i + 1).strip()
        starts_block = not self.para  # headings, terms and fences only start where no paragraph is open
        if not stripped or stripped in ("+", "--"):  # blank, an AsciiDoc list continuation or open block
            if not (self.terms and not self.para):  # a term's definition may follow after a blank line
                self.flush()
            return i + 1
        if starts_block and _ASCIIDOC_MARKUP.match(stripped):  # attributes, includes, conditionals, comments
            return i + 1
        if _FENCE.match(line) or (starts_block and _DELIMITED.match(stripped)):
            return self.code_block(i)
        if starts_block and _indent_of(line) == 0:
            if m := _ATX.match(stripped):
                self.heading(m.group(2), len(m.group(1)))
                return i + 1
            if _UNDERLINE.match(nxt) and len(nxt) >= 0.6 * len(stripped):
                if nxt[0] not in self.underline_levels:
                    self.underline_levels.append(nxt[0])
                self.heading(stripped, self.underline_levels.index(nxt[0]) + 1)
                return i + 2
            if _UNDERLINE.match(stripped) and self.line(i + 2).strip() == stripped:  # RST overline + underline
                self.heading(nxt, 1)
                return i + 3
            if _MAN_HEADING.match(line) and words(stripped) <= 5 and _indent_of(self.next_nonblank(i)) > 0:
                self.heading(stripped, 1)
                return i + 1
        if starts_block:
            m = _ASCIIDOC_TERM.match(stripped)
            if m and not stripped.startswith("::") and words(m.group(1)) <= MAX_TERM_WORDS:
                self.terms.append(m.group(1).strip())  # several terms may share one definition (-f:: --force::)
                if m.group(4):
                    self.para.append(m.group(4))
                return i + 1
            if m := _OPTION_LINE.match(line):
                return self.option_line(i, m)
            if m := _FIELD.match(stripped):
                self.flush()
                self.terms, self.para = [m.group(1).strip()], [m.group(2) or ""]
                return i + 1
            if (m := _DEFINITION_LINE.match(nxt)) and words(stripped) <= MAX_TERM_WORDS:
                self.flush()
                self.terms, self.para = [stripped], [m.group(1)]
                return i + 2
            if not self.terms and self.is_term_over_block(line, i):
                self.terms = [stripped]
                return i + 1
        if _LIST_ITEM.match(line) and self.para:
            self.flush()
        self.para.append(line)
        return i + 1

    def code_block(self, i: int) -> int:
        self.flush()
        fence = _FENCE.match(self.lines[i])
        marker = fence.group(1) if fence else self.lines[i].strip()
        j = i + 1
        while j < len(self.lines):
            current = self.lines[j].strip()
            if current.startswith(marker) if fence else current == marker:
                break
            j += 1
        self.para, self.kind = self.lines[i + 1 : j], "code"
        self.flush()
        return j + 1

    def option_line(self, i: int, m: re.Match) -> int:
        """ "-f, --force   Overwrite the target." and the more indented lines that continue its description."""
        self.flush()
        self.terms, self.para = [m.group(1).strip()], [m.group(2)]
        indent = _indent_of(self.lines[i])
        j = i + 1
        while j < len(self.lines) and self.lines[j].strip() and _indent_of(self.lines[j]) > indent:
            self.para.append(self.lines[j])
            j += 1
        self.flush()
        return j

    def is_term_over_block(self, line: str, i: int) -> bool:
        """A definition-list term (RST, man pages): a short line, not a sentence, right above a more indented one."""
        nxt = self.line(i + 1)
        stripped = line.strip()
        return bool(
            nxt.strip() and _indent_of(nxt) > _indent_of(line) and words(stripped) <= MAX_TERM_WORDS
            and not stripped.endswith((".", ",", ";", ":")) and not _LIST_ITEM.match(line)
        )  # fmt: skip

    def next_nonblank(self, i: int) -> str:
        return next((line for line in self.lines[i + 1 :] if line.strip()), "")
