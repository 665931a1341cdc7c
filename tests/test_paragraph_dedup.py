"""Paragraph dedup from sorted runs on disk (pretrain/data/paragraphs.py) against the in-memory set reference."""

from __future__ import annotations

import random

import pytest

from pretrain.data.dedup import ParagraphDeduper
from pretrain.data.paragraphs import ENTRY, ParagraphDedup

MIN_CHARS = 30


def random_corpus(seed: int, docs: int = 600) -> list[tuple[int, str]]:
    """(stream, text) in row order: paragraphs drawn from a small pool (many repeats, across and inside documents),
    some below MIN_CHARS, some differing only in case and punctuation (the same normalised hash)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "42", "7"]
    pool = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(120)]
    corpus = []
    for _ in range(docs):
        paras = []
        for _ in range(rng.randint(0, 7)):
            para = rng.choice(pool[:15]) if rng.random() < 0.4 else rng.choice(pool)
            if rng.random() < 0.2:
                para = para.upper() + "!"
            paras.append(para)
        if paras and rng.random() < 0.15:
            paras.append(paras[0])  # a repeat inside one document stays
        text = rng.choice(["\n\n", "\n  \n", "\n\n\n"]).join(paras)
        corpus.append((rng.choice([0, 1, 2, 2, 2]), text))
    return corpus


def reference(corpus: list[tuple[int, str]]) -> list[tuple[str, int]]:
    """ParagraphDeduper over the documents in write order (stream 0, 1, 2; row order within each), by row."""
    dd = ParagraphDeduper(MIN_CHARS)
    out: list[tuple[str, int]] = [("", 0)] * len(corpus)
    for stream in (0, 1, 2):
        for row, (s, text) in enumerate(corpus):
            if s == stream:
                out[row] = dd.apply(text)
    return out


def sorted_runs(corpus: list[tuple[int, str]], work, memory: int) -> tuple[list[tuple[str, int]], ParagraphDedup]:
    dd = ParagraphDedup(MIN_CHARS, work, memory=memory)
    for stream, text in corpus:
        dd.add(stream, text)
    dd.finish()
    out: list[tuple[str, int]] = [("", 0)] * len(corpus)
    for stream in (0, 1, 2):
        for row, (s, text) in enumerate(corpus):
            if s == stream:
                out[row] = dd.apply(stream, text)
    dd.check_applied()
    return out, dd


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("entries", [50, 1 << 20])  # 50 entries per buffer: dozens of runs, ranges, buckets
def test_sorted_runs_remove_exactly_what_the_set_removes(tmp_path, seed, entries):
    corpus = random_corpus(seed)
    expected = reference(corpus)
    got, dd = sorted_runs(corpus, tmp_path / "work", memory=entries * ENTRY.itemsize)
    assert got == expected
    assert sum(cut > 0 for _, cut in expected) > 100  # the corpus really exercises removals
    buckets = list((tmp_path / "work").glob("removed-*.bin"))
    if entries == 50:
        assert len(dd._runs) > 20 and len(buckets) > 5
    dd.close()
    assert not (tmp_path / "work").exists()


def test_a_paragraph_in_every_document_is_kept_once(tmp_path):
    para = "The same long paragraph, repeated in every single document of the corpus."
    corpus = [(i % 3, f"Own text number {i} that is long enough to count.\n\n{para}") for i in range(300)]
    got, _ = sorted_runs(corpus, tmp_path, memory=16 * ENTRY.itemsize)
    holders = [row for row, (text, _) in enumerate(got) if para in text]
    assert holders == [0]  # row 0 is the first document of stream 0: the first one written
    assert got == reference(corpus)


def test_applying_documents_that_were_not_added_is_an_error(tmp_path):
    dd = ParagraphDedup(MIN_CHARS, tmp_path)
    dd.add(0, "a paragraph that is certainly longer than thirty characters")
    dd.finish()
    dd.apply(0, "a paragraph that is certainly longer than thirty characters")
    with pytest.raises(RuntimeError, match="more documents to apply than to add"):
        dd.apply(0, "another paragraph that is certainly longer than thirty characters")


def test_a_document_left_out_of_the_write_pass_is_caught(tmp_path):
    dd = ParagraphDedup(MIN_CHARS, tmp_path)
    for text in ("first paragraph, longer than thirty characters", "second paragraph, longer than thirty chars"):
        dd.add(2, text)
    dd.finish()
    dd.apply(2, "first paragraph, longer than thirty characters")
    with pytest.raises(RuntimeError, match="added but"):
        dd.check_applied()
