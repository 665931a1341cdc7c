"""Q&A records: one JSON object per line, validated line by line; what `forge qa` writes and what it reads.

A line is {"question": ..., "answer": ...} or {"messages": [...]}: an optional system message, then user/assistant
turns alternating from user and ending on an assistant reply (the last reply is the answer the pair teaches and
that `forge eval` scores; the last user turn is its question). Other keys are kept. An unusable line is skipped with
its line number and the reason: invalid JSON, not an object, a missing, empty or non-string field, a bad role
order. A file with no valid line is a ForgeError naming the file and the first problems.

    records, report = read_records(Path("my_pairs.jsonl"))   # report: lines, valid, skipped [{"line", "reason"}]
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.io import iter_jsonl

log = logging.getLogger("forge.qa")

ROLES = ("system", "user", "assistant")
SHOWN_PROBLEMS = 20  # problems quoted in a log line or an error message; the report has them all
FORMAT_HINT = (
    'expected one JSON object per line: {"question": ..., "answer": ...} or '
    '{"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}'
)

Messages = list[dict[str, str]]


@dataclass
class ReadReport:
    source: str
    lines: int = 0
    valid: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)  # {"line", "reason"}

    def skipped_summary(self, limit: int = SHOWN_PROBLEMS) -> str:
        shown = "; ".join(f"line {s['line']}: {s['reason']}" for s in self.skipped[:limit])
        more = f"; ... {len(self.skipped) - limit} more" if len(self.skipped) > limit else ""
        return shown + more


# ----------------------------------------------------------------------------------------------------------------
# one record


def conversation(obj: Any, system_prompt: str | None = None) -> Messages:
    """The conversation of one record, `system_prompt` first unless it has its own system message; ValueError says
    why a record is unusable."""
    messages = _conversation(obj)
    if system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def _conversation(obj: Any) -> Messages:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        return _check_messages(obj["messages"])
    if "question" in obj or "answer" in obj:
        for key in ("question", "answer"):
            if key not in obj:
                raise ValueError(f"missing field {key!r}")
            if not isinstance(obj[key], str):
                raise ValueError(f"field {key!r} must be a string, got {type(obj[key]).__name__}")
            if not obj[key].strip():
                raise ValueError(f"empty {key}")
        return [{"role": "user", "content": obj["question"]}, {"role": "assistant", "content": obj["answer"]}]
    raise ValueError('missing fields: expected "question" and "answer", or "messages"')


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


def normalized(obj: dict[str, Any], messages: Messages) -> dict[str, Any]:
    """A valid line as a record of the schema: question and answer always set (from the last turns of a
    conversation), qtype the line's own or None, every other key kept."""
    question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    record = {**obj, "question": question, "answer": messages[-1]["content"], "qtype": obj.get("qtype")}
    if "messages" in obj:
        record["messages"] = messages
    return record


# ----------------------------------------------------------------------------------------------------------------
# files


def read_records(
    path: Path, setting: str = "qa.source", allow_empty: bool = False
) -> tuple[list[dict[str, Any]], list[int], ReadReport]:
    """(valid records, their 1-based line numbers, what was read and skipped). `setting` names where the path came
    from, for the error when the file is missing; a file with no line at all is an error unless `allow_empty`."""
    path = Path(path)
    if not path.is_file():
        raise ForgeError(f"{setting}={str(path)!r}: file not found (JSONL of question/answer or messages records)")
    report = ReadReport(source=str(path))
    records: list[dict[str, Any]] = []
    numbers: list[int] = []
    for number, obj in iter_jsonl(path):
        report.lines += 1
        if isinstance(obj, json.JSONDecodeError):
            report.skipped.append({"line": number, "reason": f"invalid JSON ({obj.msg} at column {obj.colno})"})
            continue
        try:
            records.append(normalized(obj, conversation(obj)))
        except ValueError as exc:
            report.skipped.append({"line": number, "reason": str(exc)})
            continue
        numbers.append(number)
    report.valid = len(records)
    if not records and not (allow_empty and report.lines == 0):
        detail = report.skipped_summary(5) or "the file is empty"
        raise ForgeError(f"{path}: no valid example in {report.lines} line(s) ({detail}); {FORMAT_HINT}")
    if report.skipped:
        log.warning("%s: skipped %d of %d lines: %s", path, len(report.skipped), report.lines,
                    report.skipped_summary())  # fmt: skip
    return records, numbers, report


def read_held_out(path: Path, system_prompt: str | None = None) -> list[dict[str, Any]]:
    """The records of a held-out file (qa_eval.jsonl), each with `messages` set to the prompt a model is asked in:
    the conversation up to its answer, after the system prompt SFT trains with."""
    rows, _, _ = read_records(path, setting="the held-out Q&A file", allow_empty=True)
    return [{**r, "messages": conversation(r, system_prompt)[:-1]} for r in rows]
