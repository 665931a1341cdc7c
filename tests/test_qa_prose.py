"""Q&A from prose: pairs mined from running text without a model (pretrain/qa/prose.py), and pairs a teacher model
writes, kept only where the text supports them (pretrain/qa/teacher.py).

The prose corpus is a real manual made prose-only: the English Debian Reference's paragraphs (its <p> elements) with
its headings, lists, tables and code removed, one plain-text file per chapter. The teacher is SmolLM2-135M-Instruct
served by Forge's own llama-server: its pairs are poor (the point is the path, end to end), and the check is proved
on answers a test invents.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain.qa import prose, teacher

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent


def test_sentences_of_running_text_become_questions_answered_by_the_sentence_itself():
    text = (
        "A bare repository is a repository that has no working tree attached to it at all.\n\n"
        "The reflog is used to recover commits that are no longer reachable from any branch.\n\n"
        "To undo the last commit, run git reset with the HEAD~1 argument and keep the changes.\n\n"
        "By default, `git push` sends only the branches that already exist on the remote side.\n\n"
        "If the index file is missing, `git status` rebuilds it from the current commit first.\n\n"
        "Global settings are stored in the .gitconfig file in the home directory of each user.\n\n"
        "It is a very good idea to do this often.\n\n"  # no subject: nothing to ask
        "The following options are supported by the command.\n"  # leans on what follows: nothing
    )
    pairs = {p.question: p for p in prose.mine(text, "en", seed=0)}
    answers = {p.answer for p in pairs.values()}
    assert "What is a bare repository?" in pairs or "What is meant by a bare repository?" in pairs
    assert any(q.startswith(("What is the reflog", "What is the purpose of the reflog")) for q in pairs)
    assert any(q in pairs for q in ("How do I undo the last commit?", "How can I undo the last commit?",
                                    "What should I do to undo the last commit?"))  # fmt: skip
    assert any("`git push`" in q and "default" in q for q in pairs)
    assert any("`git status`" in q and "if the index file is missing" in q for q in pairs)
    assert "Where are global settings stored?" in pairs
    assert all(a in text.replace("\n", " ") for a in answers)  # every answer is the text's own sentence, whole
    assert not [a for a in answers if "good idea" in a or "following" in a]
    assert len(pairs) == 6


def test_a_this_command_sentence_is_asked_about_the_document_subject():
    text = "Remove unreachable objects from the repository.\n\nThis command runs a number of housekeeping tasks."
    pairs = prose.mine(text, "en", 0, subject=prose.document_subject("", "git-doc/git-gc.txt"))
    assert [p.question for p in pairs] == ["What does git-gc do?"]  # one per (kind, subject) in a document
    assert prose.document_subject("", "notes/chapter3.txt") is None  # not a name: no subject


@pytest.mark.parametrize(
    ("answer", "evidence", "why"),
    [
        ("It counts sprockets in the gearbox.", "The counter counts sprockets in the gearbox.", None),
        ("It measures the oil temperature every minute.", "The counter counts sprockets in the gearbox.",
         "answer not supported by the text (below 80% of its words)"),
        ("It counts sprockets in the gearbox.", "The counter was designed by a famous engineer.",
         "evidence not quoted from the text"),
        ("", "The counter counts sprockets in the gearbox.", "empty answer"),
    ],
)  # fmt: skip
def test_the_faithfulness_check_rejects_answers_the_text_does_not_hold(answer, evidence, why):
    chunk = "The counter counts sprockets in the gearbox. It writes the total to the service log at the end of a shift."
    assert teacher.rejection("What does the counter do?", answer, evidence, chunk, 0.8) == why
    assert teacher.rejection("The counter counts sprockets", answer, evidence, chunk, 0.8) in ("not a question",)


def test_invented_answers_from_a_teacher_are_rejected_and_counted_by_reason():
    chunk = teacher.Chunk("doc", "train", None, "The counter counts sprockets in the gearbox. It writes the total to "
                          "the service log at the end of a shift.")  # fmt: skip
    reply = json.dumps({"pairs": [
        {"question": "What does the counter count?", "answer": "Sprockets in the gearbox.",
         "evidence": "The counter counts sprockets in the gearbox."},
        {"question": "Who designed the counter?", "answer": "Ada Lovelace designed it in Paris in 1843.",
         "evidence": "The counter was designed by Ada Lovelace."},
        {"question": "Where is the total written?", "answer": "Into the cloud dashboard over Bluetooth.",
         "evidence": "It writes the total to the service log at the end of a shift."},
    ]})  # fmt: skip
    from collections import Counter

    from forge.config import TeacherConfig

    stats: Counter[str] = Counter()
    kept: list = []
    rejected: list = []
    teacher._judge(chunk, reply, TeacherConfig(model="x.gguf"), stats, kept, rejected)
    assert [k["question"] for k in kept] == ["What does the counter count?"]
    assert {r["reason"] for r in rejected} == {
        "evidence not quoted from the text",
        "answer not supported by the text (below 80% of its words)",
    }
    teacher._judge(chunk, "Sure! Here are some questions:", TeacherConfig(model="x.gguf"), stats, kept, rejected)
    assert stats["rejected: reply is not the JSON asked for"] == 1


# ----------------------------------------------------------------------------------------------------------------
# the real CLI on a real manual made prose-only


@pytest.fixture(scope="module")
def prose_manual(debian_docs, tmp_path_factory) -> Path:
    """The English Debian Reference's paragraphs, one plain-text file per chapter: no heading, list, table or code."""
    import lxml.html

    source = debian_docs("debian-reference-en") / "usr/share/debian-reference"
    root = tmp_path_factory.mktemp("prose") / "debian-reference-prose"
    root.mkdir()
    for page in sorted(source.glob("*.en.html")):
        tree = lxml.html.fromstring(page.read_bytes())
        paragraphs = [" ".join(p.text_content().split()) for p in tree.iter("p")]
        text = "\n\n".join(p for p in paragraphs if len(p.split()) >= 5)
        if text:
            (root / page.name.replace(".en.html", ".txt")).write_text(text + "\n")
    return root


