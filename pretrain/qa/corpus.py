"""Q&A pairs from the user's corpus: every document the data stage kept, read back with its structure.

The data stage's cleaned text has lost the markup of HTML pages (headings, definition lists, tables), so each kept
document's structure is taken from its input file when it still exists and is a document (HTML, Markdown, RST,
AsciiDoc, text, or the Markdown the PDF/DOCX/ODT/EPUB readers write; a section of one is cut the same way again;
pretrain/qa/structure.py), else from its cleaned text (JSONL and Parquet rows). The answers are always checked
against the cleaned text (pretrain/qa/extract.py), so every answer is text of its document's split: pairs from
train documents are what SFT trains on, pairs from val and test documents the held-out set, never trained on.

A corpus bigger than SFT needs is sampled, never read whole into memory: train documents are taken in the order of
a hash of their ids, lowest first, while their pairs fit in qa.max_train_pairs (TrainSample), so the sample is the
same whatever order the files list them in, and a document past the sample's bound is not even parsed. The title
segments are counted on a sample of TITLE_SAMPLE documents chosen the same way.

Across the corpus: title segments most pages share (the site's name) are not part of a subject, a long answer that
several documents carry word for word is boilerplate (a footer, a licence notice) and is dropped, then near-duplicate
answers are removed with held-out pairs preferred (pretrain/qa/dedup.py), which also decontaminates train.

    train, held_out, report = corpus_pairs(cfg, shards)   # shards: the data stage's {split: [parquet files]}
"""

from __future__ import annotations

import heapq
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from forge.config import ForgeConfig
from forge.hashing import hash_share
from forge.progress import progress
from pretrain.data.documents import reread
from pretrain.qa import prose, questions
from pretrain.qa.dedup import deduplicate
from pretrain.qa.extract import SHORT_ANSWER_QTYPES, Context, Pair, normalize, page_pairs, title_noise
from pretrain.qa.structure import Page, parse_html, parse_text
from pretrain.qa.teacher import teacher_pairs

log = logging.getLogger("forge.qa")

BOILERPLATE_DOCUMENTS = 3  # a long answer found word for word in this many documents is the site's, not the page's
HELD_OUT = ("val", "test")
TITLE_SAMPLE = 20_000  # documents whose titles are counted for the segments most pages share (the site's name)


class TrainSample:
    """The train documents of lowest id hash whose pairs fit in `cap` pairs, kept while the corpus streams by: a
    document that would overflow the cap pushes out the highest-hash ones, and from then on a document hashing above
    the last one pushed out is skipped unread (`wants`). cap None keeps every document."""

    def __init__(self, cap: int | None) -> None:
        self.cap, self.bound, self.size, self.dropped = cap, 1.0, 0, 0
        self.heap: list[tuple[float, int, list[dict[str, Any]]]] = []  # (-hash, arrival, pairs): the highest on top

    def wants(self, doc_id: str) -> bool:
        return hash_share(doc_id) < self.bound

    def add(self, doc_id: str, pairs: list[dict[str, Any]]) -> None:
        heapq.heappush(self.heap, (-hash_share(doc_id), len(self.heap) + self.dropped, pairs))
        self.size += len(pairs)
        while self.cap is not None and self.size > self.cap:
            negative, _, out = heapq.heappop(self.heap)
            self.size, self.bound, self.dropped = self.size - len(out), -negative, self.dropped + 1

    def pairs(self) -> list[dict[str, Any]]:
        """The kept pairs in the order their documents came."""
        return [p for _, _, pairs in sorted(self.heap, key=lambda entry: entry[1]) for p in pairs]


def documents(shards: dict[str, list[Path]]) -> Iterator[dict[str, Any]]:
    """Every kept document of the data stage: id, text, source, meta and its split."""
    for split, files in shards.items():
        for path in files:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
                for row in batch.to_pylist():
                    yield {**row, "meta": json.loads(row["meta"] or "{}"), "split": split}


def read_page(doc: dict[str, Any], cfg: ForgeConfig) -> tuple[Page, str]:
    """(the document's structure, where it came from: its format as read, or "cleaned text").

    A document read from a file (a page, a PDF, an office document, a section of one) is read again exactly as the
    data stage read it, before cleaning (pretrain/data/documents.py); a JSONL or Parquet row, or a file that has
    changed or gone since, has only its cleaned text."""
    found = reread(doc["id"], doc.get("source"), cfg.data)
    if found is None:
        return parse_text(doc["text"]), "cleaned text"
    if found.get("format") == "html":
        return parse_html(found["text"]), "html"
    return parse_text(found["text"]), str(found.get("meta", {}).get("format") or "text")


def prose_pairs(doc: dict[str, Any], page: Page, ctx: Context, answered: set[str]) -> list[Pair]:
    """Pairs mined from the document's running text (prose.py), but for sentences its structure already answers."""
    subject = prose.document_subject(page.title, doc["id"])
    lang = str(doc["meta"].get("lang") or ctx.lang)
    return [Pair(m.question, m.answer, m.kind, "") for m in prose.mine(doc["text"], lang, ctx.seed, subject)
            if normalize(m.answer) not in answered]  # fmt: skip


