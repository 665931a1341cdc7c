"""A record as read -> the documents the data stage judges: a PDF, DOCX, ODT or EPUB converted (formats.py), every
long one cut into sections (sections.py), each with its size estimated on the text as read.

The extract pass runs it in the workers; the Q&A stage runs it again to recover a section's structure (`reread`),
so both see exactly the same sections under the same ids.

    for doc in as_read(record, cfg):     # doc["est_tokens"]: what the split is sized on
        ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forge.config import DataConfig
from pretrain.data import filters, formats, html, sections, textblocks
from pretrain.data.splits import est_tokens

Record = dict[str, Any]


def as_read(record: Record, cfg: DataConfig) -> list[Record]:
    """The record's documents: converted when it is a packaged format, cut when long; Unreadable when it has no text.

    Each gets "est_tokens" (of an HTML page its visible text less its links: nothing judged), "raw_chars" (the size of
    what was read) and "meta.format" (the file format, for the report)."""
    fmt = record.get("format", "text")
    if fmt in formats.FORMATS.values():
        converted = formats.read_document(Path(record["source"]), record["id"])
        converted = [{**record, **c, "meta": {**record.get("meta", {}), **c["meta"]}} for c in converted]
    else:
        converted = [record]
    converted = [d if d.get("format") == "html" else {**d, "text": filters.nfc(d["text"]).strip()} for d in converted]
    out = []
    for doc in converted:
        if len(doc["text"]) > cfg.max_doc_bytes:
            raise textblocks.Unreadable("too_large", f"{len(doc['text'])} chars of text > data.max_doc_bytes="
                                     f"{cfg.max_doc_bytes}")  # fmt: skip
        meta = {**doc.get("meta", {}), "format": doc.get("meta", {}).get("format") or fmt}
        for section in sections.cut({**doc, "meta": meta}, cfg.max_section_tokens, size_of(doc)):
            removed = dict(section.get("removed", {}))
            raw = len(section["text"]) + sum(removed.values())  # what the reader took away counts as read
            out.append({**section, "est_tokens": size_of(section), "raw_chars": raw})
    return out


def size_of(doc: Record) -> int:
    """Estimated tokens of a document as read: an HTML page's visible text less its links (html.sized_text),
    else its text."""
    if doc.get("format") == "html":
        return est_tokens(html.sized_text(html.parse_html(doc["text"])))
    return est_tokens(doc["text"])


# ----------------------------------------------------------------------------------------------------------------
# the Q&A stage: a kept document's structure, read again from its file

_CACHE: dict[tuple[str, str], dict[str, Record]] = {}
CACHED_FILES = 4  # a long PDF's sections lie in all three splits, read one split after the other


def reread(doc_id: str, source: str | None, cfg: DataConfig) -> Record | None:
    """The document `doc_id` as the data stage read it from `source` (before cleaning), or None when the file is
    gone, changed or is a row of a JSONL/Parquet file (whose cleaned text is then all there is)."""
    from pretrain.data import ingest

    path = Path(source) if source else None
    if path is None or not path.is_file() or ingest.suffix_of(path) not in ingest.PAGE_SUFFIXES:
        return None
    file_id = doc_id.split("#")[0]  # a section's or an EPUB chapter's id is its file's id, "#", its own name
    key = (str(path), file_id)
    if key not in _CACHE:
        found: dict[str, Record] = {}
        for record in ingest.iter_file(path, file_id, cfg):
            if "skip" in record:
                continue
            try:
                found |= {d["id"]: d for d in as_read(record, cfg)}
            except textblocks.Unreadable:
                continue
        while len(_CACHE) >= CACHED_FILES:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = found
    return _CACHE[key].get(doc_id)
