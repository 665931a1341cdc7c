"""SFT examples: the qa stage's records (pretrain/qa/records.py) as chat conversations, with the system prompt, the
length limit in tokens of the rendered chat, and the count against the 10k-100k guidance.

    examples, report = read_jsonl(qa_train, system_prompt=None, length=token_count, max_length=512)
    examples, report = read_jsonl(qa_train, None, token_count, 512, limit=20_000, seed=0)  # sft.max_examples

Every line becomes a conversation (a list of {"role", "content"} messages) or is skipped with its line number and
the reason: what pretrain/qa/records.py refuses (invalid JSON, a missing or empty field, a bad role order...), or too
long for `sft.max_seq_length`. Other keys on a line are kept as metadata. A file with no valid line is a ForgeError
naming the file and the first problems. With a `limit` (sft.max_examples), the lines are measured in a seeded order
until that many fit: a large file is tokenized only for the examples kept. The Q&A set itself (its sources, split
and near-duplicates) is built by `forge qa`; this module only turns it into what the trainer reads.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge import ForgeError
from pretrain.qa import records
from pretrain.qa.records import FORMAT_HINT, Messages, ReadReport

log = logging.getLogger("forge.sft")

GUIDANCE = (10_000, 100_000)  # 10k-100k quality examples: the usual range that is enough for a small model


@dataclass
class Example:
    messages: Messages
    line: int | None = None  # 1-based line of the source file (None: generated)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataReport(ReadReport):
    examples: int = 0
    beyond_cap: int = 0  # valid lines never measured: `limit` examples fitted before them (not length-checked)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "lines": self.lines, "valid": self.valid, "skipped": len(self.skipped),
            "skipped_lines": self.skipped, "examples": self.examples, "beyond_cap": self.beyond_cap,
            "guidance": guidance(self.examples),
        }  # fmt: skip


def guidance(n: int) -> str:
    low, high = GUIDANCE
    if n < low:
        return f"{n:,} examples: below the usual {low:,}-{high:,} guidance: expect weaker instruction following"
    if n > high:
        return f"{n:,} examples: above the usual {low:,}-{high:,} guidance; fine, but more rarely helps a small model"
    return f"{n:,} examples: within the usual {low:,}-{high:,} guidance"


# ----------------------------------------------------------------------------------------------------------------
# a JSONL file


def read_jsonl(
    path: Path,
    system_prompt: str | None = None,
    length: Callable[[Messages], int] | None = None,
    max_length: int | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> tuple[list[Example], DataReport]:
    """Valid examples of a JSONL file, in file order, and the report of what was skipped (line numbers and reasons).

    `length(messages)` measures an example (tokens of the rendered chat; default: characters); longer than
    `max_length` is skipped. `limit`: at most that many examples, a uniform choice among those that fit, seeded by
    `seed`: the lines are measured in a seeded order until `limit` fit, and the rest are never measured
    (`report.beyond_cap`). Raises ForgeError when the file is missing, or has no valid line.
    """
    path = Path(path)
    rows, lines, read = records.read_records(path, setting="the Q&A file")
    report = DataReport(source=str(path), lines=read.lines, skipped=list(read.skipped))
    measure = length or (lambda messages: sum(len(m["content"]) for m in messages))
    kept: list[tuple[int, Example]] = []  # (position in the file, example)
    order = measuring_order(len(rows), limit, seed)
    for measured, position in enumerate(order):
        if limit is not None and len(kept) == limit:
            report.beyond_cap = len(order) - measured
            break
        row, number = rows[position], lines[position]
        messages = records.conversation(row, system_prompt)
        if max_length is not None and (n := measure(messages)) > max_length:
            reason = f"over-length: {n} tokens > sft.max_seq_length={max_length}"
            report.skipped.append({"line": number, "reason": reason})
            continue
        meta = {k: v for k, v in row.items() if k not in ("question", "answer", "messages")}
        kept.append((position, Example(messages, number, meta)))
    examples = [example for _, example in sorted(kept, key=lambda pair: pair[0])]
    report.skipped.sort(key=lambda s: s["line"])
    report.valid = report.examples = len(examples)
    if not examples:
        raise ForgeError(
            f"{path}: no valid example in {report.lines} line(s) ({report.skipped_summary(5)}); {FORMAT_HINT}"
        )
    return examples, report


def measuring_order(rows: int, limit: int | None, seed: int) -> list[int] | range:
    """File order when every row may be kept; else a seeded shuffle, whose first `limit` rows that fit are a
    uniform choice among all that fit (what a seeded sample after measuring every row would be, at a fraction of
    the tokenizing)."""
    if limit is None or rows <= limit:
        return range(rows)
    return random.Random(seed).sample(range(rows), rows)
