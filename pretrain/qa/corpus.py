"""Q&A pairs from the user's corpus: every document the data stage kept, read back with its structure.

The data stage's cleaned text has lost the markup of HTML pages (headings, definition lists, tables), so each kept
document's structure is taken from its input file when it still exists and is a document (HTML, Markdown, RST,
AsciiDoc, text, or the Markdown the PDF/DOCX/ODT/EPUB readers write; a section of one is cut the same way again;
pretrain/qa/structure.py), else from its cleaned text (JSONL and Parquet rows). The answers are always checked
against the cleaned text (pretrain/qa/extract.py), so every answer is text of its document's split: pairs from
train documents are what SFT trains on, pairs from val and test documents the held-out set, never trained on.

Across the corpus: title segments most pages share (the site's name) are not part of a subject, a long answer that
several documents carry word for word is boilerplate (a footer, a licence notice) and is dropped, then near-duplicate
answers are removed with held-out pairs preferred (pretrain/qa/dedup.py), which also decontaminates train.

    train, held_out, report = corpus_pairs(cfg, shards)   # shards: the data stage's {split: [parquet files]}
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from forge.config import ForgeConfig
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
    titles = [read_page(doc, cfg)[0].title for doc in progress(documents(shards), total=total, desc="qa: titles",
                                                               unit="doc", logger=log)]  # fmt: skip
    noise = title_noise(titles)
    skipped: Counter[str] = Counter()
    structure_from: Counter[str] = Counter()
    splits = {s: {"documents": 0, "words": 0, "with_pairs": 0} for s in ("train", *HELD_OUT)}
    pairs: list[dict[str, Any]] = []
    for doc in progress(documents(shards), total=total, desc="qa: extract", unit="doc", logger=log):
        page, origin = read_page(doc, cfg)
        structure_from[origin] += 1
        counts = splits[doc["split"]]
        counts["documents"] += 1
        counts["words"] += len(doc["text"].split())
        ctx = Context(normalize(doc["text"]), language(doc, cfg), cfg.seed, doc["id"], noise)
        found, why = page_pairs(page, ctx)
        skipped.update(why)
        if cfg.qa.prose:
            found += prose_pairs(doc, page, ctx, {normalize(p.answer) for p in found})
        counts["with_pairs"] += bool(found)
        for p in found:
            source = {"kind": "corpus", "doc_id": doc["id"], "split": doc["split"], "heading": p.heading or None,
                      "path": doc.get("source")}  # fmt: skip
            pairs.append({"question": p.question, "answer": p.answer, "qtype": p.qtype, "source": source})

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
