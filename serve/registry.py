"""The MLflow model registry and its gate: `forge register`, `forge promote`, `forge rollback`, `forge registry
history`, and `resolve_production` for `forge serve`.

    forge register --config configs/tiny-cpu.yaml            # a new version of registry.model_name
    forge promote forge-model 3 --config configs/tiny-cpu.yaml   # the gate; moves @production only if it passes
    forge rollback forge-model                               # @production back to the previous version that passed
    forge registry history forge-model                       # which version was in production when

A version's artifacts (the register stage's MLflow run, under `candidate/`):
  model/                     the HF model directory (weights, config, tokenizer files)
  gguf/model-<type>.gguf     the GGUF variants of runs/<run>/quantize/
  tokenizer/                 tokenizer.json, tokenizer_config.json, chat_template.jinja of runs/<run>/tokenizer/
  reports/eval.json          the eval report of that model (eval-sft, else eval-pretrain), plus report.md
  reports/quantize.json      the quantization report, and quantize-manifest.json (the quantize stage's manifest:
                             the sha256 of the model it read and of every GGUF it wrote)
  lineage.json               sha256 of the data shards, tokenizer, config and code commit, per stage
Tags on the version: forge.sha256.* (model, each GGUF, each report), forge.eval.* (the eval summary), forge.run,
forge.code_commit, and after each `forge promote` forge.gate.* (decision, failing, policy_sha256, time, user).

Open-source MLflow protects no alias: anyone with write access can move @production. So `promote` is the one path
that moves it and judges only evidence downloaded from the registry (never local files), and every alias move is
appended to an audit run (`registry:<name>` in the registry experiment), which MLflow itself does not keep.
`resolve_production` refuses a @production that the audit log did not put there or whose files changed.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evaluation import gate
from forge import ForgeError
from forge.config import ForgeConfig
from forge.hashing import sha256_file, sha256_tree
from forge.io import atomic_write_json, read_json_object, utc_now
from forge.lineage import Stage, candidate_model, completed_manifest, git_commit, run_stage
from forge.paths import run_dir, runs_root
from forge.tracking import client_for, experiment_id, tracking_uri
from models import TOKENIZER_FILES
from serve.verify import registry_tag, sha256_problems

log = logging.getLogger("forge.registry")

ALIAS = "production"
CANDIDATE = "candidate"  # artifact path, in the register stage's run, of the files a version carries
MAX_TAG = 4900  # MLflow's model version tag values stop at 5000 characters
EVENT_PREFIX = "forge.event."


# ----------------------------------------------------------------------------------------------------------------
# register


@dataclass
class Sources:
    """The local files of one candidate: its model and the stages' evidence about it."""

    target: str  # sft or pretrain
    model: Path
    eval_dir: Path
    quantize_dir: Path
    tokenizer_dir: Path


def candidate_sources(cfg: ForgeConfig) -> Sources:
    """The run's SFT model when its stage completed, else the pretrained one, with the matching eval directory."""
    run = run_dir(cfg)
    target, model = candidate_model(cfg)
    return Sources(target, model, run / f"eval-{target}", run / "quantize", run / "tokenizer")


def run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    """Register the run's candidate as a new version of `registry.model_name`, carrying its evidence."""
    src = candidate_sources(cfg)
    # The registry itself is an input: the same candidate registered on another server is a new version there.
    inputs: dict[str, Path | str] = {"model": src.model, "registry": f"{tracking_uri(cfg)}#{cfg.registry.model_name}"}
    for name, path in (("eval", src.eval_dir / "eval.json"), ("quantize", src.quantize_dir)):
        if path.exists():
            inputs[name] = path
        else:
            log.warning("register: %s not found: the version will carry no %s evidence and cannot pass the gate",
                        path, name)  # fmt: skip
    stage = Stage(name="register", cfg=cfg, sections=("registry",), inputs=inputs)
    return run_stage(stage, lambda s: _register(s, src), force=force)


