"""`forge qa`: the Q&A set from a corpus through the real data stage (answers are text of their split, held-out pairs
only from val/test documents), a user's file (it wins; bad lines reported), near-duplicates and decontamination,
the embedded set unchanged, and the refusal of the embedded set for any other corpus through the real CLI."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from forge import ForgeError
from forge.config import DedupConfig, ForgeConfig
from pretrain.data import stage as data_stage
from pretrain.qa import stage as qa_stage
from pretrain.qa.dedup import deduplicate, split_held_out
from pretrain.qa.extract import normalize

REPO = Path(__file__).resolve().parent.parent
FORGE = str(Path(sys.executable).with_name("forge"))
WORDS = ("widget", "record", "buffer", "cursor", "socket", "column", "journal", "lease", "ticket", "bucket", "shard",
         "token", "branch", "index", "schema", "cache", "queue", "frame", "packet", "volume")  # fmt: skip
VERBS = ("copies", "prunes", "merges", "signs", "rotates", "checks", "renames", "splits", "locks", "flushes")


def manual_page(i: int, rng: random.Random) -> str:
    """A man page as HTML: NAME, SYNOPSIS, DESCRIPTION, OPTIONS (a definition list), a section of prose."""
    cmd = f"tool{i}"
    a, b, c = rng.sample(WORDS, 3)
    options = "".join(
        f"<dt>--{w}-{i}</dt><dd><p>When set, {cmd} {rng.choice(VERBS)} every {w} it meets before the {b} of "
        f"page {i}, and reports each one on standard error.</p></dd>"
        for w in rng.sample(WORDS, 4)
    )
    return f"""<html><head><title>{cmd}(1) Manual Page</title></head><body>
<h1>{cmd}(1) Manual Page</h1>
<h2>NAME</h2><p>{cmd} - {rng.choice(VERBS)} the {a} of a {b} number {i}</p>
<h2>SYNOPSIS</h2><pre>{cmd} [--{a}-{i}] [--{c}-{i}] &lt;{b}&gt;</pre>
<h2>DESCRIPTION</h2><p>The {cmd} command {rng.choice(VERBS)} the {a} of each {b} it is given, number {i}.
It reads the {c} first and keeps a copy of the {a} until the end of the run.</p>
<h2>OPTIONS</h2><dl>{options}</dl>
<h2>Handling the {c}</h2><p>When the {c} of page {i} is missing, {cmd} {rng.choice(VERBS)} the {b} instead and
tells you which {a} was used. This makes the result of run {i} repeatable on every machine.</p>
</body></html>"""


@pytest.fixture(scope="module")
def manual(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("manual") / "manual"
    root.mkdir()
    rng = random.Random(3)
    for i in range(40):
        (root / f"tool{i}.html").write_text(manual_page(i, rng), encoding="utf-8")
    return root


def corpus_cfg(manual: Path, **qa) -> ForgeConfig:
    # Only the split and what the synthetic pages would trip are set: the pages share their templates (so the
    # near-duplicate and quality rules built for web text would flag them), and 40 pages need a wide val/test.
    data = {"inputs": [str(manual)], "split": {"train": 0.6, "val": 0.2, "test": 0.2}, "quality": {"enabled": False},
            "language": False, "boilerplate": False, "dedup": {"near": False, "paragraph": False}}  # fmt: skip
    return ForgeConfig(run_name="m", data=data, qa=qa)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def cleaned_texts(run: Path) -> dict[str, tuple[str, str]]:
    """doc id -> (split, cleaned text) from the data stage's shards."""
    out = {}
    for path in sorted((run / "data").glob("*-*.parquet")):
        for row in pq.read_table(path).to_pylist():
            out[row["id"]] = (path.name.split("-")[0], normalize(row["text"]))
    return out


def test_corpus_pairs_are_text_of_their_split_and_held_out_only_from_val_and_test(manual, isolated_runs):
    cfg = corpus_cfg(manual)
    data_stage.run(cfg)
    manifest = qa_stage.run(cfg)
    run = isolated_runs / "m"
    docs = cleaned_texts(run)
    train, held = read_jsonl(run / "qa" / "qa_train.jsonl"), read_jsonl(run / "qa" / "qa_eval.jsonl")
    assert train and held
    for side, pairs in (("train", train), ("held-out", held)):
        for p in pairs:
            split, text = docs[p["source"]["doc_id"]]
            assert p["source"]["split"] == split and normalize(p["answer"]) in text, (side, p)
            assert (split == "train") == (side == "train"), p  # held-out pairs only from val/test documents
    assert {p["source"]["kind"] for p in train + held} == {"corpus"}
    report = json.loads((run / "qa" / "report.json").read_text())
    assert report["pairs_per_1k_train_words"] >= 1.0 and manifest["metrics"]["train_pairs"] == len(train)
    kinds = set(report["by_qtype"])
    assert {"purpose", "synopsis", "description", "option", "section"} <= kinds
    assert all(1 <= len(report["samples"][k]) <= 10 for k in kinds)
    option = next(p for p in train if p["qtype"] == "option")
    assert option["question"].endswith(("?", ".")) and f"`{option['source']['doc_id'][7:-5]}`" in option["question"]
    md = (run / "qa" / "report.md").read_text()
    assert "## Pairs by kind" in md and "## Samples: option" in md and (run / "qa" / "pairs_by_kind.png").is_file()
    # unchanged data and config: skipped; the same seed gives the same file
    assert qa_stage.run(cfg)["finished_at"] == manifest["finished_at"]
    again = qa_stage.run(cfg, force=True)
    assert again["outputs"]["qa_train.jsonl"] == manifest["outputs"]["qa_train.jsonl"]


