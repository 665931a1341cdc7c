"""`forge register`: the run's candidate model becomes a new version of `registry.model_name`, carrying its evidence
(the files and tags registry/store.py lists) and its lineage.

    forge register --config configs/tiny-cpu.yaml            # a new version of registry.model_name

lineage.json: what the version was made of, for the gate and for whoever reads it later: the run and its config
(and its sha256), the code commit, the model's sha256, the data shards and tokenizer files by sha256, the base
model a continued-pretraining run started from, each stage's recorded hashes, and `evidence`: the sha256 of the
run's own test text and held-out Q&A set, which the eval reports stored with the version must have measured.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluation.text import split_id
from forge.config import ForgeConfig
from forge.hashing import sha256_file, sha256_tree
from forge.io import atomic_write_json, read_json_object
from forge.lineage import Stage, candidate_model, completed_manifest, git_commit, require_reads, run_stage
from forge.paths import run_dir
from forge.tracking import tracking_uri
from models import TOKENIZER_FILES
from registry.store import CANDIDATE, MAX_TAG

log = logging.getLogger("forge.registry")


@dataclass
class Sources:
    """The local files of one candidate: its model and the stages' evidence about it."""

    target: str  # sft or pretrain
    model: Path
    eval_dir: Path
    base_eval_dir: Path | None  # a fine-tune's: the eval of the model it was fine-tuned from
    quantize_dir: Path
    tokenizer_dir: Path


def candidate_sources(cfg: ForgeConfig) -> Sources:
    """The run's SFT model when its stage completed, else the pretrained one, with the matching eval directory."""
    run = run_dir(cfg)
    target, model = candidate_model(cfg)
    base_eval = run / "eval-pretrain" if target == "sft" else None
    return Sources(target, model, run / f"eval-{target}", base_eval, run / "quantize", run / "tokenizer")


def run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    """Register the run's candidate as a new version of `registry.model_name`, carrying its evidence."""
    src = candidate_sources(cfg)
    require_reads(cfg, "register", [src.target])  # eval and quantize are evidence: without them, only a warning
    # The registry itself is an input: the same candidate registered on another server is a new version there.
    inputs: dict[str, Path | str] = {"model": src.model, "registry": f"{tracking_uri(cfg)}#{cfg.registry.model_name}"}
    evidence = [("eval", src.eval_dir / "eval.json"), ("quantize", src.quantize_dir)]
    if src.base_eval_dir is not None:
        evidence.append(("base_eval", src.base_eval_dir / "eval.json"))
    for name, path in evidence:
        if path.exists():
            inputs[name] = path
        else:
            log.warning("register: %s not found: the version will carry no %s evidence and cannot pass the gate",
                        path, name)  # fmt: skip
    stage = Stage(name="register", cfg=cfg, inputs=inputs)
    return run_stage(stage, lambda s: _register(s, src), force=force)


def lineage(cfg: ForgeConfig, src: Sources) -> dict[str, Any]:
    """sha256 of the data shards, tokenizer, config and code commit, with each stage's recorded hashes."""
    run = run_dir(cfg)
    stages = {}
    for name in ("data", "tokenizer", "pretrain", "sft", src.eval_dir.name, "quantize"):
        manifest = completed_manifest(run / name)
        if manifest:
            stages[name] = {
                k: manifest.get(k) for k in ("config_hash", "git_commit", "inputs", "finished_at", "metrics")
            }
            outputs = manifest.get("outputs") or {}
            stages[name]["outputs"] = dict(list(outputs.items())[:500])
    tok_outputs = (stages.get("tokenizer") or {}).get("outputs") or {}
    return {
        "run": cfg.run_name,
        "target": src.target,
        "code_commit": git_commit(),
        "config_sha256": hashlib.sha256(cfg.to_yaml().encode()).hexdigest(),
        "config": cfg.model_dump(mode="json"),
        "model_sha256": sha256_tree(src.model),
        "data_shards": {k: v for k, v in tok_outputs.items() if k.startswith("shards/")},
        "tokenizer": {k: v for k, v in tok_outputs.items() if k in TOKENIZER_FILES},
        # model.init_from: the base model the run continued (path, kind, sha256, origin), as the tokenizer recorded it
        "base": (read_json_object(run / "tokenizer" / "report.json") or {}).get("base"),
        "evidence": evidence_hashes(cfg),
        "stages": stages,
    }


def evidence_hashes(cfg: ForgeConfig) -> dict[str, str | None]:
    """The sha256 of the run's own test text and held-out Q&A set, as evaluation computes them (eval.json's
    data.test_text_sha256 and data.qa_sha256): the gate refuses eval reports that measured anything else."""
    held_out = run_dir(cfg) / "qa" / "qa_eval.jsonl"
    return {
        "test_text_sha256": split_id(cfg, "test") if completed_manifest(run_dir(cfg) / "data") else None,
        "qa_sha256": sha256_file(held_out) if held_out.is_file() else None,
    }