def lineage(cfg: ForgeConfig, src: Sources) -> dict[str, Any]:
    """sha256 of the data shards, tokenizer, config and code commit, with each stage's recorded hashes."""
    run = run_dir(cfg)
    stages = {}
    for name in ("data", "tokenizer", "pretrain", "sft", src.eval_dir.name, "quantize"):
        manifest = completed_manifest(run / name)
        if manifest:
            stages[name] = {k: manifest.get(k) for k in ("config_hash", "git_commit", "inputs", "finished_at")}
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
        "stages": stages,
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


# ----------------------------------------------------------------------------------------------------------------
# reading a version back from the registry


def _version(client, name: str, version: str | int | None):
    from mlflow.exceptions import MlflowException

    try:
        if version is None:
            versions = client.search_model_versions(f"name = '{name}'")
            if not versions:
                raise ForgeError(f"registered model {name!r} has no versions; run `forge register` first")
            return max(versions, key=lambda v: int(v.version))
        return client.get_model_version(name, str(version))
    except MlflowException as exc:
        raise ForgeError(f"no version {version} of registered model {name!r} ({exc.error_code})") from None


def _audited_production(cfg: ForgeConfig, client, name: str, if_missing: str) -> tuple[Any, str, list[str], str]:
    """@production, its version as a string, the audit log's production stack and its top as text ("v3" or "none"),
    for checking that the alias is where `forge promote`/`forge rollback` left it. ForgeError when there is none."""
    prod = _production(client, name)
    if prod is None:
        raise ForgeError(f"{name} has no @{ALIAS} version: {if_missing}")
    stack = production_stack(events(cfg, name))
    # str(): the version is an int in the sqlite store, a str over REST
    return prod, str(prod.version), stack, f"v{stack[-1]}" if stack else "none"


def _production(client, name: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, ALIAS)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):  # no such model or alias
            return None
        raise ForgeError(f"cannot read {name}@{ALIAS} from the registry at {client.tracking_uri}: {exc}") from None


def download_version(cfg: ForgeConfig, client, name: str, version: str, dst: Path, path: str = "") -> Path:
    """Download the artifacts of `models:/NAME/VERSION` (or one file of them, `path`) into dst; the local path.

    The version's location comes from our client: MLflow's own `models:/` resolution reads the process-wide
    registry URI, not the one passed in."""
    import mlflow.artifacts

    source = client.get_model_version_download_uri(name, str(version)).rstrip("/")
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=f"{source}/{path}" if path else source, dst_path=str(dst), tracking_uri=tracking_uri(cfg)
    )
    return Path(local)


def read_evidence(root: Path) -> gate.Evidence:
    """The reports and the sha256 of the artifacts of a downloaded version directory."""
    model = root / "model"
    return gate.Evidence(
        eval_report=read_json_object(root / "reports" / "eval.json"),
        quantize_report=read_json_object(root / "reports" / "quantize.json"),
        quantize_manifest=read_json_object(root / "reports" / "quantize-manifest.json"),
        model_sha256=sha256_tree(model) if (model / "config.json").is_file() else None,
        gguf_sha256={p.name: sha256_file(p) for p in sorted((root / "gguf").glob("*.gguf"))},
    )


# ----------------------------------------------------------------------------------------------------------------
# promote


@dataclass
class Decision:
    name: str
    version: str
    passed: bool
    checks: list[gate.Check]
    policy_sha256: str
    previous: str | None  # the @production version before the decision

    def table(self) -> str:
        title = f"gate: {self.name} v{self.version} (policy sha256 {self.policy_sha256[:12]})"
        return gate.format_table(self.checks, title)


class GateRefused(ForgeError):
    """The gate refused a version; the message is the decision table."""


