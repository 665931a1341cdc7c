"""Benchmark: peak memory of paragraph dedup, the in-memory set (dedup.ParagraphDeduper) against the sorted runs on
disk that `forge data` runs (paragraphs.ParagraphDedup), at growing numbers of paragraphs.

    .venv/bin/python bench/paragraph_dedup.py                          # 1M and 2M paragraphs, 8 MiB buffers
    .venv/bin/python bench/paragraph_dedup.py --millions 5 --memory-mb 64  # the stage's buffers (slower)

Synthetic documents of 8 paragraphs (~70 characters each, over data.dedup.min_paragraph_chars=50); a third of the
paragraphs repeat one from an earlier document. Each method runs in its own child process over the same documents
in the same order (streams 0, 1, 2 as test, val, train): the set applies each once; the sorted runs add each, sort,
then apply each (the stage's two passes). Peak RSS (ru_maxrss) is printed with its growth over the child's RSS
before the work; both methods must remove the same characters. The set grows with the paragraphs; the sorted
runs stay within a few --memory-mb buffers. The stage's buffers are 64 MiB (paragraphs.MEMORY): the default 8
shows the cap at sizes that run in two minutes.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pretrain.data import paragraphs  # noqa: E402
from pretrain.data.dedup import ParagraphDeduper  # noqa: E402

PER_DOC = 8
MIN_CHARS = 50
FILLER = "of the synthetic corpus stands for a paragraph of real text"


def word(n: int) -> str:
    """A distinct lowercase word per number (digits would all normalise to 0)."""
    return "".join(chr(97 + (n // 26**k) % 26) for k in range(7))


def documents(paragraph_count: int) -> Iterator[tuple[int, str]]:
    """(stream, text) for every document, the same each time; paragraph p of document d repeats an earlier one in
    a third of the cases."""
    for d in range(paragraph_count // PER_DOC):
        paras = []
        for j in range(PER_DOC):
            p = d * PER_DOC + j
            mixed = (p * 2654435761) % 2**32
            if d and mixed % 3 == 0:
                p = mixed % (d * PER_DOC)  # an earlier document's paragraph
            paras.append(f"Paragraph {word(p)} {FILLER}.")
        yield (0 if d % 100 == 0 else 1 if d % 100 == 1 else 2), "\n\n".join(paras)


def in_streams(paragraph_count: int) -> Iterator[tuple[int, str]]:
    """The documents in write order: stream 0's, then 1's, then 2's (three passes over the generator)."""
    for stream in (0, 1, 2):
        yield from ((s, text) for s, text in documents(paragraph_count) if s == stream)


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def child(method: str, paragraph_count: int, memory: int) -> dict:
    start_rss, start, removed = rss(), time.perf_counter(), 0
    if method == "set":
        deduper = ParagraphDeduper(MIN_CHARS)
        for _, text in in_streams(paragraph_count):
            removed += deduper.apply(text)[1]
    else:
        with tempfile.TemporaryDirectory(prefix="paragraph-bench-") as work:
            runs = paragraphs.ParagraphDedup(MIN_CHARS, Path(work) / "p", memory=memory)
            for stream, text in documents(paragraph_count):
                runs.add(stream, text)
            runs.finish()
            for stream, text in in_streams(paragraph_count):
                removed += runs.apply(stream, text)[1]
            runs.check_applied()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak": peak, "grown": peak - start_rss, "seconds": time.perf_counter() - start, "removed": removed}


def run_child(method: str, paragraph_count: int, memory: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", method, "--paragraphs", str(paragraph_count),
                          "--memory", str(memory)], capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--millions", type=float, nargs="+", default=[1.0, 2.0], help="paragraphs, in millions")
    parser.add_argument("--memory-mb", type=int, default=8, help="sorted runs' buffer size (the stage: 64)")
    parser.add_argument("--child", choices=["set", "runs"])
    parser.add_argument("--paragraphs", type=int)
    parser.add_argument("--memory", type=int)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.paragraphs, args.memory)))
        return

    memory = args.memory_mb << 20
    print(f"paragraph dedup, {PER_DOC} paragraphs per document, sorted runs with {args.memory_mb} MiB buffers; "
          "each method in its own process", flush=True)  # fmt: skip
    print(f"\n{'paragraphs':>11}{'method':>12}{'peak RSS MiB':>14}{'grown MiB':>11}{'B/paragraph':>13}"
          f"{'seconds':>9}{'set/runs (grown)':>18}")  # fmt: skip
    for millions in args.millions:
        n = int(millions * 1_000_000) // PER_DOC * PER_DOC
        got = {m: run_child(m, n, memory) for m in ("set", "runs")}
        assert got["set"]["removed"] == got["runs"]["removed"], f"the two methods removed different text: {got}"
        for m in ("set", "runs"):
            r = got[m]
            ratio = f"{got['set']['grown'] / got['runs']['grown']:.1f}x" if m == "runs" else ""
            print(f"{n:>11,}{m:>12}{r['peak'] / 2**20:>14.0f}{r['grown'] / 2**20:>11.0f}{r['grown'] / n:>13.1f}"
                  f"{r['seconds']:>9.1f}{ratio:>18}")  # fmt: skip
        print(f"{'':>11}{'':>12}  both removed {got['set']['removed']:,} characters", flush=True)


if __name__ == "__main__":
    from results import recorded  # bench/results.py: the output goes to RESULTS.md too

    with recorded(__file__):
        main()
