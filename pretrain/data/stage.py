"""`forge data`: ingest -> split -> clean -> deduplicate -> write shards and a report of what was removed.

    forge data --config configs/tiny-cpu.yaml
    forge data --set data.inputs='[corpus/]' --set data.dedup.jaccard_threshold=0.85

Outputs in runs/<run>/data/:
  <split>-<NNNNN>.parquet  cleaned documents: id, text, source, meta (JSON); one empty shard for an empty split
  removed.jsonl.zst        every removed document: id, split, source, filter, rule, reason, value, chars, text (cut)
  report.json, report.md   the splits (ratios, tokens assigned and kept), per filter and rule what was removed, the
                           calibration of every rule on the train split (flagged rules with examples and the
                           setting to change), the largest dropped documents per rule, duplicate clusters, storage
  removed_by_filter.png    the removal breakdown (markup counted apart, not as removed text)
  calibration.png          the distribution of each rule that fails train documents, against its threshold

The order: read -> convert PDF/DOCX/ODT/EPUB, cut long documents into sections, extract HTML main content (sizes
measured on the text as read: documents.py) -> split (splits.py: the hash of each id, val/test
sized in tokens) -> clean (every rule measured for the calibration, then applied) -> dedup -> shards.

A crash costs only the pass it hit: each completed pass leaves its result under `.work/` (pass_state.py), and the
same command with the same settings and inputs continues after the last one; `.work/` goes when the stage completes.

Memory stays bounded: records stream through two spill files under `.work/`; the main process
keeps ~130 B per document (exact hash, split, 14 LSH keys) plus the n-gram sets of candidate pairs only; paragraph
dedup keeps its hashes in sorted runs under `.work/paragraphs/` (paragraphs.py), a few 64 MB buffers whatever the
corpus.

`data.executor: ray` runs the per-record passes and the LSH banding on Ray Data instead of the process pool
(pretrain/data/ray_executor.py); everything else, and so the output, is the same code.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from forge import ForgeError
from forge.config import ForgeConfig
from forge.io import remove_path
from forge.lineage import Stage, run_stage
from forge.progress import progress
from pretrain.data import calibrate, dedup, drops, filters, ingest, paragraphs, pass_state, report, splits
from pretrain.data.passes import batched, clean_batch, extract_batch, parallel_map, worker_count
from pretrain.data.splits import SPLITS, split_of

log = logging.getLogger("forge.data")

BATCH = 64  # records per pool task
SHARD_SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("meta", pa.string())])
SPILL_SCHEMA = pa.schema([
    ("id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("meta", pa.string()),
    ("split", pa.string()), ("raw_chars", pa.int64()), ("removed", pa.string()),
])  # fmt: skip
SPLIT_PRIORITY = {"test": 0, "val": 1, "train": 2}  # which copy of a duplicate is kept: test, then val, then train


def run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    stage = Stage(name="data", cfg=cfg, inputs=ingest.input_fingerprints(cfg.data))
    key = stage.skip_key()  # also what an interrupted attempt's passes must match to be resumed (pass_state.py)
    return run_stage(stage, partial(build, key=key, resume=not force), force, key=key)


# ----------------------------------------------------------------------------------------------------------------
# spill files: records between passes, on disk


class Spill:
    def __init__(self, path: Path):
        self.path, self.rows = path, 0
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(path, SPILL_SCHEMA, compression="zstd")

    def write(self, records: list[dict[str, Any]]) -> None:
        if records and self._writer is not None:
            rows = [{**_row(r), "split": r["split"], "raw_chars": r["raw_chars"],
                     "removed": json.dumps(r.get("removed", {}))} for r in records]  # fmt: skip
            self._writer.write_table(pa.Table.from_pylist(rows, schema=SPILL_SCHEMA))
            self.rows += len(records)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.close()
        for batch in pq.ParquetFile(self.path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                yield {**row, "meta": json.loads(row["meta"]), "removed": json.loads(row["removed"])}


def _row(record: dict[str, Any]) -> dict[str, str]:
    return {"id": record["id"], "text": record["text"], "source": record["source"],
            "meta": json.dumps(record.get("meta", {}), ensure_ascii=False, sort_keys=True)}  # fmt: skip


class ShardWriter:
    """<split>-<NNNNN>.parquet with at most `shard_docs` rows each; an empty split still gets one empty shard."""

    def __init__(self, directory: Path, split: str, shard_docs: int):
        self.directory, self.split, self.shard_docs = directory, split, shard_docs
        self.shards: list[str] = []
        self._buffer: list[dict[str, str]] = []
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_shard = 0

    def _tmp(self, name: str) -> Path:
        return self.directory / f".{name}.tmp"

    def write(self, record: dict[str, Any]) -> None:
        if self._writer is None or self._rows_in_shard >= self.shard_docs:
            self._finish()
            name = f"{self.split}-{len(self.shards):05d}.parquet"
            self.shards.append(name)
            self._writer = pq.ParquetWriter(self._tmp(name), SHARD_SCHEMA, compression="zstd")
            self._rows_in_shard = 0
        self._buffer.append(_row(record))
        self._rows_in_shard += 1
        if len(self._buffer) >= 1024:
            self._flush()

    def _flush(self) -> None:
        if self._buffer and self._writer is not None:
            self._writer.write_table(pa.Table.from_pylist(self._buffer, schema=SHARD_SCHEMA))
            self._buffer = []

    def _finish(self) -> None:
        if self._writer is not None:
            self._flush()
            self._writer.close()
            self._writer = None
            name = self.shards[-1]
            self._tmp(name).replace(self.directory / name)  # complete shards only under the final name

    def close(self) -> list[str]:
        if not self.shards:
            name = f"{self.split}-00000.parquet"
            pq.write_table(SHARD_SCHEMA.empty_table(), self._tmp(name))
            self._tmp(name).replace(self.directory / name)
            self.shards.append(name)
        self._finish()
        return self.shards


# ----------------------------------------------------------------------------------------------------------------
# the stage body


Mapper = Callable[..., Iterator[Any]]  # (fn, batches, initargs=...) -> fn(batch) for each batch, in order
PairFinder = Callable[..., np.ndarray]  # dedup.candidate_pairs(keys, allowed)


@contextlib.contextmanager
def executor(cfg, work: Path) -> Iterator[tuple[Mapper, PairFinder]]:
    """(map a batch function over batches in order, find candidate pairs) on data.executor."""
    workers = worker_count(cfg)
    if cfg.executor == "local":
        yield partial(parallel_map, workers=workers), dedup.candidate_pairs
        return
    from pretrain.data import ray_executor

    with ray_executor.session(cfg, workers) as cpus:
        yield partial(ray_executor.ray_map, cpus=cpus, work=work), partial(ray_executor.candidate_pairs, cpus=cpus)


def build(stage: Stage, key: dict[str, Any] | None = None, resume: bool = True) -> dict[str, float]:
    cfg, seed, out = stage.cfg.data, stage.cfg.seed, stage.dir
    _clear_outputs(out)
    work = out / ".work"
    if not resume:  # --force: every pass again, whatever an interrupted attempt left
        remove_path(work)
    passes = pass_state.Passes(work, key or stage.skip_key())
    stats = passes.stats(lambda: report.Stats(drops.FILTERS, out / "removed.jsonl.zst", work))
    try:
        with executor(cfg, work) as (mapper, find_pairs):
            extracted, sketch, plan = passes.run("extract", stats, lambda: _extract(cfg, seed, work, mapper, stats))
            cleaned, ids, hashes, keys, split_rows, cal = passes.run(
                "clean", stats, lambda: _clean(cfg, seed, work, mapper, stats, extracted, sketch, plan)
            )
            removed = passes.run(
                "dedup", stats, lambda: _deduplicate(cfg, cleaned, ids, hashes, keys, split_rows, stats, find_pairs)
            )
        paragraph_dedup = passes.run("paragraphs", stats, lambda: _index_paragraphs(cfg, work, cleaned, removed))
        split_totals = _write_splits(cfg, out, cleaned, removed, stats, paragraph_dedup)
    finally:
        stats.close()
    passes.finish()
    calibration = cal.summary()
    split_plan = {"ratios": plan.ratios, "assigned_tokens": plan.assigned_tokens, "total_tokens": plan.total_tokens,
                  "min_eval_tokens": cfg.min_eval_tokens, "max_eval_fraction": cfg.max_eval_fraction,
                  "configured": dict(cfg.split), "notes": plan.notes}  # fmt: skip
    summary = report.write(out, stats, split_totals, stage.cfg, split_plan, calibration)
    _warn(calibration, split_plan, split_totals, out)
    kept = sum(t["docs"] for t in split_totals.values())
    log.info(
        "data: kept %d of %d documents (%.1f%% of the text removed, markup apart); train/val/test %s documents, "
        "%s est. tokens; report: %s",
        kept, stats.raw_docs, summary["removed_pct_chars"], "/".join(str(split_totals[s]["docs"]) for s in SPLITS),
        "/".join(f"{split_totals[s]['est_tokens']:,}" for s in SPLITS), out / "report.md",
    )  # fmt: skip
    if kept == 0:
        raise ForgeError(
            f"data: every one of the {stats.raw_docs} input documents was removed; read {out / 'report.md'} "
            "to see which filter removed them and loosen it (e.g. --set data.quality.min_words=10) "
            "or check data.inputs"
        )
    return summary


def _warn(calibration: dict[str, Any], plan: dict[str, Any], totals: dict[str, Any], out: Path) -> None:
    """The log says what the report flags: a rule that drops a large share, val/test below their minimum."""
    for rule in calibration["rules"]:
        if rule["flagged"]:
            biggest = ", ".join(e["id"] for e in rule["examples"][:3])
            log.warning(
                "data: %s alone would drop %.1f%% of the train documents (%d; %s = %s), e.g. %s; to keep 90%%: %s "
                "(see %s)", rule["rule"], rule["failing_pct"], rule["failing"], rule["setting"], rule["threshold"],
                biggest, rule["set"], out / "report.md",
            )  # fmt: skip
    for note in plan["notes"]:
        log.warning("data: %s", note)
    for split in ("val", "test"):
        if plan["assigned_tokens"][split] >= plan["min_eval_tokens"] > totals[split]["est_tokens"]:
            log.warning(
                "data: %s was assigned ~%s est. tokens but holds ~%s after cleaning, below data.min_eval_tokens=%s",
                split, f"{plan['assigned_tokens'][split]:,}", f"{totals[split]['est_tokens']:,}",
                f"{plan['min_eval_tokens']:,}",
            )  # fmt: skip


OUTPUT_FILES = ("removed.jsonl.zst", "report.json", "report.md", "removed_by_filter.png", "calibration.png")


def _clear_outputs(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path in out.iterdir():
        if path.is_file() and (
            re.fullmatch(r"(train|val|test)-\d{5}\.parquet", path.name) or path.name in OUTPUT_FILES
        ):
            path.unlink()


def _ingested(cfg, stats: report.Stats) -> Iterator[dict[str, Any]]:
    """Records as read; unreadable inputs logged (they never get a split: nothing of them is kept)."""
    for item in ingest.iter_inputs(cfg):
        if "skip" in item:
            skipped = {**item, "split": "-", "text": "", "raw_chars": 0}
            stats.count_raw(skipped)
            stats.drop(skipped, "unreadable", f"{item['skip']}: {item['detail']}")
            continue
        yield {**item, "split": "-", "raw_chars": len(item["text"])}  # as_read sets each document's own size


def _extract(cfg, seed: int, work: Path, mapper: Mapper, stats: report.Stats):
    """Pass 1: extraction, the boilerplate line counts, and the split plan from every document's size."""
    spill = Spill(work / "extracted.parquet")
    sketch = filters.LineSketch() if cfg.boilerplate else None
    units: list[float] = []
    tokens: list[int] = []
    records = progress(_ingested(cfg, stats), desc="data: read + extract", unit="doc", logger=log)
    for results in mapper(extract_batch, batched(records, BATCH), initargs=(cfg, seed)):
        kept = []
        for record, line_hashes in results:
            stats.count_raw(record)
            if "drop" in record:
                stats.drop(record, record["drop"], record["reason"])
                continue
            kept.append(record)
            units.append(splits.hash_unit(record["id"]))
            tokens.append(record["est_tokens"])
            if sketch is not None and line_hashes is not None and len(line_hashes):
                sketch.add(line_hashes)
        spill.write(kept)
    spill.close()
    if stats.raw_docs == 0:
        raise ForgeError(
            f"data: no documents found in data.inputs={cfg.inputs}; supported files: "
            f"{' '.join(sorted(ingest.READ_SUFFIXES))}"
        )
    return spill, sketch, splits.plan_split(np.array(units), np.array(tokens), cfg)


