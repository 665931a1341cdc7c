"""Long documents cut into sections before the split is assigned: by headings, else by size.

A corpus of a few long documents (one 500-page PDF, a manual shipped as 15 chapters) split per document gives val
and test nothing or everything. A document whose estimated tokens exceed `data.max_section_tokens` is cut into
sections of at most that size: at every top-level heading (chapters), and where a section would grow past the
limit, at the last heading before that point, else at a paragraph. Small neighbouring sections are merged, so a
glossary of one-line entries does not become a thousand documents too short for the quality rules.

The cut is a function of the document's own text as read, nothing else: no cleaning setting can move a boundary,
the same input always gives the same sections, and every section gets its own stable id, `<document id>#<slug of
its first heading>` (`~2`, `~3` for the parts of a section cut by size, `-2` for a repeated heading), from which the
split is hashed. A section is one record from then on: it never straddles two splits.

    for section in cut(record, max_tokens):        # the record itself when it is short enough
        ...

HTML is cut in its markup, before extraction (the headings and block elements of the page), Markdown-like text
(plain text, Markdown, what the PDF, DOCX, ODT and EPUB readers write) at its heading lines and blank lines. Every
section of a page keeps the page's <title>. Each section's meta says where it came from: `document` (the id of the
whole document), `section` (its heading), `part` ("3/17") and, from the PDF reader, `pages`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pretrain.data.splits import est_tokens

SOFT = 7  # the level of a paragraph boundary: a place to cut by size, never a heading
MIN_SHARE = 0.1  # a chapter's opening shorter than this share of the limit (its title alone) stays with what follows


@dataclass(frozen=True)
class Boundary:
    start: int  # offset in the document's text (or serialized markup) where the segment begins
    level: int  # 1-6: a heading of that level; SOFT: a paragraph; 0: the document's start
    heading: str  # the heading's text ("" for a paragraph or the start)
    tokens: int  # estimated tokens of the segment from here to the next boundary


def cut(record: dict[str, Any], max_tokens: int, tokens: int | None = None) -> list[dict[str, Any]]:
    """The record's sections (each a record), or [record] when it holds at most `max_tokens` estimated tokens."""
    if tokens is None:
        tokens = est_tokens(record["text"])
    pages = record.get("pages")  # the PDF reader's (offset, page label, running-line chars removed) per page
    record = {k: v for k, v in record.items() if k != "pages"}
    chunks: list[tuple[int, int]] = []
    if tokens > max_tokens > 0:
        if record.get("format") == "html":
            pieces, bounds, head = html_boundaries(record["text"])
            join: Callable[[int, int], str] = lambda a, b: (head if a else "") + "".join(pieces[a:b])  # noqa: E731
        else:
            text = record["text"]
            bounds = text_boundaries(text)
            offsets = [b.start for b in bounds] + [len(text)]
            join = lambda a, b: text[offsets[a] : offsets[b]].strip("\n")  # noqa: E731
        chunks = plan(bounds, max_tokens)
    if len(chunks) <= 1:
        return [_with_pages(record, pages, 0, None)]
    names = section_names(bounds, chunks)
    out = []
    for k, ((a, b), name) in enumerate(zip(chunks, names, strict=True)):
        heading = next((x.heading for x in reversed(bounds[: a + 1]) if x.heading), "")
        part = {"section": heading, "part": f"{k + 1}/{len(chunks)}"}
        meta = {"document": record["id"], **record.get("meta", {}), **part}
        section = {**record, "id": f"{record['id']}#{name}", "text": join(a, b), "meta": meta}
        out.append(_with_pages(section, pages, bounds[a].start, bounds[b].start if b < len(bounds) else None))
    return out


def _with_pages(record: dict[str, Any], pages: list[tuple[int, str, int]] | None, start: int,
                end: int | None) -> dict[str, Any]:  # fmt: skip
    """The record with its source pages ("12-15") in meta and the running headers and footers the reader removed
    from those pages credited to the boilerplate step."""
    if not pages:
        return record
    inside = [p for p in pages if start <= p[0] and (end is None or p[0] < end)]
    first = next((p for p in reversed(pages) if p[0] <= start), pages[0])
    last = inside[-1] if inside else first
    label = first[1] if first[1] == last[1] else f"{first[1]}-{last[1]}"
    removed = dict(record.get("removed", {}))
    removed["boilerplate"] = removed.get("boilerplate", 0) + sum(p[2] for p in inside)
    return {**record, "meta": {**record.get("meta", {}), "pages": label}, "removed": removed}


