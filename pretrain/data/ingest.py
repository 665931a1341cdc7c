"""Read the corpus: a directory tree (or single file) of text, HTML, JSONL, Parquet, PDF, DOCX, ODT and EPUB, or the
embedded corpus.

`iter_inputs` streams one item at a time: a record `{"id", "text", "source", "meta", "format"}` or, for an input it
cannot read, a skip `{"skip": reason, "id", "source", "detail"}`. Nothing here raises on bad data: binary files,
invalid UTF-8, empty files, oversized files or lines and permission errors become skips that the report counts.

A PDF, DOCX, ODT or EPUB file is streamed as a record with its path and no text: the data stage's workers convert
it (pretrain/data/formats.py), so a folder of PDFs is read on every core, not by the process that lists it.

Ids are stable: `<input dir name>/<relative path>` for a file, `...#<line>` / `...#<row>` for a JSONL line or a
Parquet row (or the record's own `id` field when it has one), `python-stdlib:<module>.<object>` for the builtin.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import zstandard

from forge import ForgeError
from forge.config import BUILTIN_CORPUS, DataConfig
from pretrain.data import stdlib_corpus
from pretrain.data.formats import FORMATS

TEXT_SUFFIXES = {".txt", ".md", ".rst"}
HTML_SUFFIXES = {".html", ".htm"}
JSONL_SUFFIXES = {".jsonl", ".jsonl.gz", ".jsonl.zst"}
PARQUET_SUFFIXES = {".parquet"}
DOCUMENT_SUFFIXES = set(FORMATS)  # converted in the workers: see formats.py
PAGE_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | DOCUMENT_SUFFIXES  # a file that is one document (or one book)
READ_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | JSONL_SUFFIXES | PARQUET_SUFFIXES | DOCUMENT_SUFFIXES
META_FIELDS = ("date", "source", "url", "title", "id")  # JSONL/Parquet fields kept in a record's meta
BINARY_SNIFF = 8192


def suffix_of(path: Path) -> str:
    name = path.name.lower()
    for suffix in (".jsonl.gz", ".jsonl.zst"):
        if name.endswith(suffix):
            return suffix
    return path.suffix.lower()


# ----------------------------------------------------------------------------------------------------------------
# which inputs, and what identifies them for the stage's skip key


def resolve_inputs(cfg: DataConfig) -> list[str | Path]:
    """The configured inputs as the builtin corpus name or existing paths; a missing path is a ForgeError."""
    if not cfg.inputs:
        raise ForgeError(f"data.inputs is empty; set it to a directory of documents or [{BUILTIN_CORPUS!r}]")
    resolved: list[str | Path] = []
    for item in cfg.inputs:
        if item == BUILTIN_CORPUS:
            resolved.append(item)
            continue
        path = Path(item).expanduser()
        if not path.exists():
            raise ForgeError(
                f"data.inputs: {item} does not exist; give a directory or file of documents, or {BUILTIN_CORPUS!r}"
            )
        resolved.append(path)
    return resolved


def input_fingerprints(cfg: DataConfig) -> dict[str, str]:
    """Skip-key inputs: the builtin corpus by its builder id, a path by the content of every file under it.

    Files we cannot read are fingerprinted by their error instead of failing the hash (they are skipped later).
    """
    out: dict[str, str] = {}
    for i, item in enumerate(resolve_inputs(cfg)):
        if isinstance(item, str):
            out[f"input{i}"] = stdlib_corpus.corpus_id()
            continue
        digest = hashlib.sha256()
        files = [item] if item.is_file() else sorted(p for p in item.rglob("*") if p.is_file())
        for file in files:
            digest.update(file.relative_to(item.parent if item.is_file() else item).as_posix().encode() + b"\0")
            try:
                with open(file, "rb") as fh:
                    while block := fh.read(1 << 20):
                        digest.update(block)
            except OSError as exc:
                digest.update(f"<unreadable {type(exc).__name__}>".encode())
            digest.update(b"\n")
        out[f"input{i}"] = f"path:{item.resolve()}:{digest.hexdigest()}"
    return out


# ----------------------------------------------------------------------------------------------------------------
# streaming every document


def iter_inputs(cfg: DataConfig) -> Iterator[dict[str, Any]]:
    for item in resolve_inputs(cfg):
        if isinstance(item, str):
            for record in stdlib_corpus.iter_stdlib_records():
                yield {**record, "format": "text"}
        elif item.is_file():
            yield from iter_file(item, item.name, cfg)
        else:
            for path in sorted(p for p in item.rglob("*") if p.is_file()):
                yield from iter_file(path, f"{item.name}/{path.relative_to(item).as_posix()}", cfg)


def skip(reason: str, doc_id: str, source: str, detail: str = "") -> dict[str, Any]:
    return {"skip": reason, "id": doc_id, "source": source, "detail": detail}


def read_bytes(path: Path) -> bytes:
    """One place that opens input files (tests make it raise PermissionError: root ignores chmod)."""
    with open(path, "rb") as fh:
        return fh.read()


def iter_file(path: Path, doc_id: str, cfg: DataConfig) -> Iterator[dict[str, Any]]:
    suffix = suffix_of(path)
    source = str(path)
    if suffix in TEXT_SUFFIXES | HTML_SUFFIXES:
        yield _read_text_file(path, doc_id, source, "html" if suffix in HTML_SUFFIXES else "text", cfg)
    elif suffix in JSONL_SUFFIXES:
        yield from _read_jsonl(path, doc_id, source, suffix, cfg)
    elif suffix in PARQUET_SUFFIXES:
        yield from _read_parquet(path, doc_id, source, cfg)
    elif suffix in DOCUMENT_SUFFIXES:
        yield _document_file(path, doc_id, source)
    elif not path.name.startswith("."):
        yield skip("unsupported_type", doc_id, source, f"suffix {suffix or '(none)'} is not one of the read types")


def _read_text_file(path: Path, doc_id: str, source: str, fmt: str, cfg: DataConfig) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > cfg.max_doc_bytes:
            return skip("too_large", doc_id, source, f"{size} bytes > data.max_doc_bytes={cfg.max_doc_bytes}")
        data = read_bytes(path)
    except PermissionError as exc:
        return skip("permission_denied", doc_id, source, str(exc))
    except OSError as exc:
        return skip("unreadable", doc_id, source, f"{type(exc).__name__}: {exc}")
    record = decode_document(data, doc_id, source)
    if "skip" in record:
        return record
    return {**record, "meta": {}, "format": fmt}


def _document_file(path: Path, doc_id: str, source: str) -> dict[str, Any]:
    """A PDF/DOCX/ODT/EPUB as a record to convert later: its path, its format, no text yet. Its file size is not
    its text's (images, fonts): data.max_doc_bytes is checked on the converted text."""
    return {"id": doc_id, "text": "", "source": source, "meta": {}, "format": FORMATS[suffix_of(path)]}


