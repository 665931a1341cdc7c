"""Shared fixtures: every test gets its own runs directory and the embedded MLflow store inside it."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def isolated_runs(tmp_path, monkeypatch):
    """Point FORGE_RUNS_DIR at a fresh directory and drop any MLFLOW_TRACKING_URI from the environment."""
    runs = tmp_path / "runs"
    monkeypatch.setenv("FORGE_RUNS_DIR", str(runs))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return runs