def test_a_cap_on_train_pairs_keeps_the_lowest_hash_documents_and_every_held_out_pair(manual, isolated_runs):
    from forge.hashing import hash_share

    cfg = corpus_cfg(manual)
    data_stage.run(cfg)
    qa_stage.run(cfg)
    run = isolated_runs / "m"
    train, held = read_jsonl(run / "qa" / "qa_train.jsonl"), read_jsonl(run / "qa" / "qa_eval.jsonl")
    cap = len(train) // 3
    capped = qa_stage.run(corpus_cfg(manual, max_train_pairs=cap))
    assert capped["metrics"]["train_pairs"] <= cap
    kept = read_jsonl(run / "qa" / "qa_train.jsonl")
    # held-out documents are all read: every held-out pair is still there (a few more may be, as an answer that
    # fewer sampled documents carry is not boilerplate)
    assert {(p["question"], p["answer"]) for p in held} <= {
        (p["question"], p["answer"]) for p in read_jsonl(run / "qa" / "qa_eval.jsonl")
    }
    order = sorted({p["source"]["doc_id"] for p in train}, key=hash_share)
    chosen = {k["source"]["doc_id"] for k in kept}
    assert chosen and chosen == set(order[: len(chosen)])  # the documents of lowest id hash, whatever the file order
    report = json.loads((run / "qa" / "report.json").read_text())
    assert report["details"]["train_documents_sampled"] >= len(chosen)
    assert any("qa.max_train_pairs" in reason for reason in report["skipped"])


def test_a_users_file_wins_and_its_bad_lines_are_reported(manual, isolated_runs, tmp_path):
    rng = random.Random(1)
    names = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7)) for _ in range(100)]
    rows = [{"question": f"How do I reset the {names[2 * i]}?", "answer": f"Hold its {names[2 * i + 1]} button."}
            for i in range(50)]  # fmt: skip
    lines = [json.dumps(r) for r in rows]
    lines[3], lines[7] = "{broken", json.dumps({"question": "Empty?", "answer": " "})
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = corpus_cfg(manual, source=str(path), eval_fraction=0.2)
    qa_stage.run(cfg)  # no data stage needed: the pairs are the user's
    run = isolated_runs / "m" / "qa"
    train, held = read_jsonl(run / "qa_train.jsonl"), read_jsonl(run / "qa_eval.jsonl")
    report = json.loads((run / "report.json").read_text())
    assert report["source"]["kind"] == "file" and len(train) + len(held) == 48 and held
    assert [s["line"] for s in report["details"]["skipped_lines"]] == [4, 8]
    assert {p["source"]["line"] for p in train + held} == set(range(1, 51)) - {4, 8}
    assert {p["question"] for p in train}.isdisjoint(p["question"] for p in held)
    assert all(p["qtype"] is None for p in train)
    with pytest.raises(ForgeError, match="qa.source='.*missing.jsonl': file not found"):
        qa_stage.run(corpus_cfg(manual, source=str(tmp_path / "missing.jsonl")))


def test_near_duplicates_go_and_a_held_out_answer_is_never_trained_on():
    base = (
        "Return a new list containing all items from the iterable in ascending order. A custom key function can "
        "be supplied to customize the sort order, and the reverse flag can be set to request the result in "
        "descending order. The sort is stable."
    )

    def pair(q, a, qtype="description"):
        return {"question": q, "answer": a, "qtype": qtype}

    held = [pair("What does `sorted` do?", base)]
    train = [
        pair("Describe `sorted`.", base.replace("new", "fresh")),  # a near copy of the held-out answer
        pair("What does `len` do?", "Return the number of items in a container, any container at all."),
        pair("What does `len` do now?", "Return the number of items in a container, any container at all."),
        pair("Which module defines `json.dumps`?", "json", "module"),  # short answers repeat by design
        pair("Which module defines `json.loads`?", "json", "module"),
        pair("Which module defines `json.loads`?", "json", "module"),  # an exact copy
    ]
    kept_held, kept_train, removed = deduplicate(held, train, DedupConfig(), seed=1, short_qtypes=("module",))
    assert kept_held == held
    assert [p["question"] for p in kept_train] == [
        "What does `len` do?", "Which module defines `json.dumps`?", "Which module defines `json.loads`?"
    ]  # fmt: skip
    assert removed == {"near_duplicates": 2, "decontaminated": 1}


