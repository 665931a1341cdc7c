"""The gate's evidence checked before anything trains (evaluation/evidence.py): a setting or a run's data that cannot
give a rule its min_items is refused by `forge plan` and the pipeline, naming what to change and to what."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evaluation import evidence
from forge import ForgeError
from forge.config import load_config

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_plan_refuses_eval_settings_that_cannot_reach_min_items(isolated_runs):
    env = {**os.environ, "FORGE_RUNS_DIR": str(isolated_runs)}
    cmd = [sys.executable, "-m", "forge.cli", "plan", "--config", "configs/tiny-cpu.yaml", "--set",
           "eval.qa_max_examples=20", "--set", "eval.text_items=12"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("error: the gate (configs/policies/gate.yaml) would refuse this run for want of evidence")
    assert "eval.text_items=12 gives quality:bits_per_byte<random_init 12 items, fewer than the gate's min_items=30: " \
           "set eval.text_items to at least 30" in error  # fmt: skip
    assert "set eval.qa_max_examples to at least 30" in error
    ok = subprocess.run(cmd[:6], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "quality:qa_f1>base" in ok.stdout and "evaluations: 2 of ~" in ok.stdout


def _fake_stages(runs: Path, run: str, held_out: int, train: int) -> None:
    """A complete qa stage with `held_out` pairs (what the check counts), its report's train pairs."""
    qa = runs / run / "qa"
    qa.mkdir(parents=True)
    (qa / "manifest.json").write_text(json.dumps({"stage": "qa", "status": "complete"}))
    (qa / "qa_eval.jsonl").write_text("".join(json.dumps({"question": f"q{i}?", "answer": "a"}) + "\n"
                                              for i in range(held_out)))  # fmt: skip
    (qa / "report.json").write_text(json.dumps({"train_pairs": train}))


def test_too_few_held_out_pairs_are_refused_naming_the_data_setting(isolated_runs):
    cfg = load_config(REPO / "configs" / "tiny-cpu.yaml", ["run_name=few", "data.inputs=[/data/manual]"])
    _fake_stages(isolated_runs, "few", held_out=12, train=400)
    with pytest.raises(ForgeError) as err:
        evidence.check(cfg, measure_speed=False)
    message = str(err.value)
    assert "quality:qa_f1>base can get only 12 items from this run's data, fewer than the gate's min_items=30" \
           in message  # fmt: skip
    assert "raise data.min_eval_tokens from 20,000 to about 50,000" in message
    assert "quality:mc_acc_pmi>chance can get only 12 items" in message


def test_the_sft_budget_is_stated_in_epochs_of_the_q_and_a_set(isolated_runs):
    cfg = load_config(REPO / "configs" / "base-smollm2.yaml", ["run_name=budget"])
    _fake_stages(isolated_runs, "budget", held_out=100, train=6756)
    report = evidence.check(cfg, measure_speed=False)
    assert report["sft"] == {"train_pairs": 6756, "examples_per_step": 8, "steps": cfg.sft.max_steps,
                             "epochs": round(cfg.sft.max_steps * 8 / 6756, 3)}  # fmt: skip
    assert f"{cfg.sft.max_steps:,} steps x 8 examples = " in evidence.render(report)
    by_rule = {r["rule"]: r for r in report["rules"]}
    assert by_rule["quality:bits_per_byte<init_from"]["drawn"] == cfg.eval.text_items
    assert by_rule["quality:qa_f1>base"]["items"] == min(cfg.eval.qa_max_examples, 100)
