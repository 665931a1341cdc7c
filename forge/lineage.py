"""Run lineage: where each stage writes, what it records, and when it can be skipped.

Every stage writes under `runs/<run-name>/<stage>/`:
  config.yaml    the whole resolved run config
  manifest.json  sha256 of the stage's inputs and outputs, the config hash, git commit, library versions,
                 start/end times, status and headline metrics

The manifest is written last and atomically, so a stage is complete exactly when its manifest says so. A stage
whose skip key (the hash of the settings it reads, of its inputs and of its code, as forge.stages declares them)
equals that of its complete manifest is skipped; `force=True` re-runs it.
Files are written through forge.io's atomic writes; forge.paths says where runs live, forge.hashing how inputs
and outputs are hashed.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import platform
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from forge import ForgeError, tracking
from forge.code import code_fingerprint
from forge.config import ForgeConfig
from forge.hashing import hash_inputs, sha256_file
from forge.io import atomic_write_json, atomic_write_text, utc_now
from forge.paths import run_dir
from forge.stages import STAGES, StageSpec

log = logging.getLogger("forge")

MANIFEST = "manifest.json"
CONFIG_FILE = "config.yaml"
TRACKED_LIBRARIES = (
    "torch", "transformers", "tokenizers", "accelerate", "peft", "trl", "mlflow", "gguf",
    "llama_cpp_python", "gradio",
)  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# environment facts recorded in every manifest


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in TRACKED_LIBRARIES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


# ----------------------------------------------------------------------------------------------------------------
# stages


@dataclass
class Stage:
    """One stage of one run: its directory, its skip key and its manifest.

    `name` is the directory (eval-pretrain), `spec` the entry of forge.stages.STAGES it runs (eval; by default the
    name), which says what config it reads and what code it runs; `inputs` maps a name to an input file or
    directory (hashed by content) or to a literal id string (hashed by value).
    """

    name: str
    cfg: ForgeConfig
    inputs: Mapping[str, Path | str] = field(default_factory=dict)
    spec: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    tracker: Any = field(default=None, repr=False, compare=False)  # the StageTracker while the body runs
    # Globs of outputs not uploaded to MLflow (token shards, checkpoints, GGUFs): they stay on disk, hashed in the
    # manifest; the registry uploads the model a version needs.
    artifact_exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.spec or self.name) not in STAGES:
            raise ValueError(f"stage {self.spec or self.name!r} is not in forge.stages.STAGES: pass spec=<its entry>")
        undeclared = sorted(self.undeclared_inputs())
        if undeclared:  # a bug in the stage, not in the user's run: its skip key would hash outputs it does not declare
            raise ValueError(
                f"stage {self.name!r} takes inputs from {', '.join(undeclared)} without declaring them: add them to "
                f"STAGES[{self.entry.name!r}].reads in forge/stages.py"
            )

    def undeclared_inputs(self) -> set[str]:
        """The stages of this run whose directories hold an input of this stage but that its entry does not read."""
        run = run_dir(self.cfg).resolve()
        producers = set()
        for value in self.inputs.values():
            if isinstance(value, Path) and value.resolve().is_relative_to(run) and value.resolve() != run:
                producers.add(stage_of(value.resolve().relative_to(run).parts[0]))
        return producers - {self.entry.name, *self.entry.reads}

    @property
    def entry(self) -> StageSpec:
        """Its entry in forge.stages.STAGES: the settings it reads, the module its code starts in."""
        return STAGES[self.spec or self.name]

    @property
    def sections(self) -> tuple[str, ...]:
        return self.entry.settings

    @property
    def dir(self) -> Path:
        return run_dir(self.cfg) / self.name

    @property
    def manifest_path(self) -> Path:
        return self.dir / MANIFEST

    def read_manifest(self) -> dict[str, Any] | None:
        return read_manifest(self.dir)

    def skip_key(self) -> dict[str, Any]:
        """What must be unchanged for the stage to be skipped: the config it reads, its inputs, its code."""
        return {
            "config_hash": self.cfg.section_hash(*self.sections),
            "inputs": hash_inputs(self.inputs),
            "code": code_fingerprint(self.entry.module),
        }

    def changed(self, key: dict[str, Any]) -> list[str] | None:
        """What changed since the complete manifest ("settings", "inputs", "code"); None when there is none."""
        old = completed_manifest(self.dir)
        return None if old is None else [KEY_NAMES[k] for k in key if old.get(k) != key[k]]

    def up_to_date(self, key: dict[str, Any]) -> bool:
        return self.changed(key) == []

    def output_hashes(self) -> dict[str, str]:
        return {
            p.relative_to(self.dir).as_posix(): sha256_file(p)
            for p in sorted(self.dir.rglob("*"))
            if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
        }


def read_manifest(stage_dir: Path) -> dict[str, Any] | None:
    path = Path(stage_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None


def completed_manifest(stage_dir: Path) -> dict[str, Any] | None:
    """The stage's manifest if the stage completed, else None (never run, running, killed or failed)."""
    manifest = read_manifest(stage_dir)
    return manifest if manifest and manifest.get("status") == "complete" else None