def test_a_users_held_out_split_is_stable_and_decontaminated():
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8)) for _ in range(400)]
    records = [{"question": f"What does {words[2 * i]} do?", "answer": f"It computes {words[2 * i + 1]}."}
               for i in range(200)]  # fmt: skip
    train, held = split_held_out(records, 0.2, DedupConfig(), seed=1)
    train2, held2 = split_held_out(list(reversed(records)), 0.2, DedupConfig(), seed=1)
    questions = {r["question"] for r in held}
    assert 20 <= len(held) <= 60 and questions == {r["question"] for r in held2}
    assert questions.isdisjoint(r["question"] for r in train)
    assert len(train) + len(held) == 200 and len(train2) == len(train)
    # a train record that asks differently but gives a held-out answer is dropped (decontamination)
    leak = {"question": "Tell me, what is computed?", "answer": held[0]["answer"]}
    train3, held3 = split_held_out([*records, leak], 0.2, DedupConfig(), seed=1)
    assert len(held3) == len(held) and len(train3) == len(train)


@pytest.mark.slow
def test_the_embedded_set_is_split_by_the_data_stage_and_loses_no_pair(isolated_runs):
    """configs/tiny-cpu.yaml: every builtin pair the running Python's documentation gives (its count depends on the
    release, so it is counted here, not pinned) is either trained on or held out, none twice; every pair whose
    docstring the data stage put in val or test (a long one cut into sections: any of them) is held out, the rest
    by the hashed qa.eval_fraction; a held-out object never has a train pair."""
    from forge.config import load_config
    from pretrain.qa import builtin

    cfg = load_config(REPO / "configs" / "tiny-cpu.yaml")
    data_stage.run(cfg)
    qa_stage.run(cfg)
    run = isolated_runs / "tiny-cpu" / "qa"
    report = json.loads((run / "report.json").read_text())
    train, held = read_jsonl(run / "qa_train.jsonl"), read_jsonl(run / "qa_eval.jsonl")
    assert report["source"]["kind"] == "builtin"
    generated = report["details"]["generated_pairs"]
    assert generated == len(builtin.generate_pairs())
    dropped = report["details"]["near_duplicates_removed"] + report["details"]["train_pairs_of_held_out_objects"]
    assert len(train) + len(held) + dropped == generated
    splits = qa_stage.data_splits(cfg)
    for p in held:
        assert splits.get(p["source"]["doc_id"], "absent") != "train" or builtin.object_hash(p["object"]) < 0.02, p
    for p in train:
        assert splits.get(p["source"]["doc_id"]) == "train" and builtin.object_hash(p["object"]) >= 0.02, p
    assert not {p["object"] for p in train} & {p["object"] for p in held}
    unseen = report["held_out_splits"]["val"] + report["held_out_splits"]["test"]
    assert unseen == report["details"]["eval_unseen_in_pretraining"] > 0.9 * report["eval_pairs"]


