"""How promote stops: a gate refusal and an MLflow that cannot be reached read differently, in `forge promote` (exit 1
with the decision table, or exit 2 with MLflow's error and the tracking URI) and in `forge pipeline` ("refused by the
gate", or "stopped at promote"); and forge/pipeline.py's drawing of the stages is forge/stages.py's PIPELINE."""

from __future__ import annotations

import pytest
from conftest import free_port
from test_registry import config, register, tiny_model_dir
from typer.testing import CliRunner

from forge import pipeline
from forge.stages import PIPELINE


@pytest.fixture(scope="module")
def model_src(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-model") / "model")


def promote_step(cfg, monkeypatch) -> dict:
    """The pipeline with its promote step alone: the outcome the report card and the last line are made from."""
    monkeypatch.setattr(pipeline, "PIPELINE", [("promote", {})])
    return pipeline.run_stages(cfg, force=False, echo=lambda line: None)


@pytest.mark.integration  # a real `mlflow server`
def test_a_refusal_and_an_unreachable_mlflow_are_told_apart(mlflow_server, isolated_runs, model_src, monkeypatch):
    from forge.cli import app

    name = "forge-test-refused-or-unreachable"
    register(mlflow_server, isolated_runs, "flagged", name, model_src, failing_flag="repetition")
    refused = promote_step(config(mlflow_server, "flagged", name), monkeypatch)
    assert refused["result"] == "refused by the gate", refused
    assert refused["reason"] == f"{name} v1 refused by the gate: red_flag:repetition"
    assert (isolated_runs / "flagged" / "promote" / "decision.json").is_file()

    # The same run against a tracking URI nothing listens on (a closed loopback port), without MLflow's minutes of
    # retries: a failed stage that names the server, never a refusal, and no stale decision on the report card.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    closed = f"http://127.0.0.1:{free_port()}"
    down = promote_step(config(closed, "flagged", name), monkeypatch)
    assert down["result"] == "stopped at promote" and "refused by the gate" not in down["reason"], down
    assert down["reason"].startswith(f"MLflow failed while reading {name} version 1 (tracking URI {closed}): ")
    assert "Connection refused" in down["reason"] and "registry.tracking_uri" in down["reason"]
    assert not (isolated_runs / "flagged" / "promote" / "decision.json").exists()

    common = ["--run", "flagged", "--set", "registry.experiment=forge-registry-tests"]
    cli_refused = CliRunner().invoke(app, ["promote", name, "1", *common, "--set",
                                           f"registry.tracking_uri={mlflow_server}"])  # fmt: skip
    assert cli_refused.exit_code == 1 and "decision: FAIL (1 failing: red_flag:repetition)" in cli_refused.output
    cli_down = CliRunner().invoke(app, ["promote", name, "1", *common, "--set", f"registry.tracking_uri={closed}"])
    assert cli_down.exit_code == 2, cli_down.output
    assert cli_down.output.startswith(f"error: MLflow failed while reading {name} version 1"), cli_down.output
    assert "refused by the gate" not in cli_down.output and "decision:" not in cli_down.output


def test_the_docstring_draws_the_pipeline_in_order():
    doc = pipeline.__doc__ or ""
    chain = " ".join(line.strip() for line in doc.splitlines() if line.startswith("    ") and "->" in line)
    drawn = [step.strip() for step in chain.split("->")]
    stages = [f"{name}({options['target']})" if "target" in options else name for name, options in PIPELINE]
    assert drawn[: len(stages)] == stages and drawn[len(stages)].startswith("report card"), drawn
