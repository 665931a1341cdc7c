"""MLflow tracking: one parent run per Forge run, one nested run per stage.

Where the runs go: `registry.tracking_uri` in the config, else $MLFLOW_TRACKING_URI, else an embedded store,
`sqlite:///runs/mlflow.db` with artifacts under `runs/mlartifacts` (no server needed; `make mlflow` serves the UI
over the same files). We talk to MLflow through `MlflowClient` with explicit run ids rather than the fluent
`mlflow.start_run` API: no global "active run" to leak between stages or into libraries that log on their own.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from forge.config import ForgeConfig
from forge.paths import runs_root

os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")  # MLflow probes git; we record the commit ourselves

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
MAX_ARTIFACT_BYTES = 50 << 20  # bigger files (checkpoints) stay on disk: the registry stage uploads models


def tracking_uri(cfg: ForgeConfig) -> str:
    if cfg.registry.tracking_uri:
        return cfg.registry.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    root = runs_root().resolve()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def client_for(cfg: ForgeConfig):  # -> mlflow.MlflowClient (imported lazily: MLflow is slow to import)
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri(cfg))


def experiment_id(client, cfg: ForgeConfig) -> str:
    experiment = client.get_experiment_by_name(cfg.registry.experiment)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if client.tracking_uri.startswith("sqlite:"):
        # Without this the embedded store writes artifacts to ./mlruns of whatever directory we run from.
        location = (runs_root().resolve() / "mlartifacts").as_uri()
    return client.create_experiment(cfg.registry.experiment, artifact_location=location)


def parent_run_id(client, cfg: ForgeConfig, exp_id: str) -> str:
    """The run that groups every stage of `cfg.run_name`, created on first use."""
    found = client.search_runs(
        [exp_id],
        filter_string=f"tags.`forge.run` = '{cfg.run_name}' and tags.`forge.kind` = 'run'",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    if found:
        return found[0].info.run_id
    tags = {"forge.run": cfg.run_name, "forge.kind": "run"}
    return client.create_run(exp_id, run_name=cfg.run_name, tags=tags).info.run_id


class StageTracker:
    """Logs one stage's params, metrics and artifacts to its MLflow run (and headline metrics to the parent)."""

    def __init__(self, client, run_id: str, parent_id: str, stage: str):
        self.client, self.run_id, self.parent_id, self.stage = client, run_id, parent_id, stage

    def log_params(self, nested: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flatten(nested).items()]
        for i in range(0, len(params), 100):  # MLflow accepts at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None, parent: bool = False) -> None:
        """Log the finite numeric values; `parent=True` also logs them to the run's parent as `<stage>.<key>`."""
        from mlflow.entities import Metric

        clean = {k: float(v) for k, v in metrics.items() if _is_finite_number(v)}
        if not clean:
            return
        ts = _millis()
        batch = [Metric(k, v, ts, step or 0) for k, v in clean.items()]
        self.client.log_batch(self.run_id, metrics=batch)
        if parent:
            summary = [Metric(f"{self.stage}.{k}", v, ts, 0) for k, v in clean.items()]
            self.client.log_batch(self.parent_id, metrics=summary)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_artifacts(self, directory: Path, exclude: tuple[str, ...] = ()) -> None:
        """Upload a stage directory's small files (reports, plots, configs); big ones and those matching an
        `exclude` glob (relative path, e.g. "shards/*", "*.gguf") stay on disk."""
        directory = Path(directory)
        for file in sorted(p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".")):
            relative = file.relative_to(directory).as_posix()
            if any(fnmatch.fnmatch(relative, pattern) for pattern in exclude):
                continue
            if file.stat().st_size <= MAX_ARTIFACT_BYTES:
                sub = file.parent.relative_to(directory).as_posix()
                self.log_artifact(file, None if sub == "." else sub)


@contextlib.contextmanager
def stage_run(cfg: ForgeConfig, stage: str) -> Iterator[StageTracker]:
    """An MLflow run for one stage, nested under the Forge run's parent; FAILED if the block raises."""
    client = client_for(cfg)
    exp_id = experiment_id(client, cfg)
    parent = parent_run_id(client, cfg, exp_id)
    tags = {"mlflow.parentRunId": parent, "forge.run": cfg.run_name, "forge.stage": stage, "forge.kind": "stage"}
    run_id = client.create_run(exp_id, run_name=stage, tags=tags).info.run_id
    status = "FAILED"
    try:
        yield StageTracker(client, run_id, parent, stage)
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status)
        client.set_terminated(parent, status)


def flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"train": {"lr": 1e-3}} -> {"train.lr": "0.001"}; lists become JSON; values cut at MLflow's limit."""
    flat: dict[str, str] = {}
    for key, value in nested.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            flat[name] = text[:MAX_PARAM_CHARS]
    return flat


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _millis() -> int:
    import time

    return int(time.time() * 1000)
