"""Token shards: every split of the cleaned corpus encoded once, for a memory-mapped pretraining loader.

Layout under `runs/<run>/tokenizer/shards/`:
  <split>.bin   flat token ids, uint16 when the vocabulary has <= 65,536 ids else uint32, little-endian; every
                document is followed by one EOS id: doc0 EOS doc1 EOS ... docN EOS
  <split>.idx   a .npy int64 array of n_docs + 1 offsets into <split>.bin: document i is
                bin[idx[i] : idx[i + 1] - 1] and bin[idx[i + 1] - 1] is its EOS; idx[-1] == len(bin)
  meta.json     dtype, vocab size, special ids and, per split, documents, doc_tokens (the sum of the
                per-document token counts) and tokens (doc_tokens + one EOS per document == len(bin))

Documents are in the data stage's order (shards sorted by name, rows in order). A document's text is encoded as
plain text: a literal "[EOS]" or "<|user|>" inside a document stays ordinary bytes, never a control token
(transformers: `tok(text, add_special_tokens=False, split_special_tokens=True)`).

    tokens, offsets = load_split(shards_dir, "train")   # np.memmap, np.ndarray
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from forge import ForgeError
from forge.io import atomic_path
from forge.progress import progress

FORMAT = "forge-token-shards/1"
READ_BATCH_DOCS = 1024  # documents per encode_batch call: enough work for the Rust thread pool, little RAM


def token_dtype(vocab_size: int) -> np.dtype:
    """Little-endian uint16 when every id fits (vocab_size <= 65,536), else uint32."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def iter_text_batches(shards: list[Path], batch_docs: int = READ_BATCH_DOCS) -> Iterator[list[str]]:
    """Stream the `text` column of parquet shards in order, `batch_docs` documents at a time."""
    for shard in shards:
        parquet = pq.ParquetFile(shard)
        if "text" not in parquet.schema_arrow.names:
            raise ForgeError(f"{shard} has no 'text' column (columns: {parquet.schema_arrow.names}); re-run forge data")
        for batch in parquet.iter_batches(batch_size=batch_docs, columns=["text"]):
            column = batch.column(0)
            if column.null_count:
                raise ForgeError(f"{shard} has {column.null_count} documents with a null text; re-run forge data")
            yield column.to_pylist()


@dataclass
class SplitStats:
    """What encoding one split measured: sizes, and token and byte histograms for the compression report."""

    documents: int = 0
    doc_tokens: int = 0  # sum of the per-document token counts, separators excluded
    chars: int = 0
    bytes: int = 0
    words: int = 0  # whitespace-separated words (str.split())
    token_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    byte_counts: np.ndarray = field(default_factory=lambda: np.zeros(256, dtype=np.int64))
    seconds: float = 0.0

    @property
    def tokens(self) -> int:
        """Length of the .bin file: the documents' tokens plus one EOS per document."""
        return self.doc_tokens + self.documents


def encode_split(tokenizer: Tokenizer, shards: list[Path], out_dir: Path, split: str, eos_id: int) -> SplitStats:
    """Encode one split's shards into out_dir/<split>.bin + .idx, streaming; return what was measured.

    `Tokenizer.encode_batch_fast` runs on all cores (the Rust thread pool), so splits are encoded one after the
    other, each in parallel.
    """
    start = time.time()
    vocab = tokenizer.get_vocab_size()
    dtype = token_dtype(vocab)
    stats = SplitStats(token_counts=np.zeros(vocab, dtype=np.int64))
    offsets = [np.zeros(1, dtype=np.int64)]
    position = 0
    documents = sum(pq.ParquetFile(shard).metadata.num_rows for shard in shards)
    bar = progress(total=documents, desc=f"tokenizer: encode {split}", unit="doc")
    with open(out_dir / f"{split}.bin", "wb") as out, bar:
        for texts in iter_text_batches(shards):
            bar.update(len(texts))
            encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
            lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
            flat = np.empty(int(lengths.sum()) + len(texts), dtype=dtype)
            ends = np.cumsum(lengths + 1)  # each document's end, after its EOS
            for encoding, end, length in zip(encodings, ends, lengths, strict=True):
                flat[end - 1 - length : end - 1] = encoding.ids
            flat[ends - 1] = eos_id
            out.write(flat.tobytes())
            offsets.append(position + ends)
            position += len(flat)

            stats.documents += len(texts)
            stats.doc_tokens += int(lengths.sum())
            stats.token_counts += np.bincount(flat, minlength=vocab)[:vocab]
            stats.token_counts[eos_id] -= len(texts)  # the histogram counts document tokens, not separators
            joined = "".join(texts)
            stats.chars += len(joined)
            raw = joined.encode("utf-8")
            stats.bytes += len(raw)
            stats.byte_counts += np.bincount(np.frombuffer(raw, dtype=np.uint8), minlength=256)
            stats.words += sum(len(t.split()) for t in texts)
    with open(out_dir / f"{split}.idx", "wb") as fh:  # a file handle: np.save would append ".npy" to the name
        np.save(fh, np.concatenate(offsets))
    stats.seconds = time.time() - start
    return stats


def write_shards(
    tokenizer: Tokenizer, split_shards: dict[str, list[Path]], shards_dir: Path, special_ids: dict[str, int]
) -> dict[str, SplitStats]:
    """Encode every split into `shards_dir` (written atomically as a whole) and write meta.json.

    `special_ids` maps names ("eos", "pad", "user"...) to ids; meta.json records each as `<name>_id`.
    """
    eos_id = special_ids["eos"]
    was_encoding_special = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True  # document text is plain text, never control tokens
    try:
        with atomic_path(shards_dir) as tmp:
            tmp.mkdir(parents=True)
            stats = {
                split: encode_split(tokenizer, shards, tmp, split, eos_id) for split, shards in split_shards.items()
            }
            vocab = tokenizer.get_vocab_size()
            meta = {
                "format": FORMAT,
                "dtype": token_dtype(vocab).name,
                "byte_order": "little",
                "vocab_size": vocab,
                **{f"{name}_id": value for name, value in special_ids.items()},
                "separator": "one EOS after every document",
                "index": "<split>.idx: .npy int64 offsets, n_docs + 1; doc i = bin[idx[i]:idx[i+1]-1], then EOS",
                "splits": {
                    split: {
                        "file": f"{split}.bin",
                        "index": f"{split}.idx",
                        "documents": s.documents,
                        "doc_tokens": s.doc_tokens,
                        "tokens": s.tokens,
                    }
                    for split, s in stats.items()
                },
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    finally:
        tokenizer.encode_special_tokens = was_encoding_special
    return stats


def read_meta(shards_dir: Path) -> dict[str, Any]:
    path = Path(shards_dir) / "meta.json"
    if not path.is_file():
        raise ForgeError(f"{path} not found: run `forge tokenizer` first")
    return json.loads(path.read_text(encoding="utf-8"))


def load_split(shards_dir: Path, split: str) -> tuple[np.memmap, np.ndarray]:
    """The split's tokens as a read-only memory map and its document offsets (see the module docstring)."""
    shards_dir = Path(shards_dir)
    meta = read_meta(shards_dir)
    if split not in meta["splits"]:
        raise ForgeError(f"no {split!r} token shard in {shards_dir} (splits: {', '.join(meta['splits'])})")
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    path = shards_dir / f"{split}.bin"
    # np.memmap refuses an empty file: a split with no documents gets an empty array instead
    tokens = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype=dtype)
    offsets = np.load(shards_dir / f"{split}.idx")
    return tokens, offsets