def _clean(cfg, seed, work, mapper: Mapper, stats, extracted: Spill, sketch, plan: splits.SplitPlan):
    """Pass 2: each record gets its split (from its id), then the filters; train records feed the calibration."""
    ratios = plan.ratios
    cal = calibrate.Calibration(cfg, expected_train_docs=round(extracted.rows * ratios["train"]))
    min_docs = max(cfg.boilerplate_min_docs, math.ceil(cfg.boilerplate_min_doc_fraction * extracted.rows))
    initargs = (cfg, seed, sketch.table if sketch is not None else None, min_docs)
    spill = Spill(work / "cleaned.parquet")
    ids: list[str] = []
    hashes: list[int] = []
    split_rows: list[int] = []
    keys: list[np.ndarray] = []
    records = ({**r, "split": split_of(r["id"], ratios)} for r in extracted)
    records = progress(records, total=extracted.rows, desc="data: filter", unit="doc", logger=log)
    for results, batch_keys in mapper(clean_batch, batched(records, BATCH), initargs=initargs):
        kept = []
        for record in results:
            cal.add(record)
            if "drop" in record:
                stats.drop(record, record["drop"], record["reason"])
                continue
            kept.append(record)
            ids.append(record["id"])
            hashes.append(record["exact_hash"])
            split_rows.append(SPLIT_PRIORITY[record["split"]])
        keys.append(batch_keys)
        spill.write(kept)
    spill.close()
    all_keys = np.concatenate(keys) if keys else np.zeros((0, cfg.dedup.bands), dtype=np.uint64)
    return spill, ids, np.array(hashes, dtype=np.uint64), all_keys, np.array(split_rows, dtype=np.int64), cal


