"""The per-record passes of `forge data`, as pure functions of (record, settings), and the process pool that maps
them over batches.

  extract_pass: PDF/DOCX/ODT/EPUB -> text, long documents -> sections (documents.py), HTML -> main text (markup
                and page chrome counted apart); the line hashes the boilerplate counter needs; the estimated tokens
                of the text as read, which the split is sized on (splits.py).
  clean_pass:   the split is assigned (from the id); boilerplate lines -> metadata -> language -> quality rules, all
                rules measured for the calibration (calibrate.py) -> dedup features (exact hash, LSH keys).

A record is a plain dict {"id", "text", "source", "meta", "format", "split", "raw_chars", "removed": {step: chars}}
so these passes could run unchanged on any engine that maps a function over rows. The result of a record is the
record (edited) or a dropped record that also carries "drop": filter, "reason", "rule" and "value".
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from forge.config import DataConfig
from forge.machine import usable_cores
from pretrain.data import calibrate, documents, filters, textblocks
from pretrain.data.dedup import NearDeduper, exact_hash
from pretrain.data.splits import SPLITS, split_of

__all__ = ["SPLITS", "split_of"]  # split_of is imported from here by the stages that hold documents out
Record = dict[str, Any]


def _drop(record: Record, drop: filters.Drop) -> Record:
    return {**record, "drop": drop.filter, "reason": drop.reason, "rule": drop.rule, "value": drop.value}


def _edit(record: Record, step: str, new_text: str) -> Record:
    return _credit(record, step, len(record["text"]) - len(new_text)) | {"text": new_text}


def _credit(record: Record, step: str, chars: int) -> Record:
    removed = dict(record.get("removed", {}))
    removed[step] = removed.get(step, 0) + chars
    return {**record, "removed": removed}


# ----------------------------------------------------------------------------------------------------------------
# pass 1: extraction


def extract_record(record: Record, cfg: DataConfig) -> list[tuple[Record, np.ndarray | None]]:
    """[(document or dropped document, its distinct line hashes for the boilerplate counter or None)] of one record
    as read: a PDF, DOCX, ODT or EPUB converted, a long document cut into sections (documents.py), then each one's
    HTML main content extracted.

    What HTML extraction takes away is counted in two parts: "markup" (tags, scripts, styles: never content) and
    "html_extraction" (visible text that is not the main content: navigation, sidebars, footers).

    "est_tokens" is what the split is sized on (splits.py): the text as read, of a page its visible text (markup
    gone, nothing judged), so no cleaning setting (extraction included) can move a document between splits.
    """
    try:
        docs = documents.as_read(record, cfg)
    except textblocks.Unreadable as exc:
        detail = f"{exc.reason}: {exc.detail}"
        return [(_drop({**record, "raw_chars": 0}, filters.Drop("unreadable", detail, exc.reason)), None)]
    return [_extract_one(doc, cfg) for doc in docs]


def _extract_one(record: Record, cfg: DataConfig) -> tuple[Record, np.ndarray | None]:
    if record.get("format") == "html":
        html = record["text"]
        root = filters.parse_html(html)
        visible = filters.visible_text(root)
        if cfg.html_extraction:
            text = filters.extract_html(root, cfg.html_extraction_favor)
            if isinstance(text, filters.Drop):  # the visible text is what the user would have wanted kept
                return _drop(_credit({**record, "text": visible}, "markup", len(html) - len(visible)), text), None
            chrome = max(len(visible) - len(text), 0)  # rendering adds list markers and fences: never below 0
            record = _credit(_credit(record, "markup", len(html) - len(text) - chrome), "html_extraction", chrome)
            record = {**record, "text": text}
        record = {**record, "format": "text"}
    hashes = filters.doc_line_hashes(record["text"]) if cfg.boilerplate else None
    return record, hashes


# ----------------------------------------------------------------------------------------------------------------
# pass 2: cleaning and dedup features


def clean_record(record: Record, cfg: DataConfig, sketch: filters.LineSketch | None, min_docs: int) -> Record:
    text = record["text"]
    if cfg.boilerplate:
        text = filters.remove_boilerplate(text, sketch, min_docs, cfg.boilerplate_min_line_words)
        if isinstance(text, filters.Drop):
            return _drop(record, text)
        record = _edit(record, "boilerplate", text)
    if drop := filters.metadata_filter(record.get("meta", {}), cfg):
        return _drop(record, drop)
    lang, score, judged = "und", 0.0, 0
    if cfg.language or cfg.quality.enabled:
        lang, score, judged = filters.judge_language(text, cfg)
        meta = {**record.get("meta", {}), "lang": lang, "lang_score": round(score, 4), "prose_words": judged}
        record = {**record, "meta": meta}
    # Every rule is measured (not only up to the first that fires): the calibration needs each distribution.
    values = filters.measure(text, cfg.quality, cfg.languages[0] if lang == "und" else lang)
    values[calibrate.LANGUAGE_METRIC] = calibrate.language_value(lang, score, judged, cfg)
    record = {**record, "metrics": values}
    drop = filters.language_filter(lang, score, cfg, judged) if cfg.language else None
    if drop := drop or filters.first_failure(values, cfg.quality):
        return _drop(record, drop)
    return {**record, "exact_hash": exact_hash(text)}


# ----------------------------------------------------------------------------------------------------------------
# batch functions run in the workers (settings arrive once, through the pool initializer)

_WORKER: dict[str, Any] = {}


def init_worker(cfg: DataConfig, seed: int, sketch_table: np.ndarray | None = None, min_docs: int = 0) -> None:
    _WORKER.clear()
    _WORKER.update(
        cfg=cfg,
        sketch=filters.LineSketch(sketch_table) if sketch_table is not None else None,
        min_docs=min_docs,
        deduper=NearDeduper(cfg.dedup, seed),
    )


def _guarded(step: Callable[[Record], Any], record: Record, failed: Callable[[Record], Any]) -> Any:
    """One record's failure (a bug or a pathological input) drops that record with the error, not the run."""
    try:
        return step(record)
    except Exception as exc:
        return failed(_drop(record, filters.Drop("unreadable", f"processing_error: {type(exc).__name__}: {exc}"[:300])))


