"""Documents in packaged formats as the Markdown-like text the rest of the data stage reads: PDF (its text layer),
DOCX, ODT and EPUB.

Every reader keeps the structure the format has, in the form HTML extraction writes too (html.render_blocks) and
the Q&A stage parses (pretrain/qa/structure.py): a heading as a "#" line ("## Installing" for a level-2 heading),
paragraphs apart by a blank line, list items as "- item", table rows as "cell | cell", code between ``` fences.

    records = read_document(path, doc_id)      # one record per document (an EPUB: one per chapter)

A record is {"id", "text", "format", "meta"} and, from the PDF reader, "pages": the (offset, page label) of every
page's first character, which sections.cut turns into each section's `pages` ("12-15"). A document that cannot be
read raises Unreadable with the reason the report lists (scanned: a PDF without a text layer; encrypted; damaged).

Libraries: pypdfium2 (Apache-2.0, PDFium: text, fonts, outline; see pdf.py), python-docx (MIT) for DOCX; ODT and
EPUB are zip files of XML and XHTML read with zipfile and lxml (an EPUB chapter is HTML: the HTML path reads it).
"""

from __future__ import annotations

import posixpath
import re
import zipfile
from pathlib import Path
from typing import Any

from pretrain.data.textblocks import CODE_STYLE, MONOSPACE, Unreadable, heading, join_code

FORMATS = {".pdf": "pdf", ".docx": "docx", ".odt": "odt", ".epub": "epub"}