def promote(cfg: ForgeConfig, name: str | None = None, version: str | int | None = None) -> Decision:
    """Judge `models:/NAME/VERSION` (default: the newest version) by the gate policy; move @production if it passes.

    The decision, pass or fail, is tagged on the version and appended to the audit log. Returns the Decision; the
    caller decides how to fail (the CLI exits 1, the pipeline raises GateRefused).
    """
    name = name or cfg.registry.model_name
    policy = gate.load_policy(cfg.registry.gate_policy)
    client = client_for(cfg)
    mv = _version(client, name, version)
    prod = _production(client, name)
    version_s, prod_v = str(mv.version), str(prod.version) if prod else None  # int in the sqlite store
    with tempfile.TemporaryDirectory(prefix=".gate-", dir=_scratch()) as tmp:
        evidence = read_evidence(download_version(cfg, client, name, version_s, Path(tmp) / "candidate"))
        if prod is not None:
            evidence.production_version = prod_v
            if prod_v == version_s:
                evidence.production_eval = evidence.eval_report
            else:
                got = _try_download(cfg, client, name, prod_v, "reports/eval.json", Path(tmp) / "production")
                evidence.production_eval = read_json_object(got) if got else None
    checks = gate.evaluate(policy, evidence)
    decision = Decision(name, version_s, gate.passed(checks), checks, policy.sha256, prod_v)
    _record(cfg, client, decision)
    return decision


def promote_run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    """The pipeline's promote step: gate the version this run registered; raise GateRefused if it fails."""
    version = (read_json_object(run_dir(cfg) / "register" / "version.json") or {}).get("version")
    if version is None:
        raise ForgeError(f"no {run_dir(cfg)}/register/version.json: run `forge register` first")
    decision = promote(cfg, cfg.registry.model_name, version)
    print(decision.table())
    # For the run's report card: the decision this run got, pass or refuse (the audit log keeps all of them).
    atomic_write_json(run_dir(cfg) / "promote" / "decision.json", {
        "name": decision.name, "version": decision.version, "passed": decision.passed,
        "previous": decision.previous, "policy_sha256": decision.policy_sha256,
        "checks": [asdict(c) for c in decision.checks],
    })  # fmt: skip
    if not decision.passed:
        raise GateRefused(
            f"{decision.name} v{decision.version} refused by the gate: {', '.join(gate.failing(decision.checks))}"
        )
    return {"name": decision.name, "version": decision.version, "decision": "pass"}


def _try_download(cfg: ForgeConfig, client, name: str, version: str, path: str, dst: Path) -> Path | None:
    from mlflow.exceptions import MlflowException

    try:
        return download_version(cfg, client, name, version, dst, path)
    except (MlflowException, OSError):
        return None


def _scratch() -> Path:
    root = runs_root()
    root.mkdir(parents=True, exist_ok=True)
    return root


def _record(cfg: ForgeConfig, client, d: Decision) -> None:
    now, user = utc_now(), getpass.getuser()
    failing = gate.failing(d.checks)
    details = json.dumps([{"check": c.name, "detail": c.detail} for c in d.checks if not c.passed])
    tags = {
        "forge.gate.decision": "pass" if d.passed else "fail",
        "forge.gate.failing": ",".join(failing)[:MAX_TAG] or "none",
        "forge.gate.failing_detail": details[:MAX_TAG],
        "forge.gate.checks": f"{len(d.checks) - len(failing)}/{len(d.checks)} passed",
        "forge.gate.policy_sha256": d.policy_sha256,
        "forge.gate.policy": str(cfg.registry.gate_policy),
        "forge.gate.time": now,
        "forge.gate.user": user,
    }
    for key, value in tags.items():
        client.set_model_version_tag(d.name, d.version, key, value)
    event = {"action": "promote" if d.passed else "refuse", "version": d.version, "previous": d.previous,
             "policy_sha256": d.policy_sha256, "failing": failing}  # fmt: skip
    if d.passed:
        client.set_registered_model_alias(d.name, ALIAS, d.version)
        client.set_model_version_tag(d.name, d.version, "forge.production.since", now)
    _append_event(cfg, client, d.name, event, now, user)


