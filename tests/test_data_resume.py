"""`forge data` resumes after its last complete pass (pretrain/data/pass_state.py): a crash costs the pass it hit,
the outputs are those of an uninterrupted run, and other settings start over."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from test_data_stage import build, english_docs, read_removed

from forge.config import DataConfig
from pretrain.data import stage

PASSES = ["extract", "clean", "dedup", "paragraphs"]


@pytest.fixture
def corpus(tmp_path) -> DataConfig:
    return make_corpus(tmp_path)


def make_corpus(tmp_path) -> DataConfig:
    """40 documents sharing paragraphs (paragraph dedup removes some, whole documents too), an exact copy."""
    root = tmp_path / "corpus"
    root.mkdir()
    docs = english_docs(44, per_doc=6)
    shared, rng = docs[40:], random.Random(0)
    for i, text in enumerate(docs[:40]):
        body = [text, *rng.sample(shared, 2)] if i % 3 else rng.sample(shared, 2)
        (root / f"d{i:02d}.txt").write_text("\n\n".join(body))
    (root / "zz_copy.txt").write_text(docs[5].upper())
    split = {"train": 0.8, "val": 0.1, "test": 0.1}
    return DataConfig(inputs=[str(root)], split=split, min_eval_tokens=0, boilerplate=False, workers=1)


def outputs(out: Path) -> dict:
    """What a run wrote: every shard's bytes, the removal log, the report (less the run's own name and times)."""
    report = json.loads((out / "report.json").read_text())
    report.pop("run", None)
    shards = {p.name: p.read_bytes() for p in sorted(out.glob("*-*.parquet"))}
    return {"shards": shards, "removed": read_removed(out), "report": report}


def crash(monkeypatch, name: str, after=None) -> None:
    """stage.<name> raises (after calling `after`, to leave a pass half done)."""

    def killed(*args, **kwargs):
        if after is not None:
            after(*args, **kwargs)
        raise RuntimeError(f"killed in {name}")

    monkeypatch.setattr(stage, name, killed)


def marks(run: str, runs: Path) -> list[str]:
    return json.loads((runs / run / "data" / ".work" / "passes.json").read_text())["done"]


def test_a_crash_in_the_write_pass_costs_only_the_write_pass(corpus, monkeypatch, isolated_runs):
    expected = outputs(build(corpus, run_name="whole"))
    assert any(r["filter"] == "paragraph_dedup" for r in expected["removed"])  # the write pass really drops some
    with monkeypatch.context() as m:
        crash(m, "_write_splits")
        with pytest.raises(RuntimeError, match="killed"):
            build(corpus, run_name="resumed")
    assert marks("resumed", isolated_runs) == PASSES
    for name in ("_extract", "_clean", "_deduplicate", "_index_paragraphs"):
        crash(monkeypatch, name)  # a resumed run must not run them again
    out = build(corpus, run_name="resumed")
    assert outputs(out) == expected
    assert not (out / ".work").exists()


def test_a_pass_cut_short_is_run_again_without_what_it_had_counted(corpus, monkeypatch, isolated_runs):
    expected = outputs(build(corpus, run_name="whole"))

    def half_done(cfg, cleaned, ids, hashes, keys, splits, stats, *rest):
        stats.drop({"id": "ghost", "text": "counted by the attempt that crashed"}, "exact_dedup", "exact copy of x")

    with monkeypatch.context() as m:
        crash(m, "_deduplicate", after=half_done)
        with pytest.raises(RuntimeError, match="killed"):
            build(corpus, run_name="resumed")
    assert marks("resumed", isolated_runs) == ["extract", "clean"]
    crash(monkeypatch, "_extract")
    crash(monkeypatch, "_clean")
    assert outputs(build(corpus, run_name="resumed")) == expected  # no ghost in the log or the counts


def test_other_settings_start_over(corpus, monkeypatch, isolated_runs):
    with monkeypatch.context() as m:
        crash(m, "_write_splits")
        with pytest.raises(RuntimeError, match="killed"):
            build(corpus, run_name="changed")
    extracted = []
    real = stage._extract
    monkeypatch.setattr(stage, "_extract", lambda *a, **k: extracted.append(1) or real(*a, **k))
    stricter = corpus.model_copy(update={"dedup": corpus.dedup.model_copy(update={"min_paragraph_chars": 400})})
    out = build(stricter, run_name="changed")
    assert extracted == [1]
    assert outputs(out) == outputs(build(stricter, run_name="fresh"))


def test_force_runs_every_pass_again(corpus, monkeypatch, isolated_runs):
    """`forge data --force` after a crash: every pass again, not a resume (run() passes resume=not force)."""
    with monkeypatch.context() as m:
        crash(m, "_write_splits")
        with pytest.raises(RuntimeError, match="killed"):
            build(corpus, run_name="forced")
    assert marks("forced", isolated_runs) == PASSES
    extracted = []
    real = stage._extract
    monkeypatch.setattr(stage, "_extract", lambda *a, **k: extracted.append(1) or real(*a, **k))
    s = stage.Stage(name="data", cfg=stage.ForgeConfig(run_name="forced", data=corpus))
    stage.build(s, resume=False)
    assert extracted == [1] and not (s.dir / ".work").exists()
