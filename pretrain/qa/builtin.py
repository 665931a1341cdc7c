"""The embedded corpus's Q&A set: question-answer pairs generated from the standard library's documentation.

Built from the same records as the embedded pretraining corpus (`pretrain.data.stdlib_corpus`: module, class and
function docstrings read with `ast`, plus the language-reference topics), with no download and in a fixed order,
so the same Python always gives the same pairs. Per public object (no `_private` part in its name):

  describe  "What does the function `json.dumps` do?"      -> the docstring's summary (first paragraph, <= 3 sentences)
  details   "What else should I know about `json.dumps`?"  -> the paragraphs after it (when there are any)
  members   "Which classes and functions does `json` define?" -> the documented public members (modules, classes)
  module    "Which module defines `json.JSONDecoder.decode`?" -> "json" (classes and functions, methods included)

`module` is the one short-answer type: a reply of a few characters, so exact match can be earned on an object never
seen (by reading its dotted name: a method's module is not its class). The long answers are in the docs' own
words, which no model reproduces word for word about an unseen object: their exact match is 0 for every model, and
token F1 and multiple choice are what measure them.

The question wording is picked among a few phrasings by a stable hash of the object, so it is varied but fixed.

Split BY OBJECT: every pair about an object goes to the same side, so a held-out object was never seen in SFT.
An object is held out when a stable hash of its name falls under `eval_fraction`, and always when the data stage
put its document in val or test (`pretrain_splits`: document id -> split, read from the data stage's outputs):
those docstrings were never pretrained on either, and each held-out pair records `pretrain_split` so the eval stage
can report them apart. Train pairs whose answer near-duplicates a held-out answer are then dropped
(decontamination), and near-duplicate answers within each side are removed (pretrain/qa/dedup.py); short answers
excepted, which repeat by design.

    train, held_out, report = build_split(eval_fraction=0.05, pretrain_splits=splits, dedup_cfg=..., seed=...)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

import xxhash

from forge.config import DedupConfig
from pretrain.data.stdlib_corpus import corpus_id, docstring, iter_stdlib_records
from pretrain.qa.dedup import HOLD_OUT_HASH_SEED, deduplicate

MIN_ANSWER_CHARS = 20  # shorter summaries ("Return x.") teach little
MAX_ANSWER_CHARS = 480  # whole sentences up to this; a longer first sentence drops the pair (tiny contexts)
MAX_SENTENCES = 3
MAX_MEMBERS = 24  # members listed in a "members" answer

QUESTIONS = {
    "module": [
        "What is the `{n}` module for?",
        "What does the Python module `{n}` provide?",
        "Describe the `{n}` module.",
    ],
    "class": ["What is the class `{n}`?", "What does the `{n}` class represent?", "Describe the class `{n}`."],
    "function": ["What does `{n}` do?", "What does the function `{n}` do?", "Explain what `{n}` does."],
    "topic": ["What does the Python language reference say about {n}?", "Explain the Python topic {n}."],
    "details": ["What else should I know about `{n}`?", "Give more details about `{n}`.", "Tell me more about `{n}`."],
    "members_module": ["Which classes and functions does the `{n}` module define?", "What is in the `{n}` module?"],
    "members_class": ["Which methods does the class `{n}` define?", "What methods does `{n}` have?"],
    "module_of": ["Which module defines `{n}`?", "In which module is `{n}` defined?", "What module is `{n}` in?"],
}
QTYPES = ("describe", "details", "members", "module")
SHORT_ANSWER_QTYPES = ("module",)  # answers that repeat by design (many objects, one module): exact dedup only

_SIGNATURE = re.compile(r"^[\w.]+\(.*\)(\s*->\s*.*)?$")  # "dumps(obj, *, skipkeys=False) -> str"
_UNDERLINE = re.compile(r"^[*=\-~^]{3,}$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\"'])")


def builtin_id() -> str:
    """What identifies the generated set: its corpus, the running Python's standard library (the generator's code is
    in the qa stage's skip key already)."""
    return f"{corpus_id()}:qa"


# ----------------------------------------------------------------------------------------------------------------
# docstring -> answers


def paragraphs(text: str) -> list[str]:
    """Prose paragraphs, each on one line: headings, doctest and indented code blocks are left out."""
    out = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = block.splitlines()
        if not lines or any(_UNDERLINE.match(line.strip()) for line in lines):
            continue  # a heading (title + underline) or a rule
        prose = []
        for line in lines:
            if line.startswith((" ", "\t", ">>>", "...")):
                break  # code from here on: a doctest or an indented example
            prose.append(line.strip())
        text = " ".join(line for line in prose if line)
        if text and not text.endswith(":"):  # "Example:" with its code removed says nothing
            out.append(text)
    return out


def clip_sentences(text: str, max_chars: int = MAX_ANSWER_CHARS, max_sentences: int = MAX_SENTENCES) -> str | None:
    """Whole sentences of `text`, at most `max_sentences` and `max_chars`; None if the first is already too long."""
    kept: list[str] = []
    for sentence in _SENTENCE_END.split(text):
        if len(kept) == max_sentences or len(" ".join([*kept, sentence])) > max_chars:
            break
        kept.append(sentence)
    return " ".join(kept) or None


def summary_and_details(text: str) -> tuple[str | None, str | None]:
    """(summary, details) answers from a docstring: the first prose paragraph, then the ones after it."""
    paras = paragraphs(text)
    if paras and _SIGNATURE.match(paras[0]):
        paras = paras[1:]  # a C-style signature line is not an answer
    if not paras:
        return None, None
    summary = clip_sentences(paras[0])
    if summary is not None and len(summary) < MIN_ANSWER_CHARS:
        summary = None
    details = clip_sentences(" ".join(paras[1:])) if len(paras) > 1 else None
    if details is not None and len(details) < 2 * MIN_ANSWER_CHARS:
        details = None
    return summary, details