# ----------------------------------------------------------------------------------------------------------------
# the audit log: which version was in production when (MLflow keeps no alias history)


def _audit_run(cfg: ForgeConfig, client, name: str, create: bool = True) -> str | None:
    exp = experiment_id(client, cfg)
    found = client.search_runs(
        [exp], filter_string=f"tags.`forge.kind` = 'registry' and tags.`forge.model` = '{name}'", max_results=1
    )
    if found:
        return found[0].info.run_id
    if not create:
        return None
    note = f"Audit log of `forge promote` / `forge rollback` for {name}: a tag per event."
    tags = {"forge.kind": "registry", "forge.model": name, "mlflow.note.content": note}
    return client.create_run(exp, run_name=f"registry:{name}", tags=tags).info.run_id


def _append_event(cfg: ForgeConfig, client, name: str, event: dict[str, Any], now: str, user: str) -> None:
    from mlflow.entities import Metric

    run_id = _audit_run(cfg, client, name)
    seq = len(_events_of(client.get_run(run_id))) + 1
    record = {"seq": seq, "time": now, "user": user, **event}
    client.set_tag(run_id, f"{EVENT_PREFIX}{seq:06d}", json.dumps(record))
    if event["action"] in ("promote", "rollback"):  # the production version over time, as a chart in the UI
        client.log_batch(run_id, metrics=[Metric("production_version", float(event["version"]), _millis(), seq)])


def _events_of(audit) -> list[dict[str, Any]]:
    tags = audit.data.tags
    return [json.loads(tags[k]) for k in sorted(k for k in tags if k.startswith(EVENT_PREFIX))]


def events(cfg: ForgeConfig, name: str | None = None) -> list[dict[str, Any]]:
    """Every promote, refusal and rollback of the model, oldest first."""
    name = name or cfg.registry.model_name
    client = client_for(cfg)
    run_id = _audit_run(cfg, client, name, create=False)
    return _events_of(client.get_run(run_id)) if run_id else []


def production_stack(log_events: list[dict[str, Any]]) -> list[str]:
    """Replay the moves: a promotion pushes its version, a rollback pops back to its target. Top = in production."""
    stack: list[str] = []
    for e in log_events:
        version = str(e["version"])
        if e["action"] == "promote" and (not stack or stack[-1] != version):
            stack.append(version)
        elif e["action"] == "rollback":
            while stack and stack[-1] != version:
                stack.pop()
            if not stack:
                stack.append(version)
    return stack


def history(cfg: ForgeConfig, name: str | None = None) -> list[dict[str, Any]]:
    """Production periods, oldest first: {version, from, until (None: still in production), action, user}."""
    return production_periods(events(cfg, name))