def language(doc: dict[str, Any], cfg: ForgeConfig) -> str:
    """The language questions are asked in: the one the data stage detected, else the first configured."""
    detected = doc["meta"].get("lang")
    return detected if detected in questions.WORDINGS else questions.language_of(cfg.data.languages[0])


def corpus_pairs(
    cfg: ForgeConfig, shards: dict[str, list[Path]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(train pairs, held-out pairs, report) of the corpus the data stage kept."""
    total = sum(pq.ParquetFile(f).metadata.num_rows for files in shards.values() for f in files)
    noise = title_noise(sample_titles(cfg, shards, total))
    skipped: Counter[str] = Counter()
    structure_from: Counter[str] = Counter()
    splits = {s: {"documents": 0, "words": 0, "with_pairs": 0} for s in ("train", *HELD_OUT)}
    held_pairs: list[dict[str, Any]] = []
    sample = TrainSample(cfg.qa.max_train_pairs)
    for doc in progress(documents(shards), total=total, desc="qa: extract", unit="doc", logger=log):
        counts = splits[doc["split"]]
        counts["documents"] += 1
        counts["words"] += len(doc["text"].split())
        if doc["split"] not in HELD_OUT and not sample.wants(doc["id"]):
            continue  # past the train sample's bound: not parsed
        page, origin = read_page(doc, cfg)
        structure_from[origin] += 1
        ctx = Context(normalize(doc["text"]), language(doc, cfg), cfg.seed, doc["id"], noise)
        found, why = page_pairs(page, ctx)
        skipped.update(why)
        if cfg.qa.prose:
            found += prose_pairs(doc, page, ctx, {normalize(p.answer) for p in found})
        counts["with_pairs"] += bool(found)
        rows = [{"question": p.question, "answer": p.answer, "qtype": p.qtype,
                 "source": {"kind": "corpus", "doc_id": doc["id"], "split": doc["split"], "heading": p.heading or None,
                            "path": doc.get("source")}} for p in found]  # fmt: skip
        held_pairs += rows if doc["split"] in HELD_OUT else []
        if doc["split"] not in HELD_OUT:
            sample.add(doc["id"], rows)
    pairs = sample.pairs() + held_pairs
    if sample.dropped:
        skipped[f"train document outside the sample of qa.max_train_pairs={cfg.qa.max_train_pairs} pairs"] += (
            splits["train"]["documents"] - len(sample.heap)
        )  # fmt: skip

    teacher = None
    if cfg.qa.teacher is not None:
        taught, teacher = teacher_pairs(cfg, documents(shards))
        pairs += taught
    # A long answer that several documents carry word for word is the site's boilerplate, not what a page says.
    carriers: defaultdict[str, set[str]] = defaultdict(set)
    for p in pairs:
        if p["qtype"] not in SHORT_ANSWER_QTYPES:
            carriers[normalize(p["answer"])].add(p["source"]["doc_id"])
    boilerplate = {a for a, ids in carriers.items() if len(ids) >= BOILERPLATE_DOCUMENTS}
    kept = [p for p in pairs if p["qtype"] in SHORT_ANSWER_QTYPES or normalize(p["answer"]) not in boilerplate]
    if len(kept) < len(pairs):
        skipped[f"answer found word for word in >= {BOILERPLATE_DOCUMENTS} documents (boilerplate)"] += (
            len(pairs) - len(kept)
        )  # fmt: skip
    held = [p for p in kept if p["source"]["split"] in HELD_OUT]
    train = [p for p in kept if p["source"]["split"] not in HELD_OUT]
    held, train, removed = deduplicate(held, train, cfg.data.dedup, cfg.seed, SHORT_ANSWER_QTYPES)
    if removed["near_duplicates"]:
        skipped["near-duplicate of another pair's answer"] += removed["near_duplicates"]
    if removed["decontaminated"]:
        skipped["train pair whose answer near-duplicates a held-out one (decontamination)"] += removed["decontaminated"]
    report = {
        "documents": splits,
        "train_documents_sampled": len(sample.heap) if sample.dropped else None,
        "structure_from": dict(structure_from),
        "title_segments_ignored": sorted(noise),
        "train_words": splits["train"]["words"],
        "extracted_pairs": len(pairs),
        "skipped": dict(skipped.most_common()),
    }
    if teacher is not None:
        report["teacher"] = teacher
    log.info("qa: %d pairs from %d documents (%s); %d train, %d held-out after dedup", len(pairs), total,
             ", ".join(f"{k} {v}" for k, v in structure_from.items()), len(train), len(held))  # fmt: skip
    return train, held, report


def sample_titles(cfg: ForgeConfig, shards: dict[str, list[Path]], total: int) -> list[str]:
    """The titles of a hash sample of at most about TITLE_SAMPLE documents (all of a smaller corpus)."""
    share = min(1.0, TITLE_SAMPLE / max(1, total))
    chosen = (doc for doc in documents(shards) if share >= 1.0 or hash_share(doc["id"]) < share)
    shown = progress(chosen, total=round(total * share), desc="qa: titles", unit="doc", logger=log)
    return [read_page(doc, cfg)[0].title for doc in shown]
