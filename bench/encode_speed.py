"""Token-shard encoding in one process (the tokenizers thread pool spreads each batch over the cores) against a
process pool of one tokenizers thread per worker, side by side on the same data shards, with the ratio.

    python bench/encode_speed.py --data runs/nodejs/data [--tokenizer runs/nodejs/tokenizer/tokenizer.json]
                                 [--workers 0] [--shard-docs 0] [--repeats 3]

The pool encodes one data shard per worker, so it needs several shards: a data stage with fewer shards than
4 x workers is cut again into shards of --shard-docs documents (0: enough for 4 per worker), in a temp directory,
as the data stage cuts a large corpus (data.shard_docs). Both sides write the same bytes (checked every repeat).
Without --tokenizer a BPE of --vocab tokens is trained on the train split first (not timed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge.config import TokenizerConfig  # noqa: E402
from forge.machine import usable_cores  # noqa: E402
from pretrain import tokenizer as stage  # noqa: E402
from pretrain.token_shards import write_shards  # noqa: E402

SPLITS = ("train", "val", "test")


def reshard(data: Path, out: Path, shard_docs: int) -> dict[str, list[Path]]:
    """Each split's documents, in order, in parquet shards of `shard_docs` rows (the data stage's naming)."""
    shards: dict[str, list[Path]] = {}
    for split in SPLITS:
        table = pq.read_table(sorted(data.glob(f"{split}-*.parquet")), columns=["text"])
        shards[split] = []
        for n, start in enumerate(range(0, max(table.num_rows, 1), shard_docs)):
            path = out / f"{split}-{n:05d}.parquet"
            pq.write_table(table.slice(start, shard_docs), path)
            shards[split].append(path)
    return shards


def encode(tokenizer, shards: dict[str, list[Path]], out: Path, workers: int) -> tuple[float, dict[str, bytes]]:
    """Seconds to write every split's token shards with `workers` processes, and the files written."""
    start = time.perf_counter()
    write_shards(tokenizer, shards, out, {"pad": 0, "unk": 1, "bos": 2, "eos": 3}, workers=workers)
    seconds = time.perf_counter() - start
    return seconds, {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a data stage directory (train-*.parquet, ...)")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer.json (default: train a BPE of --vocab tokens)")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--workers", type=int, default=0, help="the pool's processes (0: one per core)")
    parser.add_argument("--shard-docs", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from tokenizers import Tokenizer

    workers = args.workers or usable_cores()
    given = {split: sorted(args.data.glob(f"{split}-*.parquet")) for split in SPLITS}
    if args.tokenizer:
        tokenizer = Tokenizer.from_file(str(args.tokenizer))
    else:
        tokenizer = stage.train_tokenizer(given["train"], TokenizerConfig(vocab_size=args.vocab))
    with tempfile.TemporaryDirectory(prefix="encode-speed-") as tmp:
        shards = given
        docs = sum(stage.doc_count(files) for files in given.values())
        if sum(map(len, given.values())) < 4 * workers or args.shard_docs:
            shards = reshard(args.data, Path(tmp), args.shard_docs or max(1, docs // (4 * workers)))
        text = sum(stage.text_bytes(files) for files in shards.values())
        times: dict[int, list[float]] = {1: [], workers: []}
        for repeat in range(args.repeats):
            written = {}
            for n in times:  # alternating, so a busy moment of the machine hits both sides
                seconds, written[n] = encode(tokenizer, shards, Path(tmp) / f"out-{repeat}-{n}", n)
                times[n].append(seconds)
            assert written[1] == written[workers], "the pool wrote other bytes than one process"
            print(f"repeat {repeat}: one process {times[1][-1]:.2f} s, {workers} workers {times[workers][-1]:.2f} s")
        one, pool = statistics.median(times[1]), statistics.median(times[workers])
        print(f"{docs:,} documents, {text / 1e6:.1f} MB of text in {sum(map(len, shards.values()))} shards, "
              f"vocab {tokenizer.get_vocab_size():,}; median of {args.repeats}")  # fmt: skip
        print(f"{'encoder':<24} {'seconds':>8} {'MB/s':>8}")
        print(f"{'one process':<24} {one:>8.2f} {text / 1e6 / one:>8.1f}")
        print(f"{f'pool of {workers}':<24} {pool:>8.2f} {text / 1e6 / pool:>8.1f}")
        print(f"speed-up, pool / one process: {one / pool:.2f}x (identical bytes)")


if __name__ == "__main__":
    from results import recorded  # bench/results.py: the output goes to RESULTS.md too

    with recorded(__file__):
        main()