def production_periods(log_events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    periods: list[dict[str, Any]] = []
    for e in log_events:
        if e["action"] not in ("promote", "rollback"):
            continue
        if periods:
            periods[-1]["until"] = e["time"]
        periods.append({"version": str(e["version"]), "from": e["time"], "until": None, "action": e["action"],
                        "user": e.get("user"), "seq": e["seq"]})  # fmt: skip
    return periods


def format_history(log_events: list[dict[str, Any]]) -> str:
    """The events table, then which version was in production when."""
    if not log_events:
        return "no promotions, refusals or rollbacks recorded"
    events_rows = [("seq", "time", "action", "version", "previous", "user", "failing")]
    for e in log_events:
        events_rows.append((str(e["seq"]), e["time"], e["action"], str(e["version"]), str(e.get("previous") or "-"),
                            str(e.get("user") or ""), ",".join(e.get("failing") or []) or "-"))  # fmt: skip
    periods_rows = [("version", "in production from", "until", "by")]
    periods_rows += [(f"v{p['version']}", p["from"], p["until"] or "now", f"{p['action']} ({p['user']})")
                     for p in production_periods(log_events)]  # fmt: skip
    return _table(events_rows) + "\n\n" + _table(periods_rows)


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


# ----------------------------------------------------------------------------------------------------------------
# rollback


def rollback(cfg: ForgeConfig, name: str | None = None) -> dict[str, Any]:
    """Move @production back to the version that was in production before the current one and passed the gate."""
    name = name or cfg.registry.model_name
    client = client_for(cfg)
    prod, prod_v, stack, audited = _audited_production(cfg, client, name, "nothing to roll back")
    if not stack or stack[-1] != prod_v:
        raise ForgeError(
            f"@{ALIAS} of {name} is v{prod_v} but the audit log's is {audited}: the alias was moved outside "
            "`forge promote`; promote the intended version again with `forge promote`"
        )
    for version in reversed(stack[:-1]):
        if version == prod_v:
            continue
        try:
            mv = client.get_model_version(name, version)
        except Exception:  # noqa: BLE001 - deleted since: try the one before
            continue
        if mv.tags.get("forge.gate.decision") != "pass":
            continue
        now, user = utc_now(), getpass.getuser()
        client.set_registered_model_alias(name, ALIAS, version)
        client.set_model_version_tag(name, version, "forge.production.since", now)
        client.set_model_version_tag(name, prod_v, "forge.production.rolled_back", now)
        _append_event(cfg, client, name, {"action": "rollback", "version": version, "previous": prod_v}, now,
                      user)  # fmt: skip
        log.info("rollback: %s @%s v%s -> v%s", name, ALIAS, prod_v, version)
        return {"name": name, "version": version, "previous": prod_v}
    raise ForgeError(f"{name}: no earlier version passed the gate before v{prod_v}; nothing to roll back to")


def rollback_run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    return rollback(cfg, cfg.registry.model_name)


# ----------------------------------------------------------------------------------------------------------------
# serving


def resolve_production(cfg: ForgeConfig, name: str | None = None) -> Path:
    """Local directory of `models:/NAME@production` (model/, gguf/, tokenizer/, reports/): the only model Forge
    serves by default. Refuses an alias that `forge promote`/`forge rollback` did not set and files whose sha256
    differs from what the version recorded at registration."""
    name = name or cfg.registry.model_name
    client = client_for(cfg)
    prod, prod_v, stack, audited = _audited_production(
        cfg, client, name, f"promote one with `forge promote {name} VERSION`"
    )
    if prod.tags.get("forge.gate.decision") != "pass" or not stack or stack[-1] != prod_v:
        raise ForgeError(
            f"refusing to serve {name}@{ALIAS} (v{prod_v}): it was not put there by a passing `forge promote` "
            f"(decision tag {prod.tags.get('forge.gate.decision')!r}, audit log says {audited}); promote a version "
            "through the gate"
        )
    dest = runs_root() / ".registry" / name / f"v{prod_v}"
    if not (dest / ".verified").is_file():
        with tempfile.TemporaryDirectory(prefix=".resolve-", dir=_scratch()) as scratch:
            local = download_version(cfg, client, name, prod_v, Path(scratch))
            _verify_files(prod, local)
            (local / ".verified").write_text(prod_v + "\n", encoding="utf-8")
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(local, dest)
    return dest


def _verify_files(mv, root: Path) -> None:
    """The downloaded model/ and every GGUF the version recorded must have the sha256 registration tagged."""
    names = ["model"] + [f"gguf/model-{key.removeprefix('forge.sha256.gguf.')}.gguf" for key in mv.tags
                         if key.startswith("forge.sha256.gguf.")]  # fmt: skip
    bad = sha256_problems(root, {name: mv.tags.get(registry_tag(name)) for name in names})
    if bad:
        raise ForgeError(f"refusing to serve v{mv.version}: files changed since registration ({', '.join(bad)})")


def _millis() -> int:
    import time

    return int(time.time() * 1000)
