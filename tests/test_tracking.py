"""Tracking: stages log to MLflow, embedded by default and to a real `mlflow server` when one is configured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from forge.config import load_config
from forge.lineage import Stage, run_stage

pytestmark = pytest.mark.integration  # starts servers, processes or trains (tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent


def toy_body(stage):
    (stage.dir / "report.md").write_text("# toy report\n")
    stage.metrics["docs_kept"] = 123.0
    return {"removed_fraction": 0.25}


def test_import_mlflow_is_the_installed_package_not_the_repo_folder():
    """The repo's top-level mlflow/ folder (server setup, no Python) must never shadow the real package."""
    code = "import mlflow, sys; print(mlflow.__file__); print(hasattr(mlflow, 'start_run'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    path, has_start_run = out.stdout.split()
    assert "site-packages" in path and has_start_run == "True"
    assert not list((REPO / "mlflow").rglob("*.py")), "mlflow/ holds the server setup, no Python"


def test_stage_logs_to_the_embedded_store_by_default(isolated_runs):
    from mlflow import MlflowClient

    cfg = load_config(None, ["run_name=embedded"])
    manifest = run_stage(Stage("toy", cfg, spec="data"), toy_body)
    assert (isolated_runs / "mlflow.db").is_file()
    client = MlflowClient(f"sqlite:///{(isolated_runs / 'mlflow.db').resolve()}")
    run = client.get_run(manifest["mlflow_run_id"])
    assert run.data.metrics == {"docs_kept": 123.0, "removed_fraction": 0.25}
    assert run.data.params["data.dedup.jaccard_threshold"] == "0.8"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.md", "manifest.json", "config.yaml"} <= artifacts
    assert Path(run.info.artifact_uri.removeprefix("file://")).is_relative_to(isolated_runs.resolve())


@pytest.mark.slow
def test_stage_logs_to_a_real_mlflow_server(mlflow_server, monkeypatch):
    """Nested runs, params, metrics and artifacts arrive on a real server, from the lineage layer and the CLI."""
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    cfg = load_config(None, ["run_name=served"])
    first = run_stage(Stage("first", cfg, spec="data"), toy_body)
    second = run_stage(Stage("second", cfg, spec="pretrain"), toy_body)

    client = MlflowClient(mlflow_server)
    run = client.get_run(first["mlflow_run_id"])
    assert run.data.metrics["docs_kept"] == 123.0 and run.info.status == "FINISHED"
    parent_id = run.data.tags["mlflow.parentRunId"]
    assert client.get_run(second["mlflow_run_id"]).data.tags["mlflow.parentRunId"] == parent_id
    parent = client.get_run(parent_id)
    assert parent.data.tags["forge.run"] == "served"
    assert parent.data.metrics["first.docs_kept"] == 123.0 and parent.data.metrics["second.removed_fraction"] == 0.25
    assert {"report.md", "manifest.json"} <= {a.path for a in client.list_artifacts(run.info.run_id)}

    forge = Path(sys.executable).with_name("forge")
    out = subprocess.run([forge, "plan", "--config", "configs/tiny-cpu.yaml", "--run", "served"], cwd=REPO,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    (plan_run,) = client.search_runs([run.info.experiment_id], filter_string="tags.`forge.stage` = 'plan'")
    assert plan_run.data.tags["mlflow.parentRunId"] == parent_id
    assert plan_run.data.metrics["parameters"] == 4_458_752
    assert "plan.txt" in {a.path for a in client.list_artifacts(plan_run.info.run_id)}
