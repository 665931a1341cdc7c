"""The text evaluation measures: the data stage's documents (runs/<run>/data/<split>-NNNNN.parquet), never a
tokenizer's ids, so every model reads the same text through its own tokenizer.

  test   perplexity / bits per byte, generation prompts, the test half of memorisation: ITEMS, every test document
         cut into pieces of at most eval.text_item_bytes of UTF-8 (at a paragraph, else a line, else a word), of
         which eval.text_items are drawn by a stable hash of their text and kept in file order. One long document
         gives as many items as many short ones, so the gate's bits-per-byte rules get their min_items whatever the
         documents' lengths; each item is scored on its own, and two models read the same bytes (its id is its
         text's hash), whatever their tokenizers.
  train  the unigram floor (fitted on up to TRAIN_FIT_BYTES of it) and the train half of memorisation

A split's identity (eval's skip key, and what eval.json records for the gate) is the sha256 of its shards' listing
("name sha256" per line, sorted), built from the sha256 the data stage recorded in its manifest for each shard.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from forge import ForgeError
from forge.config import ForgeConfig
from forge.hashing import sha256_file
from forge.lineage import completed_manifest
from pretrain.token_shards import iter_text_batches
from pretrain.tokenizer import data_shards

# The unigram floor's counts need a few MB of text, not all of a large train split (and memorisation samples
# only memorisation_docs documents of it); a cost bound, not a property of any corpus.
TRAIN_FIT_BYTES = 32_000_000


@dataclass(frozen=True)
class SplitText:
    split: str
    documents: list[str]
    shards: dict[str, str]  # shard file name -> sha256, as the data stage recorded it

    @property
    def sha256(self) -> str:
        listing = "".join(f"{name} {digest}\n" for name, digest in sorted(self.shards.items()))
        return hashlib.sha256(listing.encode()).hexdigest()

    @property
    def bytes(self) -> int:
        return sum(len(d.encode("utf-8")) for d in self.documents)


def shard_hashes(files: list[Path]) -> dict[str, str]:
    """Each shard's sha256 from the data stage's manifest (hashed here only where the manifest lacks it)."""
    recorded = (completed_manifest(files[0].parent) or {}).get("outputs", {}) if files else {}
    return {f.name: recorded.get(f.name) or sha256_file(f) for f in files}


def split_id(cfg: ForgeConfig, split: str) -> str:
    """The split's identity without reading its text (for the skip key): see SplitText.sha256."""
    return SplitText(split, [], shard_hashes(data_shards(cfg)[split])).sha256


def read_split(cfg: ForgeConfig, split: str, max_bytes: int | None) -> SplitText:
    """The split's documents in file order, up to `max_bytes` of UTF-8 (None: all of them)."""
    files = data_shards(cfg)[split]
    documents: list[str] = []
    left = max_bytes
    for batch in iter_text_batches(files):
        for text in batch:
            if left is not None:
                data = text.encode("utf-8")
                if len(data) > left:
                    text = data[:left].decode("utf-8", errors="ignore")  # a whole character, never half of one
                left -= len(data)
            if text:
                documents.append(text)
            if left is not None and left <= 0:
                return SplitText(split, documents, shard_hashes(files))
    return SplitText(split, documents, shard_hashes(files))


def test_text(cfg: ForgeConfig) -> SplitText:
    """The test items (see the module docstring) and the test split's identity."""
    text = read_split(cfg, "test", None)
    text = SplitText(text.split, text_items(text.documents, cfg.eval.text_item_bytes, cfg.eval.text_items),
                     text.shards)  # fmt: skip
    if not text.documents:
        raise ForgeError(
            f"the test split of run {cfg.run_name!r} is empty (runs/{cfg.run_name}/data/test-*.parquet): nothing to "
            "measure bits per byte on; check forge data's report and data.split"
        )
    return text


def text_items(documents: list[str], item_bytes: int, count: int) -> list[str]:
    """Every document cut into pieces of at most `item_bytes` UTF-8 bytes, `count` of them by a stable hash of their
    text (all when fewer), in document order. A piece repeated word for word is one item: an item's id is its text."""
    pieces = list(dict.fromkeys(p for d in documents for p in cut(d, item_bytes)))
    if len(pieces) > count:
        ranked = sorted(range(len(pieces)), key=lambda i: hashlib.sha256(pieces[i].encode()).digest())
        keep = set(ranked[:count])
        pieces = [p for i, p in enumerate(pieces) if i in keep]
    return pieces


def cut(text: str, limit: int) -> list[str]:
    """`text` as consecutive pieces of at most `limit` UTF-8 bytes: whole paragraphs packed together, a longer
    paragraph at its lines, a longer line at its words (a single longer word at a character boundary)."""
    out: list[str] = []
    for unit in _units(text, limit):
        if out and len((out[-1] + unit).encode()) <= limit:
            out[-1] += unit
        else:
            out.append(unit)
    return [p.strip() for p in out if p.strip()]


def _units(text: str, limit: int) -> list[str]:
    """The text's paragraphs (each with its trailing blank line), those over `limit` bytes cut at lines, then at
    words, then at characters; joined they are the text again."""
    units = [text]
    for boundary in (r"(?<=\n\n)", r"(?<=\n)", r"(?<= )"):  # after a paragraph, a line, a word
        units = [u for piece in units for u in (re.split(boundary, piece) if len(piece.encode()) > limit else [piece])]
    out: list[str] = []
    for unit in units:
        while len(unit.encode()) > limit:  # one word longer than an item
            head = unit.encode()[:limit].decode("utf-8", errors="ignore")
            out.append(head)
            unit = unit[len(head) :]
        out.append(unit)
    return [u for u in out if u]


def train_text(cfg: ForgeConfig) -> SplitText:
    return read_split(cfg, "train", TRAIN_FIT_BYTES)