def _deduplicate(cfg, cleaned: Spill, ids: list[str], hashes, keys, splits, stats,
                 find_pairs: PairFinder = dedup.candidate_pairs) -> dict[int, tuple[str, str, str]]:  # fmt: skip
    """Row of the cleaned spill -> (filter, reason, kept copy) for every document removed as a duplicate."""
    n = len(hashes)
    removed: dict[int, tuple[str, str, str]] = {}
    if n == 0:
        return removed
    # Without decontamination, copies in different splits are not duplicates of each other.
    group_split = np.zeros(n, dtype=np.int64) if cfg.dedup.decontaminate else splits
    alive = np.ones(n, dtype=bool)
    if cfg.dedup.exact:
        _, labels = np.unique(np.stack([hashes, group_split.astype(np.uint64)], axis=1), axis=0, return_inverse=True)
        labels = labels.ravel()
        keep = dedup.keep_mask(labels, splits)
        kept_row = _kept_row_of(labels, keep)
        sizes = np.bincount(labels)
        stats.clusters["exact"] = report.cluster_stats(sizes[sizes > 1])
        for row in np.flatnonzero(~keep).tolist():
            removed[row] = _dup_reason("exact_dedup", row, kept_row[row], ids, splits, "exact copy of")
        alive &= keep
    if cfg.dedup.near:
        rows = np.flatnonzero(alive)
        pair_allowed = None if cfg.dedup.decontaminate else (lambda i, j: group_split[rows[i]] == group_split[rows[j]])
        pairs = find_pairs(keys[rows], pair_allowed)
        sets = _shingle_sets(cleaned, rows[np.unique(pairs)] if len(pairs) else np.zeros(0, dtype=np.int64), cfg)
        labels, verified = dedup.verified_clusters(
            len(rows), pairs, lambda i, j: dedup.jaccard(sets[rows[i]], sets[rows[j]]), cfg.dedup.jaccard_threshold
        )
        keep = dedup.keep_mask(labels, splits[rows])
        kept_local = _kept_row_of(labels, keep)
        best_j: dict[int, float] = {}
        for i, j, sim in verified:
            for x in (i, j):
                best_j[x] = max(best_j.get(x, 0.0), sim)
        sizes = np.bincount(labels)
        stats.clusters["near"] = report.cluster_stats(sizes[sizes > 1])
        stats.clusters["near"]["candidate_pairs"] = int(len(pairs))
        stats.clusters["near"]["verified_pairs"] = len(verified)
        for local in np.flatnonzero(~keep).tolist():
            row, kept = int(rows[local]), int(rows[kept_local[local]])
            removed[row] = _dup_reason("near_dedup", row, kept, ids, splits, f"J={best_j.get(local, 0):.2f} with")
    return removed