# ----------------------------------------------------------------------------------------------------------------
# pairs


def is_public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def _pick(kind: str, name: str) -> str:
    options = QUESTIONS[kind]
    return options[xxhash.xxh64_intdigest(f"{kind}:{name}".encode()) % len(options)].format(n=name)


def _pair(question: str, answer: str, obj: str, doc_id: str, kind: str, qtype: str) -> dict[str, Any]:
    return {"question": question, "answer": answer, "object": obj, "doc_id": doc_id, "kind": kind, "qtype": qtype}


def generate_pairs(records: Iterable[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every Q&A pair of the stdlib records (default: the running Python's, generated once per process), in order."""
    if records is None:
        return [dict(p) for p in _stdlib_pairs()]
    return _generate(list(records))


@functools.lru_cache(maxsize=1)
def _stdlib_pairs() -> tuple[dict[str, Any], ...]:
    return tuple(_generate(list(iter_stdlib_records())))


def _generate(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    pairs: list[dict[str, Any]] = []
    members: dict[str, list[str]] = {}  # documented public object -> its documented public direct children
    kinds = {r["meta"]["object"]: r["meta"]["kind"] for r in records}
    for record in records:
        name, kind = record["meta"]["object"], record["meta"]["kind"]
        if kind != "topic" and not is_public(name):
            continue
        summary, details = summary_and_details(docstring(record))
        if summary is None:
            continue
        shown = name if kind != "topic" else f'"{name}"'
        pairs.append(_pair(_pick(kind, shown), summary, name, record["id"], kind, "describe"))
        if details is not None:
            pairs.append(_pair(_pick("details", shown), details, name, record["id"], kind, "details"))
        parent = name.rpartition(".")[0]
        if kind != "topic" and kinds.get(parent) in ("module", "class") and is_public(parent):
            members.setdefault(parent, []).append(name.rpartition(".")[2])
        if kind in ("class", "function") and (module := defining_module(name, kinds)) is not None:
            pairs.append(_pair(_pick("module_of", name), module, name, record["id"], kind, "module"))
    doc_ids = {r["meta"]["object"]: r["id"] for r in records}
    for parent, children in members.items():
        if len(children) < 2:
            continue
        listed = ", ".join(f"`{c}`" for c in children[:MAX_MEMBERS])
        more = f", and {len(children) - MAX_MEMBERS} more" if len(children) > MAX_MEMBERS else ""
        kind = kinds[parent]
        what = "defines these documented classes and functions" if kind == "module" else "has these documented methods"
        answer = f"The {kind} `{parent}` {what}: {listed}{more}."
        pairs.append(_pair(_pick(f"members_{kind}", parent), answer, parent, doc_ids[parent], kind, "members"))
    return pairs


def defining_module(name: str, kinds: dict[str, str]) -> str | None:
    """The nearest enclosing documented module of `name` ("json" for `json.JSONDecoder.decode`), else None."""
    parent = name.rpartition(".")[0]
    while parent and kinds.get(parent) != "module":
        parent = parent.rpartition(".")[0]
    return parent or None


# ----------------------------------------------------------------------------------------------------------------
# the split by object


def object_hash(name: str) -> float:
    """A stable number in [0, 1) from the object's name alone."""
    return xxhash.xxh64_intdigest(name.encode(), seed=HOLD_OUT_HASH_SEED) / 2**64


def held_out(pair: dict[str, Any], eval_fraction: float) -> bool:
    if pair["pretrain_split"] not in (None, "train"):
        return True
    return object_hash(pair["object"]) < eval_fraction


def build_split(
    eval_fraction: float,
    pretrain_splits: dict[str, str] | None,
    dedup_cfg: DedupConfig,
    seed: int,
    records: Iterable[dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(train pairs, held-out pairs, report). `pretrain_splits`: the data stage's split of each document id when it
    used this corpus (a document it never saw counts as not pretrained on: held out)."""
    pairs = generate_pairs(records)
    for pair in pairs:
        pair["pretrain_split"] = pretrain_splits.get(pair["doc_id"], "absent") if pretrain_splits is not None else None
    held = [held_out(p, eval_fraction) for p in pairs]
    eval_pairs, train_pairs, removed = deduplicate(
        [p for p, h in zip(pairs, held, strict=True) if h], [p for p, h in zip(pairs, held, strict=True) if not h],
        dedup_cfg, seed, SHORT_ANSWER_QTYPES,
    )  # fmt: skip
    eval_objects = {p["object"] for p, h in zip(pairs, held, strict=True) if h}
    before = len(train_pairs)  # an object with a held-out pair (another pair of it read from a held-out document)
    train_pairs = [p for p in train_pairs if p["object"] not in eval_objects]  # keeps no train pair of its own
    report = {
        "source": builtin_id(),
        "generated_pairs": len(pairs),
        "objects": len({p["object"] for p in pairs}),
        "held_out_objects": len({p["object"] for p in eval_pairs}),
        "near_duplicates_removed": sum(removed.values()),
        "train_pairs_of_held_out_objects": before - len(train_pairs),
        "train_pairs": len(train_pairs),
        "eval_pairs": len(eval_pairs),
        "eval_fraction": eval_fraction,
        "eval_unseen_in_pretraining": sum(1 for p in eval_pairs if p["pretrain_split"] not in (None, "train")),
        "by_qtype": {q: sum(1 for p in train_pairs if p["qtype"] == q) for q in QTYPES},
    }
    return train_pairs, eval_pairs, report
