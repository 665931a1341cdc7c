"""Run lineage: manifests, atomic writes, and skipping a stage whose inputs and config are unchanged."""

from __future__ import annotations

import json

import pytest

from forge.config import load_config
from forge.hashing import sha256_file
from forge.io import atomic_path, atomic_write_text
from forge.lineage import Stage, read_manifest, run_stage


class CountingBody:
    """A stage body that records how often it ran and writes one output derived from its input."""

    def __init__(self, source):
        self.calls = 0
        self.source = source

    def __call__(self, stage):
        self.calls += 1
        (stage.dir / "out.txt").write_text(self.source.read_text().upper())
        return {"chars": float(len(self.source.read_text()))}


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text("some corpus")
    return path


def make_stage(cfg, source):
    return Stage("toy", cfg, inputs={"corpus": source}, spec="data")


def test_unchanged_stage_is_skipped_and_changes_rerun_it(source):
    cfg = load_config(None, ["run_name=lineage"])
    body = CountingBody(source)
    first = run_stage(make_stage(cfg, source), body)
    assert body.calls == 1 and first["status"] == "complete"

    again = run_stage(make_stage(cfg, source), body)
    assert body.calls == 1, "unchanged inputs and config must skip the stage"
    assert again["finished_at"] == first["finished_at"]

    unrelated = load_config(None, ["run_name=lineage", "train.lr=1e-2"])
    run_stage(make_stage(unrelated, source), body)
    assert body.calls == 1, "a change in a section the stage does not read must not re-run it"

    changed = load_config(None, ["run_name=lineage", "data.dedup.ngram=7"])
    run_stage(make_stage(changed, source), body)
    assert body.calls == 2, "a config change in the stage's section re-runs it"

    source.write_text("another corpus")
    run_stage(make_stage(changed, source), body)
    assert body.calls == 3, "an input change re-runs it"

    run_stage(make_stage(changed, source), body, force=True)
    assert body.calls == 4, "--force re-runs it"


def test_manifest_records_lineage(source, isolated_runs):
    cfg = load_config(None, ["run_name=lineage"])
    manifest = run_stage(make_stage(cfg, source), CountingBody(source))
    stage_dir = isolated_runs / "lineage" / "toy"
    on_disk = json.loads((stage_dir / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["inputs"] == {"corpus": sha256_file(source)}
    assert manifest["outputs"]["out.txt"] == sha256_file(stage_dir / "out.txt")
    assert manifest["outputs"]["config.yaml"] == sha256_file(stage_dir / "config.yaml")
    assert manifest["config_hash"] == cfg.section_hash("data")
    assert manifest["metrics"] == {"chars": 11.0}
    assert "torch" in manifest["versions"] and manifest["seed"] == cfg.seed
    assert load_config(stage_dir / "config.yaml") == cfg
    assert manifest["started_at"] <= manifest["finished_at"]


def test_failed_stage_is_recorded_and_rerun(source):
    cfg = load_config(None, ["run_name=lineage"])

    def broken(stage):
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        run_stage(make_stage(cfg, source), broken)
    manifest = read_manifest(make_stage(cfg, source).dir)
    assert manifest["status"] == "failed" and "disk on fire" in manifest["error"]

    body = CountingBody(source)
    run_stage(make_stage(cfg, source), body)
    assert body.calls == 1, "a failed stage is never considered up to date"


def test_atomic_path_leaves_nothing_behind_on_failure(tmp_path):
    final = tmp_path / "out" / "result.bin"
    with pytest.raises(ValueError), atomic_path(final) as tmp:
        tmp.write_bytes(b"half written")
        raise ValueError("crash mid-write")
    assert not final.exists()
    assert list(final.parent.iterdir()) == []

    atomic_write_text(final, "old")
    with pytest.raises(ValueError), atomic_path(final) as tmp:
        tmp.write_text("new but incomplete")
        raise ValueError
    assert final.read_text() == "old", "a failed rewrite keeps the previous complete file"


def test_atomic_path_replaces_directories(tmp_path):
    final = tmp_path / "model"
    for text in ("v1", "v2"):
        with atomic_path(final) as tmp:
            tmp.mkdir()
            (tmp / "weights").write_text(text)
    assert (final / "weights").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
