"""SFT data: JSONL of {"question", "answer"} or {"messages": [...]}, validated line by line, near-duplicates removed.

    examples, report = read_jsonl(path, system_prompt=None, length=token_count, max_length=512)

Every line becomes a conversation (a list of {"role", "content"} messages) or is skipped with its line number and
the reason: invalid JSON, not an object, a missing or empty field, a bad role order, too long for
`sft.max_seq_length` (counted in tokens of the rendered chat when a tokenizer is given). A `messages` list is an
optional system message, then user/assistant turns alternating, ending on an assistant turn (the last reply is what
the example teaches; a trailing user turn would be dead weight). Other keys on a line are kept as metadata.
A file with no valid line is a ForgeError naming the file and the first problems.

Near-duplicate examples (MinHash + LSH, verified by Jaccard, from the data stage: `pretrain.data.dedup`) are removed,
keeping the first of each cluster; the count is reported against the seeds' 10k-100k guidance.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from forge import ForgeError
from forge.config import BUILTIN_CORPUS, DedupConfig, ForgeConfig
from pretrain.data.dedup import NearDeduper, candidate_pairs, jaccard, keep_mask, verified_clusters

log = logging.getLogger("forge.sft")

ROLES = ("system", "user", "assistant")
GUIDANCE = (10_000, 100_000)  # the seeds: 10k-100k quality examples are usually enough for a small model
QA_NGRAM = 2  # word n-gram size of near-duplicate detection on Q&A pairs (see near_duplicate_mask)
SHOWN_PROBLEMS = 20  # problems quoted in a log line or an error message; the report has them all

Messages = list[dict[str, str]]


@dataclass
class Example:
    messages: Messages
    line: int | None = None  # 1-based line of the source file (None: generated)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataReport:
    source: str
    lines: int = 0
    valid: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)  # {"line", "reason"}
    near_duplicates_removed: int = 0
    examples: int = 0

    def skipped_summary(self, limit: int = SHOWN_PROBLEMS) -> str:
        shown = "; ".join(f"line {s['line']}: {s['reason']}" for s in self.skipped[:limit])
        more = f"; ... {len(self.skipped) - limit} more" if len(self.skipped) > limit else ""
        return shown + more

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "lines": self.lines, "valid": self.valid, "skipped": len(self.skipped),
            "skipped_lines": self.skipped, "near_duplicates_removed": self.near_duplicates_removed,
            "examples": self.examples, "guidance": guidance(self.examples),
        }  # fmt: skip


def guidance(n: int) -> str:
    low, high = GUIDANCE
    if n < low:
        return f"{n:,} examples: below the seeds' {low:,}-{high:,} guidance: expect weaker instruction following"
    if n > high:
        return f"{n:,} examples: above the seeds' {low:,}-{high:,} guidance; fine, but more rarely helps a small model"
    return f"{n:,} examples: within the seeds' {low:,}-{high:,} guidance"


# ----------------------------------------------------------------------------------------------------------------
# one record -> one conversation


def to_messages(obj: Any, system_prompt: str | None = None) -> Messages:
    """The conversation of one JSONL record; raises ValueError with the reason it is unusable."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        messages = _check_messages(obj["messages"])
    elif "question" in obj or "answer" in obj:
        for key in ("question", "answer"):
            if key not in obj:
                raise ValueError(f"missing field {key!r}")
            if not isinstance(obj[key], str):
                raise ValueError(f"field {key!r} must be a string, got {type(obj[key]).__name__}")
            if not obj[key].strip():
                raise ValueError(f"empty {key}")
        messages = [{"role": "user", "content": obj["question"]}, {"role": "assistant", "content": obj["answer"]}]
    else:
        raise ValueError('missing fields: expected "question" and "answer", or "messages"')
    if system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def _check_messages(messages: Any) -> Messages:
    if not isinstance(messages, list) or not messages:
        raise ValueError('"messages" must be a non-empty list of {"role", "content"} objects')
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f'messages[{i}] must be an object with "role" and "content"')
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role={role!r}: use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string, got {type(content).__name__}")
        if not content.strip():
            raise ValueError(f"messages[{i}]: empty {role} content" if role != "assistant" else "empty answer")
        out.append({"role": role, "content": content})
    turns = out[1:] if out[0]["role"] == "system" else out
    expected = ["user", "assistant"] * (len(turns) // 2 + 1)
    if not turns or [m["role"] for m in turns] != expected[: len(turns)]:
        raise ValueError(
            "messages must be an optional system message, then user/assistant turns alternating from user; got "
            + " ".join(m["role"] for m in out)
        )
    if turns[-1]["role"] != "assistant":
        raise ValueError("the conversation must end on an assistant reply")
    return out


# ----------------------------------------------------------------------------------------------------------------
# a JSONL file


def read_jsonl(
    path: Path,
    system_prompt: str | None = None,
    length: Callable[[Messages], int] | None = None,
    max_length: int | None = None,
) -> tuple[list[Example], DataReport]:
    """Valid examples of a JSONL file and the report of what was skipped (line numbers and reasons).

    `length(messages)` measures an example (tokens of the rendered chat; default: characters); longer than
    `max_length` is skipped. Raises ForgeError when the file is missing, or has no valid line.
    """
    path = Path(path)
    if not path.is_file():
        raise ForgeError(f"sft.data={str(path)!r}: file not found (JSONL of question/answer or messages records)")
    report = DataReport(source=str(path))
    examples: list[Example] = []
    measure = length or (lambda messages: sum(len(m["content"]) for m in messages))
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue  # blank lines are not records
            report.lines += 1
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                report.skipped.append({"line": number, "reason": f"invalid JSON ({exc.msg} at column {exc.colno})"})
                continue
            try:
                messages = to_messages(obj, system_prompt)
                if max_length is not None and (n := measure(messages)) > max_length:
                    raise ValueError(f"over-length: {n} tokens > sft.max_seq_length={max_length}")
            except ValueError as exc:
                report.skipped.append({"line": number, "reason": str(exc)})
                continue
            meta = {k: v for k, v in obj.items() if k not in ("question", "answer", "messages")}
            examples.append(Example(messages, number, meta))
    report.valid = report.examples = len(examples)
    if not examples:
        detail = report.skipped_summary(5) or "the file is empty"
        raise ForgeError(
            f"{path}: no valid example in {report.lines} line(s) ({detail}); expected one JSON object per line: "
            '{"question": ..., "answer": ...} or {"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}'
        )
    if report.skipped:
        log.warning("sft data %s: skipped %d of %d lines: %s", path, len(report.skipped), report.lines,
                    report.skipped_summary())  # fmt: skip
    return examples, report


# ----------------------------------------------------------------------------------------------------------------
# near duplicates


def example_text(messages: Messages) -> str:
    """What near-duplicate detection compares: every turn's text (roles left out)."""
    return "\n".join(m["content"] for m in messages if m["role"] != "system")


def near_duplicate_labels(texts: Sequence[str], dedup_cfg: DedupConfig, seed: int) -> np.ndarray:
    """Cluster label per text: texts with a verified Jaccard >= threshold (transitively) share a label.

    The data stage's settings, with word n-grams of at most QA_NGRAM: a Q&A pair is a few dozen words, and with the
    5-word shingles built for documents a one-word edit of a 20-word answer leaves a Jaccard of ~0.6 (not caught).
    """
    if not texts:
        return np.zeros(0, dtype=np.int64)
    dedup_cfg = dedup_cfg.model_copy(update={"ngram": min(dedup_cfg.ngram, QA_NGRAM)})
    deduper = NearDeduper(dedup_cfg, seed)
    sets = [deduper.shingles(t) for t in texts]
    pairs = candidate_pairs(deduper.band_keys(deduper.signatures(sets)))
    labels, _ = verified_clusters(
        len(texts), pairs, lambda i, j: jaccard(sets[i], sets[j]), dedup_cfg.jaccard_threshold
    )
    return labels


def near_duplicate_mask(
    texts: Sequence[str], dedup_cfg: DedupConfig, seed: int, priority: Sequence[int] | None = None
) -> np.ndarray:
    """Keep mask: one text per cluster of near-duplicates; the lowest (priority, index) wins."""
    labels = near_duplicate_labels(texts, dedup_cfg, seed)
    order = np.zeros(len(texts), dtype=np.int64) if priority is None else np.asarray(priority, dtype=np.int64)
    return keep_mask(labels, order) if len(texts) else np.zeros(0, dtype=bool)


def remove_near_duplicates(
    examples: list[Example], dedup_cfg: DedupConfig, seed: int, report: DataReport | None = None
) -> list[Example]:
    keep = near_duplicate_mask([example_text(e.messages) for e in examples], dedup_cfg, seed)
    kept = [e for e, k in zip(examples, keep, strict=True) if k]
    if report is not None:
        report.near_duplicates_removed += len(examples) - len(kept)
        report.examples = len(kept)
    return kept


def split_held_out(
    examples: list[Example], eval_fraction: float, dedup_cfg: DedupConfig, seed: int
) -> tuple[list[Example], list[Example]]:
    """(train, held-out) of a user file, by a stable hash of the first question. Near-duplicate examples are removed
    (held-out ones preferred), then every train example whose final answer near-duplicates a held-out answer
    (decontamination: the answer is what `forge eval` scores)."""
    import xxhash

    from finetune.qa_builtin import QA_HASH_SEED

    def key(e: Example) -> float:
        first = next(m["content"] for m in e.messages if m["role"] == "user")
        return xxhash.xxh64_intdigest(" ".join(first.lower().split()).encode(), seed=QA_HASH_SEED) / 2**64

    held = [key(e) < eval_fraction for e in examples]
    ordered = [e for e, h in zip(examples, held, strict=True) if h]
    n_eval = len(ordered)
    ordered += [e for e, h in zip(examples, held, strict=True) if not h]
    priority = [0] * n_eval + [1] * (len(ordered) - n_eval)
    keep = near_duplicate_mask([example_text(e.messages) for e in ordered], dedup_cfg, seed, priority)
    held_out = [e for e, k in zip(ordered[:n_eval], keep[:n_eval], strict=True) if k]
    train = [e for e, k in zip(ordered[n_eval:], keep[n_eval:], strict=True) if k]
    if held_out and train:
        labels = near_duplicate_labels([e.messages[-1]["content"] for e in held_out + train], dedup_cfg, seed)
        leaked = set(labels[: len(held_out)].tolist())
        train = [e for e, label in zip(train, labels[len(held_out) :], strict=True) if label not in leaked]
    return train, held_out


def data_input(cfg: ForgeConfig) -> Path | str:
    """The Q&A data's identity for a skip key (SFT's and eval's): the JSONL file (hashed by content), or everything
    that decides the builtin set and its held-out split."""
    if cfg.sft.data != BUILTIN_CORPUS:
        path = Path(cfg.sft.data)
        if not path.is_file():
            raise ForgeError(f"sft.data={cfg.sft.data!r}: file not found; use a JSONL file or {BUILTIN_CORPUS}")
        return path
    from finetune.qa_builtin import builtin_id

    pretrain = cfg.data.split if BUILTIN_CORPUS in cfg.data.inputs else None
    return json.dumps({
        "qa": builtin_id(), "pretrain_split": pretrain, "eval_fraction": cfg.sft.eval_fraction,
        "dedup": cfg.data.dedup.model_dump(), "seed": cfg.seed,
    }, sort_keys=True)  # fmt: skip