def decode_document(data: bytes, doc_id: str, source: str) -> dict[str, Any]:
    """Bytes -> {"id", "text", "source"} or a skip: binary (a NUL byte), invalid UTF-8, empty."""
    if b"\0" in data[:BINARY_SNIFF]:
        return skip("binary", doc_id, source, "NUL byte in the first 8 KB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return skip("invalid_utf8", doc_id, source, f"byte {exc.start}: {exc.reason}; re-encode the file as UTF-8")
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        return skip("empty", doc_id, source, "no non-whitespace text")
    return {"id": doc_id, "text": text, "source": source}


def _open_jsonl(path: Path, suffix: str) -> io.BufferedIOBase:
    raw = open(path, "rb")  # noqa: SIM115 - closed by the wrapper or below
    if suffix == ".jsonl.gz":
        return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]
    if suffix == ".jsonl.zst":
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return raw  # type: ignore[return-value]


def _read_jsonl(path: Path, doc_id: str, source: str, suffix: str, cfg: DataConfig) -> Iterator[dict[str, Any]]:
    try:
        fh = _open_jsonl(path, suffix)
    except PermissionError as exc:
        yield skip("permission_denied", doc_id, source, str(exc))
        return
    except OSError as exc:
        yield skip("unreadable", doc_id, source, f"{type(exc).__name__}: {exc}")
        return
    lineno = 0
    try:
        with fh:
            while True:
                line = fh.readline(cfg.max_doc_bytes + 1)
                if not line:
                    break
                lineno += 1
                line_id = f"{doc_id}#{lineno}"
                if len(line) > cfg.max_doc_bytes and not line.endswith(b"\n"):
                    while (rest := fh.readline(1 << 20)) and not rest.endswith(b"\n"):
                        pass  # drain the oversized line without holding it
                    yield skip("too_large", line_id, source, f"line longer than data.max_doc_bytes={cfg.max_doc_bytes}")
                    continue
                if not line.strip():
                    continue
                yield _jsonl_record(line, line_id, source, cfg)
    except (OSError, EOFError, zstandard.ZstdError) as exc:
        yield skip("unreadable", f"{doc_id}#{lineno + 1}", source, f"{type(exc).__name__}: {exc} (truncated file?)")