def forge(*args: str, runs: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, "FORGE_RUNS_DIR": str(runs)}
    return subprocess.run([FORGE, *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.integration
def test_the_embedded_set_is_refused_for_any_other_corpus_through_the_cli(manual, isolated_runs):
    wrong = ["--set", f"data.inputs=[{manual}]", "--set", "qa.source=builtin", "--set", "plan.hardware=cpu"]
    for verb in (["qa"], ["sft"], ["eval", "--target", "pretrain"]):
        out = forge(*verb, *wrong, runs=isolated_runs)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, (verb, out.stderr[-2000:])
        assert "embedded Python standard-library" in lines[0] and "wrong domain" in lines[0]
        assert "--set qa.source=corpus" in lines[0] and "--set qa.source=PATH" in lines[0]  # the two ways out
    keep_pages = [
        "--set",
        "data.quality.enabled=false",
        "--set",
        "data.language=false",
        "--set",
        "data.dedup.near=false",
    ]
    out = forge("pipeline", "--no-serve", *wrong, *keep_pages, runs=isolated_runs)
    assert out.returncode == 1 and "pipeline stopped at qa: the Q&A set is the embedded" in out.stderr, out.stderr
    assert not (isolated_runs / "default" / "tokenizer").exists()  # nothing was trained on the wrong domain


# Debian's documentation packages: (package, the folder of pages, data.languages). Apache's French pages are the
# non-English set (230 of its 244 French pages are translations; the others link to the English ones).
MANUALS = {
    "sqlite": ("sqlite3-doc", "usr/share/doc/sqlite3", ["en"]),
    "git": ("git-doc", "usr/share/doc/git-doc", ["en"]),
    "apache-en": ("apache2-doc", "usr/share/doc/apache2-doc/manual/en", ["en"]),
    "apache-fr": ("apache2-doc", "usr/share/doc/apache2-doc/manual/fr", ["fr"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MANUALS))
def test_a_real_manual_gives_pairs_of_its_own_text(name, debian_docs, isolated_runs):
    """With only data.inputs (and data.languages) changed from the defaults: at least one pair per 1,000 train
    words, every answer text of its document's split, every held-out pair from a val/test document."""
    package, folder, languages = MANUALS[name]
    cfg = ForgeConfig(run_name=name, data={"inputs": [str(debian_docs(package) / folder)], "languages": languages})
    data_stage.run(cfg)
    qa_stage.run(cfg)
    run = isolated_runs / name
    docs = cleaned_texts(run)
    train, held = read_jsonl(run / "qa" / "qa_train.jsonl"), read_jsonl(run / "qa" / "qa_eval.jsonl")
    report = json.loads((run / "qa" / "report.json").read_text())
    assert report["pairs_per_1k_train_words"] >= 1.0, report["pairs_per_1k_train_words"]
    for p in train:
        split, text = docs[p["source"]["doc_id"]]
        assert split == "train" and normalize(p["answer"]) in text, p
    assert held, f"no held-out pair: the val/test documents of {package} gave none"
    for p in held:
        split, text = docs[p["source"]["doc_id"]]
        assert split in ("val", "test") and normalize(p["answer"]) in text, p
    assert all(p["question"].endswith(("?", ".")) for p in train + held)
    if languages == ["fr"]:  # asked in the corpus's language: French typography puts a space before "?"
        assert sum(p["question"].endswith(" ?") for p in train) > 0.5 * len(train)
    if name == "git":
        options = [p for p in train if p["qtype"] == "option"]
        assert len(options) > 500 and all("`-" in p["question"] for p in options)  # "the `--force` (`-f`) option"


@pytest.mark.slow
def test_the_pipeline_on_a_real_manual_evaluates_its_own_domain(debian_docs, isolated_runs):
    """configs/ci-smoke.yaml's tiny model pointed at git-doc: SFT trains on git's pairs and eval scores git's
    held-out pairs, per kind (the numbers prove the plumbing, not the model)."""
    manual = debian_docs("git-doc") / "usr/share/doc/git-doc"
    out = forge(
        "pipeline",
        "--no-serve",
        "--config",
        "configs/ci-smoke.yaml",
        "--run",
        "git-smoke",
        "--set",
        f"data.inputs=[{manual}]",
        "--set",
        "qa.source=auto",  # the smoke config's catalogue Q&A would be another domain: pairs from git's manual
        "--set",
        "registry.model_name=forge-git-smoke",
        "--set",  # the plumbing, not the model: 100 of the smoke config's 600 steps (~70 s less)
        "train.max_steps=100",
        runs=isolated_runs,
        timeout=1800,  # a guard against a hang: the whole lifecycle, on a machine that may be shared
    )
    run = isolated_runs / "git-smoke"
    assert out.returncode == 0 or "pipeline stopped at promote" in out.stderr, out.stderr[-3000:]
    qa = json.loads((run / "qa" / "report.json").read_text())
    assert qa["source"]["kind"] == "corpus" and qa["eval_pairs"] > 0
    trained = read_jsonl(run / "sft" / "sft_train.jsonl")
    skipped = json.loads((run / "sft" / "data_report.json").read_text())["skipped"]  # over sft.max_seq_length
    assert {t["source"]["kind"] for t in trained} == {"corpus"} and len(trained) + skipped == qa["train_pairs"]
    for target in ("pretrain", "sft"):
        report = json.loads((run / f"eval-{target}" / "eval.json").read_text())
        metrics = {m["name"]: m["value"] for m in report["metrics"]}
        assert metrics["qa_examples"] > 0 and "qa_f1" in metrics and "mc_acc.option" in metrics, target
        scored = read_jsonl(run / f"eval-{target}" / "qa_eval.jsonl")
        assert scored and all(s["source"]["split"] in ("val", "test") for s in scored)
    card = (run / "report.md").read_text()
    assert "## Domain Q&A (forge qa)" in card and "| source | corpus (qa.source=auto) |" in card
    samples = card.split("## Q&A samples, 10 of each kind")[1].split("\n## ")[0]
    for kind, n in qa["by_qtype"].items():  # pairs by kind, and 10 samples of each (all of a smaller kind)
        assert f"| pairs: {kind} | {n['train']} train, {n['held_out']} held-out |" in card
        assert samples.count(f"\n| {kind} | ") == min(10, n["train"] + n["held_out"]), kind
