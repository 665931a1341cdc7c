"""Checkpoint cost on one process: how long training waits for a sharded checkpoint written now (synchronous) or in
the background (asynchronous: the copy to CPU memory alone), its size on disk, and the time to load it back.

    .venv/bin/python bench/checkpoint_save.py                                   # the tests' tiny model
    .venv/bin/python bench/checkpoint_save.py --set model.hidden_size=512 --set model.num_layers=8 \\
        --set model.intermediate_size=1536 --set model.num_attention_heads=8   # ~28M parameters

The model is pretrain.model.build_model of the tests' tiny shape (tests/test_pretrain.py TINY) with the overrides,
after one AdamW step (so the optimizer holds its state); each figure is the median of --repeats saves.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_pretrain import TINY  # noqa: E402

from forge.config import load_config  # noqa: E402
from pretrain import checkpoint as ckpt  # noqa: E402
from pretrain.model import build_model  # noqa: E402


def median_ms(times: list[float]) -> float:
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], help="config override, as forge's --set")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(None, [*TINY, *args.set])
    model = build_model(cfg.model, 512)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.randint(0, 512, (2, 16))).logits.sum().backward()
    optimizer.step()
    with tempfile.TemporaryDirectory() as tmp:
        timings: dict[str, list[float]] = {"synchronous": [], "asynchronous": [], "load": []}
        for mode in ("synchronous", "asynchronous"):
            writer = ckpt.CheckpointWriter(Path(tmp) / mode, keep_last=1, asynchronous=mode == "asynchronous")
            for step in range(args.repeats):
                writer.wait()  # the previous write done: time what training waits for
                started = time.perf_counter()
                path = writer.save(step, model, optimizer, {})
                timings[mode].append(time.perf_counter() - started)
            writer.wait()
        for _ in range(args.repeats):
            started = time.perf_counter()
            ckpt.load(path, model, optimizer)
            timings["load"].append(time.perf_counter() - started)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    params = sum(p.numel() for p in model.parameters())
    print(f"{params:,} parameters, one checkpoint {size:,} bytes ({size / params:.1f} B per parameter)")
    for name, times in timings.items():
        print(f"  {name:13s} {median_ms(times):8.1f} ms (median of {len(times)})")


if __name__ == "__main__":
    main()