def _kept_row_of(labels: np.ndarray, keep: np.ndarray) -> np.ndarray:
    kept_of_label = np.full(labels.max() + 1, -1, dtype=np.int64)
    kept_of_label[labels[keep]] = np.flatnonzero(keep)
    return kept_of_label[labels]


def _dup_reason(kind: str, row: int, kept: int, ids: list[str], splits: np.ndarray,
                what: str) -> tuple[str, str, str]:  # fmt: skip
    """(filter, reason, id of the copy that is kept)."""
    names = {v: k for k, v in SPLIT_PRIORITY.items()}
    if splits[row] != splits[kept]:
        return "decontamination", f"{what} {ids[kept]} ({names[int(splits[kept])]})", ids[kept]
    return kind, f"{what} {ids[kept]}", ids[kept]


def _shingle_sets(cleaned: Spill, rows: np.ndarray, cfg) -> dict[int, np.ndarray]:
    """The n-gram sets of the candidate documents only (verification), read back from the spill."""
    wanted = set(rows.tolist())
    sets: dict[int, np.ndarray] = {}
    if not wanted:
        return sets
    for row, record in enumerate(cleaned):
        if row in wanted:
            sets[row] = dedup.shingles(record["text"], cfg.dedup.ngram)
    return sets


def _index_paragraphs(cfg, work: Path, cleaned: Spill, removed: dict[int, Any]) -> paragraphs.ParagraphDedup | None:
    """The paragraph hashes of every document to be written, numbered in write order, sorted on disk."""
    if not cfg.dedup.paragraph:
        return None
    index = paragraphs.ParagraphDedup(cfg.dedup.min_paragraph_chars, work / "paragraphs")
    for row, record in enumerate(progress(cleaned, total=cleaned.rows, desc="data: paragraph hashes", unit="doc",
                                          logger=log)):  # fmt: skip
        if row not in removed:
            index.add(SPLIT_PRIORITY[record["split"]], record["text"])
    index.finish()
    return index


