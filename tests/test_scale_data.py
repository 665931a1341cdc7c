"""`forge data --executor ray` through the real CLI, on a local Ray instance of 2 CPUs, against the local executor
on the same corpus: the same kept documents (ids, texts, splits) and the same drop reasons, word for word.

The corpus is test_data_stage's dirty one (HTML, boilerplate, foreign languages, exact and near duplicates, a
val/train leak, unreadable files), padded with near-duplicate clusters so the banding has buckets of every size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_data_stage import SPLIT, build_dirty_corpus, edit_words, english_docs, read_removed, read_shards

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent


def forge_data(runs: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FORGE_RUNS_DIR": str(runs), "OMP_NUM_THREADS": "1", "RAY_DISABLE_USAGE_STATS": "1"}
    env.pop("RAY_ADDRESS", None)  # a local instance, never a cluster this machine happens to know
    return subprocess.run([sys.executable, "-m", "forge.cli", "data", "--config", str(config), *args],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=240)  # fmt: skip


@pytest.mark.slow  # ~45 s on 2 busy cores: Ray's start (~10 s) and two MLflow stores
def test_ray_executor_keeps_and_drops_exactly_what_the_local_one_does(tmp_path, isolated_runs):
    root = tmp_path / "corpus"
    expect = build_dirty_corpus(root)
    (root / "denied.txt").unlink()  # needs an in-process monkeypatch (root ignores chmod); not in a subprocess
    base = english_docs(40)[30:]
    for k, doc in enumerate(base):  # clusters of 1-4 near copies (J >= 0.8 with 1-2 edits of ~80 words)
        for c in range(k % 4):
            (root / f"cluster{k}_{c}.txt").write_text(edit_words(doc, edits=1 + c % 2))
        (root / f"cluster{k}.txt").write_text(doc)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"data:\n  inputs: [{json.dumps(str(root))}]\n  split: {json.dumps(SPLIT)}\n  min_eval_tokens: 0\n"
        "registry:\n  tracking_uri: sqlite:///" + str(tmp_path / "mlflow.db") + "\n"
    )

    results = {}
    for executor in ("local", "ray"):
        start = time.time()
        workers = "1" if executor == "local" else "2"  # local: inline, no pool start-up (the same output)
        proc = forge_data(isolated_runs, config, "--run", executor, "--executor", executor,
                          "--set", f"data.workers={workers}")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = isolated_runs / executor / "data"
        kept = {i: (d["text"], d["split"]) for i, d in read_shards(out).items()}
        removed = {r["id"]: (r["filter"], r["reason"]) for r in read_removed(out)}
        report = json.loads((out / "report.json").read_text())
        results[executor] = kept, removed, report
        print(f"{executor}: {time.time() - start:.1f} s, {len(kept)} kept, {len(removed)} removed")
    assert "Ray local instance, 2 CPUs" in proc.stderr, proc.stderr[-2000:]

    (kept, removed, report), (ray_kept, ray_removed, ray_report) = results["local"], results["ray"]
    assert ray_kept == kept
    assert ray_removed == removed
    assert ray_report["duplicates"] == report["duplicates"] and ray_report["filters"] == report["filters"]
    # and the corpus exercised what it should: the dirty cases, and near-duplicate clusters found by banding
    assert set(expect["kept"]) <= set(kept)
    assert sum(f == "near_dedup" for f, _ in removed.values()) >= 10
    assert {f for f, _ in removed.values()} >= {"exact_dedup", "near_dedup", "decontamination", "language",
                                                "unreadable", "gopher_quality"}  # fmt: skip
    assert not (isolated_runs / "ray" / "data" / ".work").exists()


def test_a_bad_executor_is_a_one_line_error_naming_the_field():
    from typer.testing import CliRunner

    from forge.cli import app

    result = CliRunner().invoke(app, ["data", "--executor", "spark"])
    assert result.exit_code == 2
    assert "data.executor" in result.output and "'local' or 'ray'" in result.output, result.output


def test_an_unreachable_ray_address_is_a_one_line_error(tmp_path):
    from typer.testing import CliRunner

    from forge.cli import app

    (tmp_path / "a.txt").write_text("one document")
    port = _closed_port()
    result = CliRunner().invoke(app, ["data", "--set", f"data.inputs=[{tmp_path / 'a.txt'}]", "--executor", "ray",
                                      "--ray-address", f"127.0.0.1:{port}"])  # fmt: skip
    assert result.exit_code == 2
    assert f"data.ray_address='127.0.0.1:{port}': nothing answers there" in result.output, result.output


def _closed_port() -> int:
    from conftest import free_port

    return free_port()  # bound, then released: nothing listens there