# ----------------------------------------------------------------------------------------------------------------
# where to cut


def plan(bounds: list[Boundary], max_tokens: int) -> list[tuple[int, int]]:
    """Consecutive [first, end) ranges of boundaries, each at most `max_tokens` where a cut allows it.

    Forced cuts before every top-level heading (the shallowest level that occurs at least twice: a lone title
    heading is not a chapter), unless what comes before is only a title (under MIN_SHARE of the limit). Past the
    limit, the cut goes back to the last heading that leaves the section at least half full, else it falls at the
    boundary where the limit was crossed."""
    levels = [b.level for b in bounds if 1 <= b.level < SOFT]
    top = min((lvl for lvl in set(levels) if levels.count(lvl) >= 2), default=0)
    chunks: list[tuple[int, int]] = []
    first, size = 0, bounds[0].tokens
    for i in range(1, len(bounds)):
        b = bounds[i]
        if size > 0 and ((b.level == top and size >= max_tokens * MIN_SHARE) or size + b.tokens > max_tokens):
            cut_at = i
            if b.level != top:
                cut_at = _last_heading(bounds, first, i, max_tokens // 2)
            chunks.append((first, cut_at))
            first, size = cut_at, sum(x.tokens for x in bounds[cut_at:i])
        size += b.tokens
    chunks.append((first, len(bounds)))
    return chunks


def _last_heading(bounds: list[Boundary], first: int, i: int, at_least: int) -> int:
    """The last heading boundary in (first, i] whose section from `first` holds `at_least` tokens; else i."""
    size = sum(b.tokens for b in bounds[first:i])
    for j in range(i, first, -1):
        if j < i:
            size -= bounds[j].tokens
        if bounds[j].level < SOFT and size >= at_least:
            return j
    return i


def section_names(bounds: list[Boundary], chunks: list[tuple[int, int]]) -> list[str]:
    """A stable name per section: the slug of its first heading; a section that starts mid-way (a cut by size) is
    its heading's next part (`~2`); a heading met twice gets `-2`."""
    names: list[str] = []
    seen: dict[str, int] = {}
    parts: dict[str, int] = {}
    current = "start"  # the name of the last heading met so far
    edges = {a for a, _ in chunks}
    for i, b in enumerate(bounds):
        if b.heading:
            slug = slugify(b.heading) or "section"
            seen[slug] = seen.get(slug, 0) + 1
            current = slug if seen[slug] == 1 else f"{slug}-{seen[slug]}"
        if i not in edges:
            continue
        if b.heading or i == 0:
            names.append(current)
        else:
            parts[current] = parts.get(current, 1) + 1
            names.append(f"{current}~{parts[current]}")
    return names


def slugify(heading: str, limit: int = 60) -> str:
    """Lowercase words of any script joined by "-" ("1.2 Installing Packages" -> "1-2-installing-packages")."""
    return "-".join(re.findall(r"\w+", heading.lower()))[:limit].strip("-")


# ----------------------------------------------------------------------------------------------------------------
# text: Markdown/AsciiDoc heading lines, setext and reStructuredText underlines, blank lines


_ATX = re.compile(r"^(#{1,6}|={1,6})[ \t]+(\S.*?)[ \t]*#*$")
_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+.])\1{2,}\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
UNDERLINE_LEVELS = {"=": 1, "-": 2}  # every other underline character: level 3


