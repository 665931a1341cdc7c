"""The text evaluation measures: the data stage's documents (runs/<run>/data/<split>-NNNNN.parquet), never a
tokenizer's ids, so every model reads the same text through its own tokenizer.

  test   perplexity / bits per byte, generation prompts, the test half of memorisation: whole documents in file
         order up to eval.max_test_bytes of UTF-8 (the document crossing the limit is cut at a character boundary)
  train  the unigram floor (fitted on up to TRAIN_FIT_BYTES of it) and the train half of memorisation

A split's identity (eval's skip key, and what eval.json records for the gate) is the sha256 of its shards' listing
("name sha256" per line, sorted), built from the sha256 the data stage recorded in its manifest for each shard.
"""

from __future__ import annotations

import hashlib
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
    text = read_split(cfg, "test", cfg.eval.max_test_bytes)
    if not text.documents:
        raise ForgeError(
            f"the test split of run {cfg.run_name!r} is empty (runs/{cfg.run_name}/data/test-*.parquet): nothing to "
            "measure bits per byte on; check forge data's report and data.split"
        )
    return text


def train_text(cfg: ForgeConfig) -> SplitText:
    return read_split(cfg, "train", TRAIN_FIT_BYTES)
