"""HTML in the data stage: a page parsed, its visible text, and its main content as the Markdown-like text the rest
of the stage reads (textblocks.py).

trafilatura finds the main content; we render its blocks ourselves, one block per line. Paragraphs come out whole
(HTML source wraps them at ~70 columns, and line rules would judge that wrapping), code blocks verbatim between
``` fences, list items as "- ", table rows as "cell | cell".

    root = parse_html(page)                       # None: not HTML at all
    text = extract_html(root, favor="recall")     # the main content, or a Drop

`runs_and_blocks` is the document-order walk this rendering and the Q&A stage's page structure
(pretrain/qa/structure.py) share: each decides what a block is and what it makes of it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any, Literal

from pretrain.data.drops import Drop
from pretrain.data.textblocks import FENCE

_BLOCKS = {"doc", "main", "body", "div", "p", "head", "list", "item", "table", "row", "quote", "code"}
_INLINE_PARENTS = {"p", "head", "cell", "hi", "ref", "del"}  # a <code> inside these is inline code
_SPACES = re.compile(r"\s+")


@functools.lru_cache(maxsize=1)
def utf8_parser() -> Any:
    """lxml's HTML parser reading UTF-8 bytes: without it, bytes with no charset declaration are read as latin-1."""
    import lxml.html

    return lxml.html.HTMLParser(encoding="utf-8")


def parse_html(html: str) -> Any | None:
    """The page as an lxml tree, or None when lxml cannot read it at all (empty, only a comment)."""
    import lxml.html

    try:  # as UTF-8 bytes: lxml refuses a str that carries an XML encoding declaration (XHTML pages)
        return lxml.html.document_fromstring(html.encode("utf-8"), parser=utf8_parser())
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


def _ends_line(el: Any) -> bool:
    """A block (a code block is one unless it sits in running text) or a line break: what ends a line of text."""
    if el.tag == "code":
        parent = el.getparent()
        return parent is None or parent.tag not in _INLINE_PARENTS
    return el.tag in _BLOCKS or el.tag == "lb"


def render_blocks(body: Any) -> str:
    """trafilatura's XML tree (p, head, list/item, table/row/cell, code, quote, lb, inline hi/ref) -> text."""
    from lxml import etree

    etree.strip_tags(body, etree.Comment, etree.ProcessingInstruction)  # trafilatura keeps some; they are not text
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
        for part in runs_and_blocks(el, _ends_line, lambda child: "".join(child.itertext())):
            if isinstance(part, str):
                emit(part)
            elif part.tag != "lb":  # a line break ends the run and is nothing itself
                walk(part)
        if el.tag == "item":
            pending[0] = ""

    walk(body)
    return "\n".join(lines)


def runs_and_blocks(el: Any, is_block: Callable[[Any], bool], inline_text: Callable[[Any], str]) -> Iterator[Any]:
    """An lxml element's content in document order: each run of text between its block children (its own text, the
    `inline_text` of the children that are not blocks, their tails), as one str ("" where two blocks meet), and
    each block child, the element itself, between the runs."""
    run = [el.text or ""]
    for child in el:
        if is_block(child):
            yield "".join(run)
            yield child
            run = []
        else:
            run.append(inline_text(child))
        run.append(child.tail or "")
    yield "".join(run)