def stage_of(directory: str) -> str:
    """The entry of forge.stages.STAGES that writes run directory `directory` (eval-sft -> eval)."""
    return next((name for name, spec in STAGES.items() if directory in (name, *spec.dirs)), directory)


def require_reads(cfg: ForgeConfig, stage: str, needs: Iterable[str]) -> dict[str, Path]:
    """The one check of a stage's inputs, before it writes anything: every directory in `needs` (the outputs of
    STAGES[stage].reads this run needs; its settings and options decide which) holds a complete stage of this run.

    Returns directory name -> path. Raises one ForgeError naming every missing stage and the commands that make
    them, in pipeline order; a directory of a stage that `stage` does not declare is a bug (ValueError).
    """
    undeclared = [d for d in needs if stage_of(d) not in STAGES[stage].reads]
    if undeclared:
        raise ValueError(f"{stage} needs {undeclared}: add them to STAGES[{stage!r}].reads in forge/stages.py")
    dirs = {d: run_dir(cfg) / d for d in needs}
    missing = {d: state for d, path in dirs.items() if (state := _incomplete(path))}
    if missing:
        what = "; ".join(f"{d} {state} ({dirs[d]})" for d, state in missing.items())
        commands = ", then ".join(f"`{_command(d)}`" for d in missing)
        raise ForgeError(
            f"forge {stage} reads what earlier stages of run {cfg.run_name!r} write: {what}; run {commands} with "
            "the same --config first"
        )
    return dirs


def _incomplete(stage_dir: Path) -> str | None:
    """Why the stage in `stage_dir` is not complete ("has not run", "is 'failed'"), or None when it is."""
    manifest = read_manifest(stage_dir)
    if manifest is None:
        return "has not run"
    return None if manifest.get("status") == "complete" else f"is {manifest.get('status')!r}"


def _command(directory: str) -> str:
    stage = stage_of(directory)
    target = directory.removeprefix(f"{stage}-")
    return f"forge {stage}" + (f" --target {target}" if target != directory else "")


KEY_NAMES = {"config_hash": "settings", "inputs": "inputs", "code": "code"}
MODEL_STAGES = ("sft", "pretrain")  # the stages that export a Hugging Face model directory, newest first


