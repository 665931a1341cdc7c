"""The `forge` command line, run as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from forge.config import load_config
from forge.stages import STAGES

pytestmark = pytest.mark.integration  # every test runs the forge CLI as a process

REPO = Path(__file__).resolve().parent.parent
FORGE = str(Path(sys.executable).with_name("forge"))


def forge(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([FORGE, *args], cwd=REPO, capture_output=True, text=True, env=env or os.environ, **kwargs)


def test_help_lists_every_verb():
    out = forge("--help")
    assert out.returncode == 0
    for verb in [*STAGES, "pipeline", "status"]:
        assert f" {verb} " in out.stdout, verb
    for verb in [*STAGES, "pipeline", "status"]:
        assert forge(verb, "--help").returncode == 0, verb


def test_bad_config_fails_with_one_line_naming_the_field():
    out = forge("pipeline", "--config", "configs/tiny-cpu.yaml", "--set", "model.num_attention_heads=7")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "model.num_attention_heads=7" in lines[0] and "hidden_size=256" in lines[0]
    assert "Traceback" not in out.stderr


def test_every_stage_in_the_table_resolves_to_its_code_and_help_names_that_file():
    out = forge("--help", env={**os.environ, "COLUMNS": "300"})
    for name, spec in STAGES.items():
        assert callable(spec.load()), name
        assert all(callable(spec.call(c)) for c in spec.calls), name
        assert (REPO / spec.code).is_file(), spec.code
        line = next(line for line in out.stdout.splitlines() if line.split()[1:2] == [name])
        assert f"(code: {spec.code})" in line, line
        assert set(spec.reads) <= set(STAGES), spec.reads


def test_status_of_an_unknown_run_is_a_clear_error():
    out = forge("status", "no-such-run")
    assert out.returncode == 2
    assert "no run 'no-such-run'" in out.stderr and "Traceback" not in out.stderr


def read_manifest(runs: Path, run: str, stage: str) -> dict:
    import json

    return json.loads((runs / run / stage / "manifest.json").read_text())


def test_unchanged_stage_is_skipped_and_a_config_change_reruns_it(isolated_runs):
    args = ["plan", "--config", "configs/tiny-cpu.yaml", "--run", "skiptest"]
    assert forge(*args).returncode == 0
    first = read_manifest(isolated_runs, "skiptest", "plan")

    again = forge(*args)
    assert again.returncode == 0 and "up to date, skipped" in again.stderr
    assert read_manifest(isolated_runs, "skiptest", "plan")["finished_at"] == first["finished_at"]

    steps = load_config(REPO / "configs" / "tiny-cpu.yaml").train.max_steps
    changed = forge(*args, "--set", f"train.max_steps={2 * steps}")
    assert changed.returncode == 0 and "skipped" not in changed.stderr
    rerun = read_manifest(isolated_runs, "skiptest", "plan")
    assert rerun["config_hash"] != first["config_hash"]
    assert rerun["metrics"]["tokens_planned"] == 2 * first["metrics"]["tokens_planned"]

    status = forge("status", "skiptest")
    assert status.returncode == 0
    assert any(line.split()[:2] == ["plan", "complete"] for line in status.stdout.splitlines())
    assert any(line.split()[:3] == ["data", "not", "run"] for line in status.stdout.splitlines())
