"""Synthetic corpora of real-looking documents for bench/scale.py, generated with no download.

Text comes from a word-level Markov chain of order 2 trained on the prose paragraphs of the running Python's own
standard-library documentation (pretrain/data/stdlib_corpus.py: docstrings and the language-reference topics), so
the vocabulary, sentence lengths and stop words are those of real technical English. A document is a title, an
intro and a few `##` sections of paragraphs, so `forge qa` finds headings with prose under them.

Every paragraph is unique across the whole corpus under the data stage's own normalisation
(pretrain/data/dedup.normalized_words): the exact, near-duplicate and paragraph dedup passes remove only the copies
planted on purpose. A share of documents are near-duplicates (a copy of an earlier unique document with about one
word in 100 replaced: Jaccard of word 5-grams ~0.9, above the stage's 0.8) and a share are exact copies. Everything
is a function of the seed.

    chain = stdlib_chain()
    for doc in generate(chain, 1000, seed=0, near_dup_share=0.05, exact_dup_share=0.02): ...
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pretrain.data.dedup import normalized_words
from pretrain.data.stdlib_corpus import docstring, iter_stdlib_records

START, END = "\x02", "\x03"  # sentence boundary markers: never in the text
SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
NOT_PROSE = re.compile(r">>>|::\s*$|^\s*([-*+]|\d+\.)\s|^[=*~^-]{3,}$", re.M)  # examples, listings, underlines
SENTENCE_WORDS = (5, 45)  # a generated sentence outside these lengths is drawn again
SENTENCES_PER_PARAGRAPH = (2, 5)
PARAGRAPHS_PER_SECTION = (1, 2)
SECTIONS_PER_DOC = (2, 4)  # with the intro: ~5.5 paragraphs, ~2 kB, ~460 tokens (4096-token BPE) a document
EDITS_PER_100_WORDS = 1  # a near-duplicate's replaced words: "a few words changed"
MAX_REDRAWS = 1000  # paragraphs drawn in a row that were all written before: the chain has run out of new text
COPY_POOL = 2000  # unique documents kept (reservoir sample) to copy from: memory bounded at any corpus size
HEADING_WORD_CHARS = 5  # section titles draw from words this long or longer: content words, not "the" or "with"


@dataclass(frozen=True)
class Doc:
    id: str
    text: str
    kind: str  # unique | near_dup | exact_dup
    source: str | None = None  # the id a copy was made from


# ----------------------------------------------------------------------------------------------------------------
# the chain


@dataclass(frozen=True)
class MarkovChain:
    """Word-level, order 2: (previous word, word) -> the words that followed, with repetition (so frequency)."""

    next_words: dict[tuple[str, str], tuple[str, ...]]
    heading_words: tuple[str, ...]  # content words, for section titles

    @classmethod
    def from_paragraphs(cls, paragraphs: list[str]) -> MarkovChain:
        table: dict[tuple[str, str], list[str]] = {}
        for paragraph in paragraphs:
            for sentence in SENTENCE_SPLIT.split(paragraph):
                words = [START, START, *sentence.split(), END]
                for a, b, c in zip(words, words[1:], words[2:], strict=False):
                    table.setdefault((a, b), []).append(c)
        content = {w.strip(".,;:()\"'").lower() for p in paragraphs for w in p.split()}
        heading = sorted(w for w in content if w.isalpha() and len(w) >= HEADING_WORD_CHARS)
        return cls({k: tuple(v) for k, v in table.items()}, tuple(heading))

    def sentence(self, rng: random.Random) -> str:
        lo, hi = SENTENCE_WORDS
        while True:
            words: list[str] = []
            a, b = START, START
            while len(words) <= hi:
                a, b = b, rng.choice(self.next_words[(a, b)])
                if b == END:
                    break
                words.append(b)
            if lo <= len(words) <= hi and b == END:
                return " ".join(words)


@functools.cache
def stdlib_chain(root: Path | None = None) -> MarkovChain:
    """The chain of the prose of the stdlib sources under `root` (default: all of them, ~10 s to parse on 2 busy
    cores) and of the language-reference topics, built once per process."""
    return MarkovChain.from_paragraphs(list(stdlib_prose(root)))


def stdlib_prose(root: Path | None = None) -> Iterator[str]:
    """The prose paragraphs of the stdlib documentation, each joined onto one line: no code, lists or tables."""
    for record in iter_stdlib_records(root):
        for block in re.split(r"\n\s*\n", docstring(record)):
            if NOT_PROSE.search(block) or block.startswith((" ", "\t")):
                continue
            text = " ".join(block.split())
            words = text.split()
            alpha = sum(any(ch.isalpha() for ch in w) for w in words)
            if len(words) >= 12 and text.endswith(".") and alpha >= 0.85 * len(words):
                yield text


# ----------------------------------------------------------------------------------------------------------------
# documents


class Writer:
    """Unique paragraphs and headings from one chain and one seeded RNG."""

    def __init__(self, chain: MarkovChain, rng: random.Random) -> None:
        self.chain, self.rng = chain, rng
        self.seen: set[bytes] = set()  # 8-byte digests of every paragraph written, normalised as dedup does

    def paragraph(self) -> str:
        for _ in range(MAX_REDRAWS):
            text = " ".join(self.chain.sentence(self.rng) for _ in range(self.rng.randint(*SENTENCES_PER_PARAGRAPH)))
            key = hashlib.blake2b(" ".join(normalized_words(text)).encode(), digest_size=8).digest()
            if key not in self.seen:
                self.seen.add(key)
                return text
        raise RuntimeError(
            f"{MAX_REDRAWS} paragraphs in a row had been written before ({len(self.seen):,} so far): "
            "the chain's text is too small for this corpus; train it on more paragraphs"
        )

    def heading(self) -> str:
        words = self.rng.sample(self.chain.heading_words, self.rng.randint(1, 3))
        if len(words) == 3 and self.rng.random() < 0.5:
            words.insert(2, "and")
        return " ".join(words).capitalize()

    def document(self) -> str:
        parts = [f"# {self.heading()}", self.paragraph()]
        for _ in range(self.rng.randint(*SECTIONS_PER_DOC)):
            parts.append(f"## {self.heading()}")
            parts += [self.paragraph() for _ in range(self.rng.randint(*PARAGRAPHS_PER_SECTION))]
        return "\n\n".join(parts) + "\n"


def near_duplicate(text: str, rng: random.Random, vocabulary: tuple[str, ...]) -> str:
    """The text with about one word in 100 (at least 1) replaced by another word of the vocabulary."""
    words = text.split(" ")
    spots = [i for i, w in enumerate(words) if w.isalpha()]
    for i in rng.sample(spots, min(len(spots), max(1, len(words) * EDITS_PER_100_WORDS // 100))):
        replacement = words[i]
        while replacement.lower() == words[i].lower():
            replacement = rng.choice(vocabulary)
        words[i] = replacement
    return " ".join(words)


def generate(chain: MarkovChain, n: int, seed: int, near_dup_share: float, exact_dup_share: float) -> Iterator[Doc]:
    """n documents: unique ones, and the given shares of near and exact copies of earlier unique ones, in a seeded
    order. Copies come from a reservoir sample of the unique documents so far (memory bounded at any n)."""
    if near_dup_share < 0 or exact_dup_share < 0 or near_dup_share + exact_dup_share >= 1:
        raise ValueError(f"near_dup_share={near_dup_share} + exact_dup_share={exact_dup_share} must be in [0, 1)")
    rng = random.Random(seed)
    writer = Writer(chain, rng)
    kinds = ["near_dup"] * round(n * near_dup_share) + ["exact_dup"] * round(n * exact_dup_share)
    kinds = ["unique", *rng.sample(kinds + ["unique"] * (n - 1 - len(kinds)), n - 1)]  # the first one is unique
    pool: list[Doc] = []
    unique_so_far = 0
    for i, kind in enumerate(kinds):
        doc_id = f"doc-{i:08d}"
        if kind == "unique":
            doc = Doc(doc_id, writer.document(), kind)
            unique_so_far += 1
            if len(pool) < COPY_POOL:
                pool.append(doc)
            elif (slot := rng.randrange(unique_so_far)) < COPY_POOL:
                pool[slot] = doc
        else:
            original = rng.choice(pool)
            text = original.text if kind == "exact_dup" else near_duplicate(original.text, rng, chain.heading_words)
            doc = Doc(doc_id, text, kind, original.id)
        yield doc