def read_document(path: Path, doc_id: str) -> list[dict[str, Any]]:
    """The document's records (see the module docstring); Unreadable when it has no text to give."""
    kind = FORMATS[path.suffix.lower()]
    try:
        if kind == "pdf":
            from pretrain.data import pdf

            return [pdf.read_pdf(path, doc_id)]
        if kind == "docx":
            return [_record(doc_id, read_docx(path), "docx")]
        if kind == "odt":
            return [_record(doc_id, read_odt(path), "odt")]
        return read_epub(path, doc_id)
    except Unreadable:
        raise
    except (zipfile.BadZipFile, KeyError) as exc:
        raise Unreadable("damaged", f"not a readable {kind.upper()} file ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # the libraries raise many types on damaged files: a bad file, not a bad run
        raise Unreadable("damaged", f"{kind.upper()} reader failed: {type(exc).__name__}: {exc}"[:300]) from None


def _record(doc_id: str, blocks: list[str], fmt: str) -> dict[str, Any]:
    text = "\n\n".join(b for b in blocks if b.strip())
    if not text.strip():
        raise Unreadable("empty", "no text in the document")
    return {"id": doc_id, "text": text, "format": fmt, "meta": {}}


# ----------------------------------------------------------------------------------------------------------------
# DOCX: python-docx, paragraphs and tables in document order, headings from their style's outline level


def read_docx(path: Path) -> list[str]:
    import docx
    from docx.table import Table

    document = docx.Document(str(path))
    blocks: list[tuple[str, str]] = []
    for item in document.iter_inner_content():
        if isinstance(item, Table):
            rows = [" | ".join(c for c in dict.fromkeys(" ".join(cell.text.split()) for cell in row.cells) if c)
                    for row in item.rows]  # fmt: skip
            blocks.append(("text", "\n".join(r for r in rows if r)))
            continue
        text = item.text
        if not text.strip():
            continue
        style = item.style.name if item.style is not None else ""
        level = _docx_heading_level(item, style)
        if level:
            blocks.append(("text", heading(level, text)))
        elif CODE_STYLE.search(style) or _all_monospace(item):
            blocks.extend(("code", line) for line in text.split("\n"))
        elif style.lower().startswith("list") or item._p.pPr is not None and item._p.pPr.numPr is not None:
            blocks.append(("text", "- " + " ".join(text.split())))
        else:
            blocks.append(("text", " ".join(text.split())))
    return join_code(blocks)


def _docx_heading_level(paragraph: Any, style: str) -> int:
    if m := re.match(r"heading\s*(\d)", style, re.I):
        return int(m.group(1))
    if style.lower() == "title":
        return 1
    level = paragraph.paragraph_format.element.pPr
    outline = getattr(level, "outlineLvl", None) if level is not None else None
    return int(outline.val) + 1 if outline is not None and outline.val is not None and int(outline.val) < 9 else 0


def _all_monospace(paragraph: Any) -> bool:
    runs = [r for r in paragraph.runs if r.text.strip()]
    return bool(runs) and all(r.font.name and MONOSPACE.search(r.font.name) for r in runs)


# ----------------------------------------------------------------------------------------------------------------
# ODT: content.xml, text:h with its outline level, text:p, lists, tables and sections in document order

ODF = {
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
}


def _q(prefix: str, name: str) -> str:
    return f"{{{ODF[prefix]}}}{name}"


def read_odt(path: Path) -> list[str]:
    from lxml import etree

    with zipfile.ZipFile(path) as z:
        root = etree.fromstring(z.read("content.xml"))
        styles = etree.fromstring(z.read("styles.xml")) if "styles.xml" in z.namelist() else None
    parents = _odf_style_parents(root, styles)
    body = root.find(f"{_q('office', 'body')}/{_q('office', 'text')}")
    if body is None:
        raise Unreadable("empty", "no office:text body (a spreadsheet or a drawing?)")
    blocks: list[tuple[str, str]] = []
    _odt_walk(body, blocks, parents)
    return join_code(blocks)


def _odf_style_parents(*roots: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for root in roots:
        if root is None:
            continue
        for style in root.iter(_q("style", "style")):
            out[style.get(_q("style", "name"), "")] = style.get(_q("style", "parent-style-name"), "")
    return out


def _odf_is_code(style: str, parents: dict[str, str]) -> bool:
    seen = set()
    while style and style not in seen:
        if CODE_STYLE.search(style.replace("_20_", " ")):
            return True
        seen.add(style)
        style = parents.get(style, "")
    return False


def _odt_walk(el: Any, blocks: list[tuple[str, str]], parents: dict[str, str], marker: str = "") -> None:
    for child in el:
        tag = child.tag
        if tag == _q("text", "h"):
            blocks.append(("text", heading(int(child.get(_q("text", "outline-level"), "1")), _odf_text(child))))
        elif tag == _q("text", "p"):
            text = _odf_text(child)
            if _odf_is_code(child.get(_q("text", "style-name"), ""), parents):
                blocks.extend(("code", line) for line in text.split("\n"))
            elif text.strip():
                blocks.append(("text", marker + " ".join(text.split())))
        elif tag == _q("text", "list"):
            for item in child.iter(_q("text", "list-item")):
                for p in item.findall(_q("text", "p")):
                    if text := " ".join(_odf_text(p).split()):
                        blocks.append(("text", "- " + text))
        elif tag == _q("table", "table"):
            rows = []
            for row in child.iter(_q("table", "table-row")):
                cells = [" ".join(_odf_text(c).split()) for c in row.iter(_q("table", "table-cell"))]
                if line := " | ".join(c for c in cells if c):
                    rows.append(line)
            blocks.append(("text", "\n".join(rows)))
        elif tag in (_q("text", "section"), _q("text", "list-item"), _q("office", "text")):
            _odt_walk(child, blocks, parents, marker)


def _odf_text(el: Any) -> str:
    """A paragraph's text: text:s is that many spaces, text:tab a tab, text:line-break a new line."""
    parts = [el.text or ""]
    for child in el:
        tag = child.tag
        if tag == _q("text", "s"):
            parts.append(" " * int(child.get(_q("text", "c"), "1")))
        elif tag == _q("text", "tab"):
            parts.append("\t")
        elif tag == _q("text", "line-break"):
            parts.append("\n")
        elif tag != _q("text", "note"):  # footnote bodies would break the sentence they are anchored in
            parts.append(_odf_text(child))
        parts.append(child.tail or "")
    return "".join(parts)


# ----------------------------------------------------------------------------------------------------------------
# EPUB: the OPF spine's XHTML documents in reading order, each an HTML record


def read_epub(path: Path, doc_id: str) -> list[dict[str, Any]]:
    from lxml import etree

    with zipfile.ZipFile(path) as z:
        container = etree.fromstring(z.read("META-INF/container.xml"))
        rootfile = next((el.get("full-path") for el in container.iter() if el.tag.endswith("rootfile")), None)
        if not rootfile:
            raise Unreadable("damaged", "META-INF/container.xml names no rootfile (the OPF package)")
        opf = etree.fromstring(z.read(rootfile))
        manifest = {el.get("id"): el for el in opf.iter() if el.tag.endswith("}item")}
        base = posixpath.dirname(rootfile)
        out = []
        for ref in (el for el in opf.iter() if el.tag.endswith("}itemref")):
            item = manifest.get(ref.get("idref"))
            if item is None or "html" not in (item.get("media-type") or ""):
                continue
            href = item.get("href") or ""
            data = z.read(posixpath.normpath(posixpath.join(base, href)))
            text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")
            out.append({"id": f"{doc_id}#{href}", "text": text, "format": "html",
                        "meta": {"document": doc_id, "chapter": href}})  # fmt: skip
    if not out:
        raise Unreadable("empty", "the EPUB's spine lists no XHTML document")
    return out