def _jsonl_record(line: bytes, line_id: str, source: str, cfg: DataConfig) -> dict[str, Any]:
    decoded = decode_document(line, line_id, source)
    if "skip" in decoded:
        return decoded
    try:
        obj = json.loads(decoded["text"])
    except json.JSONDecodeError as exc:
        return skip("bad_json", line_id, source, f"{exc.msg} at column {exc.colno}")
    if not isinstance(obj, dict):
        return skip("bad_json", line_id, source, "a line must be a JSON object")
    return _row_record(obj, line_id, source, cfg)


def _row_record(row: dict[str, Any], row_id: str, source: str, cfg: DataConfig) -> dict[str, Any]:
    text = row.get(cfg.text_field)
    if not isinstance(text, str):
        fields = ", ".join(sorted(map(str, row))[:12])
        return skip(
            "missing_field", row_id, source,
            f"no string field {cfg.text_field!r} (fields: {fields}); set data.text_field to the text column",
        )  # fmt: skip
    if not text.strip():
        return skip("empty", row_id, source, f"field {cfg.text_field!r} is empty")
    if len(text) > cfg.max_doc_bytes:
        return skip("too_large", row_id, source, f"{len(text)} chars > data.max_doc_bytes={cfg.max_doc_bytes}")
    meta = {k: row[k] for k in (*META_FIELDS, cfg.date_field) if k in row and row[k] is not None}
    doc_id = str(meta.pop("id", row_id))
    if "source" in meta:
        meta["origin"] = meta.pop("source")
    meta = {k: v if isinstance(v, (str, int, float, bool)) else str(v) for k, v in meta.items()}
    fmt = "html" if str(row.get("format", "")).lower() == "html" else "text"
    return {"id": doc_id, "text": text.replace("\r\n", "\n"), "source": source, "meta": meta, "format": fmt}


def _read_parquet(path: Path, doc_id: str, source: str, cfg: DataConfig) -> Iterator[dict[str, Any]]:
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
    except PermissionError as exc:
        yield skip("permission_denied", doc_id, source, str(exc))
        return
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        yield skip("unreadable", doc_id, source, f"not a readable Parquet file: {exc}")
        return
    if cfg.text_field not in names:
        yield skip(
            "missing_field", doc_id, source,
            f"no column {cfg.text_field!r} (columns: {', '.join(names)}); set data.text_field to the text column",
        )  # fmt: skip
        return
    columns = [c for c in (cfg.text_field, *META_FIELDS, cfg.date_field, "format") if c in names]
    row = 0
    for batch in pf.iter_batches(batch_size=1024, columns=list(dict.fromkeys(columns))):
        for obj in batch.to_pylist():
            yield _row_record(obj, f"{doc_id}#{row}", source, cfg)
            row += 1
