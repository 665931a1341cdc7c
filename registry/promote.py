"""`forge promote`: judge a registered version by the gate policy; move @production only when every check passes.

    forge promote forge-model 3 --config configs/tiny-cpu.yaml   # prints the decision table; exit 1 if refused

The gate judges only evidence downloaded from the registry (never local files): the version's reports, lineage and
files, hashed here and handed to registry/gate.py with the current @production's eval report for the regression
checks. Every decision, pass or refuse, is tagged on the version (forge.gate.decision, and one forge.gate.check.*
tag per row of the table; with the gate key, a signed record of the files judged: registry/signature.py) and
appended to the audit log (registry/audit.py). A failure of MLflow itself (server down, a registry error) is no
decision: it is reported as RegistryUnavailable, with the tracking URI, never as a refusal.
"""

from __future__ import annotations

import getpass
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.config import ForgeConfig
from forge.hashing import sha256_file, sha256_tree
from forge.io import atomic_write_json, read_json_object, utc_now
from forge.lineage import require_reads
from forge.paths import run_dir
from forge.pipeline import GateRefused
from forge.tracking import client_for
from registry import gate, gate_table
from registry.audit import append_event, events, production_stack
from registry.signature import signature_tags, version_files
from registry.store import (
    ALIAS,
    MAX_TAG,
    download_version,
    get_version,
    mlflow_errors,
    production,
    scratch,
    try_download,
)


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
        return gate_table.format_table(self.checks, title)

    def as_dict(self) -> dict[str, Any]:
        """For decision.json and the report card: every check with its interval and sample size."""
        return {"name": self.name, "version": self.version, "passed": self.passed, "previous": self.previous,
                "policy_sha256": self.policy_sha256,
                "checks": [asdict(c) | {"result": c.result} for c in self.checks]}  # fmt: skip


def read_evidence(root: Path, tags: dict[str, Any]) -> gate.Evidence:
    """The reports, the lineage and the sha256 of the artifacts of a downloaded version directory; `tags`, the
    version's, hold the sha256 registration recorded for each report and for lineage.json."""
    model = root / "model"
    recorded = {f"reports/{k.removeprefix('forge.sha256.report.')}": v for k, v in tags.items()
                if k.startswith("forge.sha256.report.")}  # fmt: skip
    recorded["lineage.json"] = tags.get("forge.sha256.lineage")
    files = {name: ((sha256_file(root / name) if (root / name).is_file() else None), digest)
             for name, digest in recorded.items()}  # fmt: skip
    return gate.Evidence(
        eval_report=read_json_object(root / "reports" / "eval.json"),
        quantize_report=read_json_object(root / "reports" / "quantize.json"),
        quantize_manifest=read_json_object(root / "reports" / "quantize-manifest.json"),
        model_sha256=sha256_tree(model) if (model / "config.json").is_file() else None,
        gguf_sha256={p.name: sha256_file(p) for p in sorted((root / "gguf").glob("*.gguf"))},
        lineage=read_json_object(root / "lineage.json"),
        base_eval=read_json_object(root / "reports" / "eval-base.json"),
        evidence_sha256=files,
    )


def promote(cfg: ForgeConfig, name: str | None = None, version: str | int | None = None) -> Decision:
    """Judge `models:/NAME/VERSION` (default: the newest version) by the gate policy; move @production if it passes.

    The decision, pass or fail, is tagged on the version and appended to the audit log. Returns the Decision; the
    caller decides how to fail (the CLI exits 1, the pipeline raises GateRefused). RegistryUnavailable (no decision)
    when MLflow fails.
    """
    name = name or cfg.registry.model_name
    policy = gate.load_policy(cfg.registry.gate_policy)
    client = client_for(cfg)
    with mlflow_errors(client.tracking_uri, f"reading {name} version {version or '(the newest)'} and its evidence"):
        mv = get_version(client, name, version)
        prod = production(client, name)
        # The regression baseline is what the audit log put in production, not whatever the alias says now: an alias
        # moved by hand to a weak version must not make a weak candidate look fine.
        stack = production_stack(events(cfg, name))
        evidence, files = _download_evidence(cfg, client, name, mv, stack[-1] if stack else None)
    version_s, prod_v = str(mv.version), str(prod.version) if prod else None  # int in the sqlite store
    checks = gate.evaluate(policy, evidence)
    decision = Decision(name, version_s, gate.passed(checks), checks, policy.sha256, prod_v)
    signed = signature_tags(name, version_s, decision.passed, policy.sha256, files)  # registry/signature.py
    doing = f"recording the gate's decision on {name} v{version_s} (it may be recorded only in part)"
    with mlflow_errors(client.tracking_uri, doing):
        _record(cfg, client, decision, signed)
    return decision


def _download_evidence(
    cfg: ForgeConfig, client, name: str, mv, baseline: str | None
) -> tuple[gate.Evidence, dict[str, str]]:
    """The candidate's evidence, with the eval report of the audited @production version to regress against, and
    the sha256 of every file of the version (what a signed decision covers)."""
    version_s = str(mv.version)
    with tempfile.TemporaryDirectory(prefix=".gate-", dir=scratch()) as tmp:
        root = download_version(cfg, client, name, version_s, Path(tmp) / "candidate")
        evidence = read_evidence(root, mv.tags)
        files = version_files(root, evidence)
        if baseline is not None:
            evidence.production_version = baseline
            if baseline == version_s:
                evidence.production_eval = evidence.eval_report
            else:
                got = try_download(cfg, client, name, baseline, "reports/eval.json", Path(tmp) / "production")
                evidence.production_eval = read_json_object(got) if got else None
    return evidence, files


def promote_run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    """The pipeline's promote step: gate the version this run registered; raise GateRefused if it fails."""
    register_dir = require_reads(cfg, "promote", ["register"])["register"]
    version = (read_json_object(register_dir / "version.json") or {}).get("version")
    if version is None:
        raise ForgeError(f"no {register_dir}/version.json: re-run `forge register --force`")
    # For the run's report card: the decision this run got, pass or refuse (the audit log keeps all of them). An
    # earlier attempt's is removed first, so that an MLflow failure is not shown beside an old refusal.
    decision_file = run_dir(cfg) / "promote" / "decision.json"
    decision_file.unlink(missing_ok=True)
    decision = promote(cfg, cfg.registry.model_name, version)
    print(decision.table())
    atomic_write_json(decision_file, decision.as_dict())
    if not decision.passed:
        raise GateRefused(
            f"{decision.name} v{decision.version} refused by the gate: {', '.join(gate.failing(decision.checks))}"
        )
    return {"name": decision.name, "version": decision.version, "decision": "pass"}


def _record(cfg: ForgeConfig, client, d: Decision, signed: dict[str, str]) -> None:
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
    tags |= {gate_table.tag_key(c): gate_table.tag_value(c)[:MAX_TAG] for c in d.checks}
    tags |= {gate_table.advice_tag_key(c): c.advice[:MAX_TAG] for c in d.checks if c.advice}
    tags |= signed
    for key, value in tags.items():
        client.set_model_version_tag(d.name, d.version, key, value)
    event = {"action": "promote" if d.passed else "refuse", "version": d.version, "previous": d.previous,
             "policy_sha256": d.policy_sha256, "failing": failing}  # fmt: skip
    if d.passed:
        client.set_registered_model_alias(d.name, ALIAS, d.version)
        client.set_model_version_tag(d.name, d.version, "forge.production.since", now)
    append_event(cfg, client, d.name, event, now, user)