def text_boundaries(text: str) -> list[Boundary]:
    lines = text.split("\n")
    starts, offset = [], 0
    for line in lines:
        starts.append(offset)
        offset += len(line) + 1
    found: list[tuple[int, int, str]] = []  # (line, level, heading)
    in_code, blank_before = False, False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if _FENCE.match(line):
            in_code = not in_code
        if in_code or not stripped:
            blank_before = not stripped and not in_code
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if m := _ATX.match(line):
            found.append((i, len(m.group(1)), m.group(2)))
        elif _UNDERLINE.match(nxt) and not _UNDERLINE.match(line) and len(nxt.strip()) >= min(len(stripped), 3):
            found.append((i, UNDERLINE_LEVELS.get(nxt.strip()[0], 3), stripped))
        elif blank_before and not _UNDERLINE.match(line):
            found.append((i, SOFT, ""))
        blank_before = False
    if not found or found[0][0] > 0:
        found.insert(0, (0, 0, ""))  # the document's start; a heading on its first line is its start instead
    edges = [starts[line] for line, _, _ in found] + [len(text)]
    return [
        Boundary(edges[k], level, heading, est_tokens(text[edges[k] : edges[k + 1]]))
        for k, (_, level, heading) in enumerate(found)
    ]


# ----------------------------------------------------------------------------------------------------------------
# HTML: a marker before every heading and top-level block, the serialized page cut at the markers


HEADINGS = {f"h{i}": i for i in range(1, 7)}
BLOCKS = {"p", "pre", "table", "ul", "ol", "dl", "blockquote"}  # paragraph-level places to cut by size
_MARK = "\ue000{}\ue001"  # private-use characters: never in a page's own text
_MARK_TAG = "forge-cut"
_MARKER = re.compile(rf"<{_MARK_TAG}>\ue000(\d+)\ue001</{_MARK_TAG}>")


def html_boundaries(html: str) -> tuple[list[str], list[Boundary], str]:
    """(the page's markup cut into pieces at every boundary, the boundaries, a <head> for the later pieces)."""
    import lxml.html

    from pretrain.data.html import parse_html, sized_text

    root = parse_html(html)
    body = root.find("body") if root is not None else None
    if body is None:
        return [html], [Boundary(0, 0, "", est_tokens(html))], ""
    marks: list[tuple[int, str]] = []
    for el in list(body.iter()):
        tag = el.tag if isinstance(el.tag, str) else ""
        if tag in HEADINGS or (tag in BLOCKS and not _inside(el, body)):
            level = HEADINGS.get(tag, SOFT)
            heading = " ".join(el.text_content().split()) if level < SOFT else ""
            marker = el.makeelement(_MARK_TAG, {})
            marker.text = _MARK.format(len(marks))
            el.addprevious(marker)
            marks.append((level, heading))
    title = " ".join((root.findtext(".//title") or "").split())
    charset = '<meta charset="utf-8">'  # the fragment is text now: whoever parses it must not guess latin-1
    head = f"<html><head>{charset}<title>{_escape(title)}</title></head><body>"
    markup = lxml.html.tostring(root, encoding="unicode")
    sizes = [est_tokens(t) for t in re.split("\ue000\\d+\ue001", sized_text(root))]
    if len(sizes) != len(marks) + 1:  # a heading inside a link went with it: no sizes to cut by
        return [html], [Boundary(0, 0, "", sum(sizes))], ""
    pieces, bounds, last = [], [], 0
    for k, m in enumerate(_MARKER.finditer(markup)):
        pieces.append(markup[last : m.start()])
        last = m.end()
        level, heading = marks[int(m.group(1))]
        bounds.append(Boundary(sum(len(p) for p in pieces), level, heading, sizes[k + 1] if k + 1 < len(sizes) else 0))
    pieces.append(markup[last:])
    bounds.insert(0, Boundary(0, 0, "", sizes[0]))
    if len(bounds) > 1 and sizes[0] == 0:  # nothing before the first heading: the page starts with it
        pieces[:2] = [pieces[0] + pieces[1]]
        bounds[:2] = [Boundary(0, bounds[1].level, bounds[1].heading, bounds[1].tokens)]
    return pieces, bounds, head


def _inside(el: Any, body: Any) -> bool:
    """Whether a block element sits inside another block or a heading (only the outermost are places to cut)."""
    parent = el.getparent()
    while parent is not None and parent is not body:
        if parent.tag in BLOCKS or parent.tag in HEADINGS:
            return True
        parent = parent.getparent()
    return False


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