def _write_splits(cfg, out: Path, cleaned: Spill, removed: dict[int, tuple[str, str, str]], stats,
                  paragraph_dedup: paragraphs.ParagraphDedup | None) -> dict[str, Any]:  # fmt: skip
    """Paragraph dedup and the shards, test and val first so train loses the paragraphs they hold."""
    totals: dict[str, Any] = {}
    for split in ("test", "val", "train"):
        writer = ShardWriter(out, split, cfg.shard_docs)
        docs = chars = tokens = 0
        for row, record in enumerate(progress(cleaned, total=cleaned.rows, desc=f"data: write {split}", unit="doc",
                                              logger=log)):  # fmt: skip
            if record["split"] != split:
                continue
            if row in removed:
                kind, reason, kept_id = removed[row]
                stats.drop({**record, "duplicate_of": kept_id}, kind, reason)
                continue
            if paragraph_dedup is not None:
                text, cut = paragraph_dedup.apply(SPLIT_PRIORITY[split], record["text"])
                if not text:
                    stats.drop(record, "paragraph_dedup", "every paragraph already appeared in another document")
                    continue
                if cut:  # credited by length: rejoining the paragraphs may also normalise the blank lines between
                    edits = {**record["removed"], "paragraph_dedup": len(record["text"]) - len(text)}
                    record = {**record, "text": text, "removed": edits}
            stats.keep(record)
            writer.write(record)
            docs += 1
            chars += len(record["text"])
            tokens += splits.est_tokens(record["text"])
        totals[split] = {"docs": docs, "chars": chars, "est_tokens": tokens, "shards": writer.close()}
    if paragraph_dedup is not None:
        paragraph_dedup.check_applied()
    return {s: totals[s] for s in SPLITS}