@pytest.fixture(scope="module")
def prose_data(prose_manual, tmp_path_factory) -> tuple[Path, Path]:
    """(the runs directory, the config) after `forge data` on the prose-only manual: both tests below start there."""
    root = tmp_path_factory.mktemp("prose-runs")
    config = root / "prose.yaml"
    config.write_text(f"run_name: prose\ndata:\n  inputs: [{json.dumps(str(prose_manual))}]\n")
    done = forge("data", "--config", str(config), runs=root / "runs")
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "runs", config


def forge(*args: str, runs: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FORGE_RUNS_DIR": str(runs)}
    return subprocess.run([sys.executable, "-m", "forge.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)  # fmt: skip


@pytest.mark.slow
def test_a_prose_only_manual_gives_five_pairs_per_thousand_words_without_a_model(prose_data, tmp_path):
    runs, config = tmp_path / "runs", prose_data[1]
    shutil.copytree(prose_data[0], runs)
    done = forge("qa", "--config", str(config), runs=runs)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((runs / "prose" / "qa" / "report.json").read_text())
    print(
        f"\nprose-only Debian Reference: {report['train_pairs']} train + {report['eval_pairs']} held-out pairs, "
        f"{report['pairs_per_1k_train_words']} train pairs per 1,000 train words; by kind {report['by_qtype']}"
    )
    assert report["pairs_per_1k_train_words"] >= 5
    assert report["eval_pairs"] >= 30  # the gate's min_items for the held-out questions
    assert set(report["by_qtype"]) <= {k for k in prose.questions.PROSE_WORDINGS["en"]}


@pytest.mark.slow
def test_the_teacher_path_runs_end_to_end_and_asks_nothing_twice(prose_data, smollm2_gguf, tmp_path):
    runs, config = tmp_path / "runs", tmp_path / "teacher.yaml"
    shutil.copytree(prose_data[0], runs)
    teacher = f"    model: {json.dumps(str(smollm2_gguf))}\n    max_chunks: 3\n    pairs_per_chunk: 2\n"
    config.write_text(prose_data[1].read_text() + f"qa:\n  teacher:\n{teacher}")
    first = forge("qa", "--config", str(config), runs=runs)
    assert first.returncode == 0, first.stderr[-3000:]
    details = json.loads((runs / "prose" / "qa" / "report.json").read_text())["details"]["teacher"]
    print(f"\nteacher SmolLM2-135M on 3 chunks: {json.dumps({k: v for k, v in details.items() if 'sample' not in k})}")
    assert details["chunks"] == 3 and details["asked"] == 3 and details["cached"] == 0
    assert details["proposed"] + details["rejected"].get("reply is not the JSON asked for", 0) > 0
    assert details["kept"] + sum(details["rejected"].values()) >= details["proposed"]
    assert "Teacher (gguf:" in (runs / "prose" / "qa" / "report.md").read_text()
    again = forge("qa", "--config", str(config), "--force", runs=runs)
    assert again.returncode == 0, again.stderr[-3000:]
    cached = json.loads((runs / "prose" / "qa" / "report.json").read_text())["details"]["teacher"]
    assert cached["asked"] == 0 and cached["cached"] == 3 and cached["kept"] == details["kept"]
    assert "forge-teacher" not in again.stderr  # no server was started for a re-run the cache answers