def extract_batch(batch: list[Record]) -> list[tuple[Record, np.ndarray | None]]:
    out: list[tuple[Record, np.ndarray | None]] = []
    for r in batch:
        out += _guarded(lambda r: extract_record(r, _WORKER["cfg"]), r, lambda d: [(d, None)])
    return out


def clean_batch(batch: list[Record]) -> tuple[list[Record], np.ndarray]:
    """Cleaned records of a batch and the LSH band keys ([kept, bands] uint64) of the kept ones, in order."""
    cfg: DataConfig = _WORKER["cfg"]
    out = [
        _guarded(lambda r: clean_record(r, cfg, _WORKER["sketch"], _WORKER["min_docs"]), r, lambda d: d) for r in batch
    ]
    kept = [r["text"] for r in out if "drop" not in r]
    deduper: NearDeduper = _WORKER["deduper"]
    if cfg.dedup.near and kept:
        keys = deduper.band_keys(deduper.signatures([deduper.shingles(t) for t in kept]))
    else:
        keys = np.zeros((len(kept), cfg.dedup.bands), dtype=np.uint64)
    return out, keys


# ----------------------------------------------------------------------------------------------------------------
# the pool


def worker_count(cfg: DataConfig) -> int:
    """data.workers, or (0) the cores this process may run on."""
    if cfg.workers:
        return cfg.workers
    return usable_cores()


def parallel_map(fn: Callable[[Any], Any], batches: Iterable[Any], workers: int, initargs: tuple) -> Iterator[Any]:
    """fn over batches, results in input order, at most 2 x workers batches in flight (bounded memory).

    Workers are spawned (not forked: the parent holds MLflow's threads and sqlite handles). One worker runs
    inline, with no pool.
    """
    if workers <= 1:
        init_worker(*initargs)
        for batch in batches:
            yield fn(batch)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=init_worker, initargs=initargs) as pool:
        pending: deque = deque()
        for batch in batches:
            pending.append(pool.submit(fn, batch))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
