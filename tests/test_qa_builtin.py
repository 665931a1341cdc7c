"""The embedded Q&A set: answers from docstrings, a split by object that keeps held-out objects out of SFT (and out
of pretraining when the data stage held their documents out), decontaminated, deterministic."""

from __future__ import annotations

import itertools

import pytest

from forge.config import ForgeConfig
from pretrain.data.passes import split_of
from pretrain.qa.builtin import build_split, generate_pairs, held_out, summary_and_details

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)


def record(name: str, kind: str, text: str) -> dict:
    return {"id": f"python-stdlib:{name}", "text": text, "source": name.split(".")[0],
            "meta": {"object": name, "kind": kind}}  # fmt: skip


RECORDS = [
    record("shapes", "module", "Geometric shapes and their areas.\n\nEverything here is pure Python."),
    record("shapes.Circle", "class", "A circle of a given radius.\n\nRadius must be positive."),
    record("shapes.Circle.area", "function", "area(self) -> float\n\nReturn the area of the circle in square units."),
    record(
        "shapes.Circle.grow",
        "function",
        "Grow the circle by a factor.\n\nExample:\n\n    >>> c.grow(2)\n\nThe radius is multiplied in place by it.",
    ),  # fmt: skip
    record("shapes._private", "function", "Internal helper that nobody should call directly."),
    record("shapes.tiny", "function", "Do it."),
    record("shapes.long", "function", "A " + "very " * 200 + "long sentence."),
]


def test_answers_come_from_the_docstring_prose():
    assert summary_and_details(RECORDS[2]["text"]) == ("Return the area of the circle in square units.", None)
    summary, details = summary_and_details(RECORDS[3]["text"])
    assert summary == "Grow the circle by a factor." and details == "The radius is multiplied in place by it."
    assert summary_and_details("Title\n=====\n\nThe body of the topic, in prose here.")[0] == (
        "The body of the topic, in prose here."
    )
    pairs = generate_pairs(RECORDS)
    by_object = {(p["object"], p["qtype"]): p for p in pairs}
    assert ("shapes._private", "describe") not in by_object  # private: skipped
    assert ("shapes.tiny", "describe") not in by_object  # too short to teach anything
    assert ("shapes.long", "describe") not in by_object  # first sentence longer than an answer may be
    assert by_object[("shapes.Circle", "describe")]["answer"] == "A circle of a given radius."
    assert "`shapes.Circle`" in by_object[("shapes.Circle", "describe")]["question"]
    assert by_object[("shapes.Circle", "members")]["answer"] == (
        "The class `shapes.Circle` has these documented methods: `area`, `grow`."
    )
    # the short-answer type: a method's module is not its class; a module has no module pair
    assert by_object[("shapes.Circle.area", "module")]["answer"] == "shapes"
    assert by_object[("shapes.Circle", "module")]["answer"] == "shapes"
    assert "`shapes.Circle.area`" in by_object[("shapes.Circle.area", "module")]["question"]
    assert ("shapes", "module") not in by_object and ("shapes._private", "module") not in by_object
    assert generate_pairs(RECORDS) == pairs  # deterministic, wording included


def test_split_is_by_object_and_follows_the_data_stage():
    pair = {"object": "shapes.Circle", "doc_id": "python-stdlib:shapes.Circle"}
    for split, expected in (("train", False), ("val", True), ("test", True), ("absent", True)):
        assert held_out({**pair, "pretrain_split": split}, 0.0) is expected
    assert held_out({**pair, "pretrain_split": None}, 0.999999) and not held_out({**pair, "pretrain_split": None}, 0.0)
    # the split is the data stage's, whatever it was sized by: a document it put in val is held out
    splits = {r["id"]: "train" for r in RECORDS} | {"python-stdlib:shapes.Circle": "val"}
    train, held, _ = build_split(0.0, splits, ForgeConfig().data.dedup, 0, RECORDS)
    assert {p["object"] for p in held} == {"shapes.Circle"} and {p["pretrain_split"] for p in held} == {"val"}
    assert "shapes.Circle" not in {p["object"] for p in train} and train


@pytest.fixture(scope="module")
def builtin():
    from pretrain.data.stdlib_corpus import iter_stdlib_records

    cfg = ForgeConfig()
    splits = {r["id"]: split_of(r["id"], cfg.data.split) for r in iter_stdlib_records()}
    return cfg, *build_split(0.05, splits, cfg.data.dedup, cfg.seed)


def test_builtin_set_is_disjoint_by_object_and_decontaminated(builtin):
    cfg, train, held, report = builtin
    train_objects = {p["object"] for p in train}
    held_objects = {p["object"] for p in held}
    assert train_objects.isdisjoint(held_objects)
    # every object the data stage kept out of pretraining is held out, never trained on
    assert all(p["pretrain_split"] == "train" for p in train)
    assert {p["pretrain_split"] for p in held} == {"train", "val", "test"}
    # no train answer equals a held-out one (near-duplicates are checked by MinHash in build_split), except the
    # short answers, which repeat by design and were not deduplicated: one pair per object
    long_answers = [{p["answer"] for p in side if p["qtype"] != "module"} for side in (train, held)]
    assert long_answers[0].isdisjoint(long_answers[1])
    module_objects = [p["object"] for p in train + held if p["qtype"] == "module"]
    assert len(module_objects) == len(set(module_objects)) > 1000
    module_answers = [{p["answer"] for p in side if p["qtype"] == "module"} for side in (train, held)]
    assert module_answers[0] & module_answers[1]
    # enough held-out pairs for forge eval's default 200 examples, and the counts add up
    assert len(held) >= cfg.eval.qa_max_examples and len(train) > 3000
    assert report["train_pairs"] == len(train) and report["eval_pairs"] == len(held)
    assert report["generated_pairs"] == len(train) + len(held) + report["near_duplicates_removed"]
    assert {p["qtype"] for p in held} == {"describe", "details", "members", "module"}
    assert all(p["answer"].strip() and p["question"].endswith(("?", ".")) for p in itertools.islice(train, 500))


def test_builtin_split_ignores_pretraining_when_the_corpus_was_not_used(builtin):
    cfg, train, held, _ = builtin
    from pretrain.data.stdlib_corpus import iter_stdlib_records

    records = list(itertools.islice(iter_stdlib_records(), 600))
    train2, held2, _ = build_split(0.05, None, cfg.data.dedup, cfg.seed, records)
    assert all(p["pretrain_split"] is None for p in train2 + held2)
    assert {p["object"] for p in held2} <= {p["object"] for p in held}  # same object hash on both paths