def candidate_model(cfg: ForgeConfig, target: str = "auto") -> tuple[str, Path]:
    """(stage, model dir) a later stage works on: the SFT model when SFT completed, else the pretrained one.

    `target` "auto" takes the newest completed of MODEL_STAGES; "sft" or "pretrain" asks for that one.
    """
    if target not in ("auto", *MODEL_STAGES):
        raise ForgeError(f"target={target!r}: use auto, {' or '.join(MODEL_STAGES)}")
    order = MODEL_STAGES if target == "auto" else (target,)
    for stage in order:
        model = run_dir(cfg) / stage / "model"
        if completed_manifest(model.parent) and (model / "config.json").is_file():
            return stage, model
    wanted = " nor ".join(str(run_dir(cfg) / stage / "model") for stage in order)
    raise ForgeError(
        f"no model: neither {wanted} exists with a complete manifest; run `forge {order[-1]}` with the same "
        "--config first" + (" (then optionally forge sft)" if target == "auto" else "")
    )


def run_stage(
    stage: Stage, body: Callable[[Stage], dict[str, float] | None], force: bool = False,
    key: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run `body(stage)` unless the stage is up to date; record the manifest and track it in MLflow.

    `key` is the stage's skip_key() when the caller computed it already (hashing its inputs reads them whole).

    The body writes its outputs into `stage.dir` and returns headline metrics (it may also fill `stage.metrics`);
    `stage.tracker` is its MLflow StageTracker, for metrics logged while it runs (per-step training curves).
    Returns the manifest. A failing body leaves a manifest with status "failed" and the error, then re-raises.
    """
    key = key or stage.skip_key()
    changed = None if force else stage.changed(key)
    if changed == []:
        log.info("%s: up to date, skipped (its inputs, settings and code unchanged; --force re-runs it)", stage.name)
        done = stage.read_manifest()
        assert done is not None  # changed() just read it complete
        return done
    if changed:
        log.info("%s: re-running, its %s changed since the last run", stage.name, " and ".join(changed))

    stage.dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(stage.dir / CONFIG_FILE, stage.cfg.to_yaml())
    manifest: dict[str, Any] = {
        "stage": stage.name,
        "run": stage.cfg.run_name,
        "status": "running",
        "sections": list(stage.sections),
        **key,
        "seed": stage.cfg.seed,
        "git_commit": git_commit(),
        "versions": library_versions(),
        "host": platform.node(),
        "user": getpass.getuser(),
        "started_at": utc_now(),
    }
    atomic_write_json(stage.manifest_path, manifest)
    start = time.time()
    with tracking.stage_run(stage.cfg, stage.name) as tracker:
        tracker.log_params(stage.cfg.settings(*stage.sections))
        stage.tracker = tracker
        try:
            returned = body(stage) or {}
        except BaseException as exc:
            manifest.update(status="failed", error=f"{type(exc).__name__}: {exc}", finished_at=utc_now())
            atomic_write_json(stage.manifest_path, manifest)
            raise
        stage.metrics.update(returned)
        manifest.update(
            status="complete",
            finished_at=utc_now(),
            duration_s=round(time.time() - start, 3),
            metrics=stage.metrics,
            outputs=stage.output_hashes(),
            mlflow_run_id=tracker.run_id,
        )
        tracker.log_metrics(stage.metrics, parent=True)
        atomic_write_json(stage.manifest_path, manifest)
        tracker.log_artifacts(stage.dir, exclude=stage.artifact_exclude)
    log.info("%s: done in %.1fs", stage.name, manifest["duration_s"])
    return manifest


def stage_states(run: Path, stage_names: list[str]) -> list[dict[str, Any]]:
    """The state of each stage of a run, for `forge status`."""
    rows: list[dict[str, Any]] = []
    for name in stage_names:
        manifest = read_manifest(run / name)
        if manifest is None:
            rows.append({"stage": name, "state": "not run", "metrics": {}})
            continue
        state = manifest.get("status", "unknown")
        if state == "running":
            state = "incomplete (running or killed)"
        rows.append({
            "stage": name, "state": state, "finished_at": manifest.get("finished_at"),
            "duration_s": manifest.get("duration_s"), "metrics": manifest.get("metrics", {}),
            "error": manifest.get("error"),
        })  # fmt: skip
    return rows