def _register(stage: Stage, src: Sources) -> dict[str, float]:
    cfg, tracker = stage.cfg, stage.tracker
    client, run_id, name = tracker.client, tracker.run_id, cfg.registry.model_name
    lin = lineage(cfg, src)
    atomic_write_json(stage.dir / "lineage.json", lin)

    tags = {"forge.run": cfg.run_name, "forge.target": src.target, "forge.code_commit": str(lin["code_commit"]),
            "forge.sha256.model": lin["model_sha256"], "forge.sha256.lineage": sha256_file(stage.dir / "lineage.json"),
            "forge.gate.decision": "pending"}  # fmt: skip
    if lin["base"]:
        tags |= {"forge.base.sha256": lin["base"]["sha256"], "forge.base.origin": str(lin["base"]["origin"])[:MAX_TAG],
                 "forge.base.path": str(lin["base"]["path"])[:MAX_TAG]}  # fmt: skip
    client.log_artifacts(run_id, str(src.model), f"{CANDIDATE}/model")
    for gguf in sorted(src.quantize_dir.glob("model-*.gguf")) if completed_manifest(src.quantize_dir) else []:
        client.log_artifact(run_id, str(gguf), f"{CANDIDATE}/gguf")
        tags[f"forge.sha256.gguf.{gguf.stem.removeprefix('model-')}"] = sha256_file(gguf)
    for file in TOKENIZER_FILES:
        if (src.tokenizer_dir / file).is_file():
            client.log_artifact(run_id, str(src.tokenizer_dir / file), f"{CANDIDATE}/tokenizer")
    reports = {"eval.json": src.eval_dir / "eval.json", "report.md": src.eval_dir / "report.md",
               "quantize.json": src.quantize_dir / "quantize.json",
               "quantize-manifest.json": src.quantize_dir / "manifest.json"}  # fmt: skip
    if src.base_eval_dir is not None:
        reports["eval-base.json"] = src.base_eval_dir / "eval.json"
    for dest, path in reports.items():
        if path.is_file():
            with tempfile.TemporaryDirectory() as tmp:  # the artifact takes the file's name: copy under dest
                shutil.copyfile(path, Path(tmp) / dest)
                client.log_artifact(run_id, str(Path(tmp) / dest), f"{CANDIDATE}/reports")
            tags[f"forge.sha256.report.{dest}"] = sha256_file(path)
    client.log_artifact(run_id, str(stage.dir / "lineage.json"), CANDIDATE)

    eval_report = read_json_object(src.eval_dir / "eval.json")
    summary = eval_summary(eval_report)
    tags.update({f"forge.eval.{k}": str(v)[:MAX_TAG] for k, v in summary.items()})
    metrics = {f"eval.{m['name']}": m["value"] for m in (eval_report or {}).get("metrics", [])
               if m.get("group") in ("domain", "baseline", "benchmark")}  # fmt: skip
    tracker.log_metrics(metrics)

    _ensure_registered_model(client, name)
    source = f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/{CANDIDATE}"
    description = (f"Forge run {cfg.run_name} ({src.target} model); eval: {summary.get('verdict', 'none')}. "
                   "Promote only with `forge promote`.")  # fmt: skip
    mv = client.create_model_version(name, source, run_id=run_id, tags=tags, description=description)
    atomic_write_json(stage.dir / "version.json", {"name": name, "version": str(mv.version), "run_id": run_id,
                                                   "source": source, "tags": tags})  # fmt: skip
    log.info("register: %s version %s (%s model of run %s)", name, mv.version, src.target, cfg.run_name)
    return {"version": float(mv.version)}


def eval_summary(report: dict[str, Any] | None) -> dict[str, Any]:
    if report is None:
        return {"verdict": "no eval report"}
    flags = report.get("flags") or []
    out: dict[str, Any] = {
        "verdict": "pass" if report.get("passed") else "fail",
        "flags_failed": ",".join(str(f.get("name")) for f in flags if f.get("passed") is False) or "none",
        "sha256": (report.get("artifact") or {}).get("sha256"),
    }
    for m in report.get("metrics") or []:
        if m.get("group") == "domain" and isinstance(m.get("value"), (int, float)):
            out[m["name"]] = f"{m['value']:.6g}"
    return out


def _ensure_registered_model(client, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(
            name, tags={"forge.gated": "true"},
            description="Forge model. @production moves only through `forge promote` (the gate) and `forge rollback`.",
        )  # fmt: skip
