"""The tokenizer trained on all of train against one trained on a hash-stable sample (tokenizer.train_sample_bytes),
side by side on one data stage: training time, and compression on val (tokens per word and bytes per token) of each.

    python bench/tokenizer_sample.py --data runs/nodejs/data --share 0.25 [--vocab 8192]

The sample is what keeps the BPE trainer's memory bounded on a corpus of tens of GB; this measures what it costs in
compression on a corpus small enough to train on whole.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge.config import TokenizerConfig  # noqa: E402
from pretrain import tokenizer as stage  # noqa: E402
from pretrain.token_shards import iter_text_batches  # noqa: E402


def compression(tokenizer, texts: list[str]) -> tuple[float, float]:
    """(tokens per whitespace word, UTF-8 bytes per token) of `texts`."""
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch(texts))
    words = sum(len(t.split()) for t in texts)
    return tokens / max(1, words), sum(len(t.encode()) for t in texts) / max(1, tokens)


def train(shards: list[Path], vocab: int, sample_bytes: int | None) -> tuple[object, float]:
    start = time.perf_counter()
    tokenizer = stage.train_bpe(stage.train_texts(shards, sample_bytes), TokenizerConfig(vocab_size=vocab))
    return tokenizer, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a data stage directory (train-*.parquet, val-*)")
    parser.add_argument("--share", type=float, default=0.25)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    train_shards = sorted(args.data.glob("train-*.parquet"))
    val = [t for batch in iter_text_batches(sorted(args.data.glob("val-*.parquet"))) for t in batch]
    total = stage.text_bytes(train_shards)
    sample = int(total * args.share)
    lines = [f"train: {total:,} bytes in {stage.doc_count(train_shards):,} documents; val: {len(val):,} documents",
             f"{'tokenizer':<24} {'train s':>8} {'tokens/word':>12} {'bytes/token':>12}"]  # fmt: skip
    results = {}
    for name, sample_bytes in (("all of train", None), (f"{args.share:.0%} sample ({sample:,} B)", sample)):
        tokenizer, seconds = train(train_shards, args.vocab, sample_bytes)
        results[name] = compression(tokenizer, val)
        lines.append(f"{name:<24} {seconds:>8.1f} {results[name][0]:>12.3f} {results[name][1]:>12.3f}")
    (full, _), (sampled, _) = results.values()
    lines.append(f"tokens per word, sample / all: {sampled / full:.3f}")
    print("\n".join(lines))


if __name__ == "__main__":
    from results import recorded  # bench/results.py: the output goes to RESULTS.md too

    with recorded(__file__):
        main()
