"""SFT data validation: every bad line skipped and reported with its line number, all-bad files are one clear error,
the count reported against the 10k-100k guidance. (Near-duplicates and the held-out split of a user's file are the
qa stage's: tests/test_qa_stage.py.)"""

from __future__ import annotations

import json

import pytest

from finetune.sft_data import guidance, read_jsonl
from forge import ForgeError
from pretrain.qa.records import conversation

GOOD_QA = {"question": "What does `os.getcwd` do?", "answer": "Return a string representing the current directory."}
GOOD_CHAT = {
    "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is `math.pi`?"},
        {"role": "assistant", "content": "The ratio of a circle's circumference to its diameter."},
        {"role": "user", "content": "And `math.e`?"},
        {"role": "assistant", "content": "Euler's number."},
    ]
}


def write_lines(path, lines):
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return path


def test_bad_lines_are_skipped_and_reported_with_line_numbers(tmp_path):
    lines = [
        GOOD_QA,  # 1
        '{"question": "unterminated',  # 2 invalid JSON
        {"question": "Where is the answer?"},  # 3 missing field
        {"question": "Empty?", "answer": "   "},  # 4 empty answer
        "",  # 5 blank: not a record, not an error
        {"question": "Long?", "answer": "x " * 400},  # 6 over-length
        GOOD_CHAT,  # 7
        {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]},  # 8 role order
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},  # 9 empty answer
        {"messages": [{"role": "robot", "content": "beep"}]},  # 10 unknown role
        [1, 2, 3],  # 11 not an object
        {"text": "a pretraining document"},  # 12 neither format
        {"question": 3, "answer": "three"},  # 13 wrong type
        {"messages": [{"role": "user", "content": "hi"}]},  # 14 no reply
    ]
    examples, report = read_jsonl(write_lines(tmp_path / "d.jsonl", lines), max_length=300)
    assert [e.line for e in examples] == [1, 7]
    reasons = {s["line"]: s["reason"] for s in report.skipped}
    assert sorted(reasons) == [2, 3, 4, 6, 8, 9, 10, 11, 12, 13, 14]
    assert "invalid JSON" in reasons[2]
    assert "missing field 'answer'" in reasons[3]
    assert reasons[4] == "empty answer" and reasons[9] == "empty answer"
    assert reasons[6].startswith("over-length: 8") and "max_seq_length=300" in reasons[6]
    assert "alternating" in reasons[8] and "robot" in reasons[10] and "JSON object" in reasons[11]
    assert "end on an assistant" in reasons[14]
    assert report.lines == 13 and report.valid == 2
    assert report.to_dict()["skipped"] == 11
    assert "line 2: invalid JSON" in report.skipped_summary()


def test_length_is_measured_by_the_given_function(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [GOOD_QA, GOOD_CHAT])
    examples, report = read_jsonl(path, length=lambda messages: 10 * len(messages), max_length=30)
    assert [e.line for e in examples] == [1] and report.skipped[0]["reason"].startswith("over-length: 50 tokens")


def test_all_bad_file_is_one_error_naming_the_file(tmp_path):
    path = write_lines(tmp_path / "broken.jsonl", ["nope", {"question": "q"}])
    with pytest.raises(ForgeError, match=r"broken\.jsonl: no valid example in 2 line\(s\) \(line 1: invalid JSON"):
        read_jsonl(path)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ForgeError, match="empty.jsonl: no valid example in 0 line.*the file is empty"):
        read_jsonl(tmp_path / "empty.jsonl")
    with pytest.raises(ForgeError, match="file not found"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_formats_and_system_prompt(tmp_path):
    assert conversation(GOOD_QA, "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": GOOD_QA["question"]},
        {"role": "assistant", "content": GOOD_QA["answer"]},
    ]
    assert conversation(GOOD_CHAT, "ignored: the conversation has its own")[0]["content"] == "Answer briefly."
    examples, _ = read_jsonl(write_lines(tmp_path / "d.jsonl", [GOOD_QA, GOOD_CHAT]), "Be brief.")
    assert examples[0].messages[0] == {"role": "system", "content": "Be brief."}
    assert examples[1].messages == GOOD_CHAT["messages"]


def test_guidance_against_the_usual_range():
    assert "below" in guidance(500) and "within" in guidance(10_000) and "above" in guidance(250_000)


def test_a_cap_chooses_the_examples_first_and_measures_only_those(tmp_path):
    rows = [{"question": f"Q{i}?", "answer": "x " * (400 if i % 10 == 0 else 3)} for i in range(1000)]
    path = write_lines(tmp_path / "d.jsonl", rows)
    measured: list[str] = []

    def length(messages):  # what tokenizing costs: counted
        measured.append(messages[0]["content"])
        return len(messages[1]["content"])

    examples, report = read_jsonl(path, length=length, max_length=100, limit=50, seed=3)
    lines = [e.line for e in examples]
    assert len(examples) == 50 == report.examples and lines == sorted(lines)  # file order
    assert all(line % 10 != 1 for line in lines)  # never an over-length one (line 1 is row 0)
    assert len(measured) < 100 and report.beyond_cap == 1000 - len(measured)  # the rest never tokenized
    assert {s["line"] for s in report.skipped} == {int(q[1:-1]) + 1 for q in measured if int(q[1:-1]) % 10 == 0}
    again, _ = read_jsonl(path, length=length, max_length=100, limit=50, seed=3)
    other, _ = read_jsonl(path, length=length, max_length=100, limit=50, seed=4)
    assert [e.line for e in again] == lines != [e.line for e in other]  # seeded
    everything, full = read_jsonl(path, length=length, max_length=100, limit=5000, seed=3)
    assert len(everything) == 900 and full.beyond_cap == 0 and len(full.skipped) == 100  # under the cap: all read
