"""The promotion gate: a YAML policy judged against the evidence stored with one registered model version.

Pure logic (no MLflow, no files but the policy): serve/registry.py downloads a version's artifacts, hashes them and
hands the reports here. Every check returns pass/fail with the measured value, the limit and one line of detail;
missing evidence is a failure, never a pass.

    policy = load_policy("configs/policies/gate.yaml")
    checks = evaluate(policy, Evidence(eval_report=..., quantize_report=..., quantize_manifest=...,
                                       model_sha256=..., gguf_sha256={"model-q4_k_m.gguf": ...}))
    print(format_table(checks))

Policy file (format "forge-gate/1"; see configs/policies/gate.yaml):
  metrics       {metric: {min, max, beat_random_init}}: thresholds on the candidate's eval.json metrics
  red_flags     required (names that must be present), allow_not_run (flags whose passed=null is accepted);
                every other flag must have passed: true
  quantization  required GGUF types, max_ppl_drift_vs_f16 and max_ppl_drift (vs the HF model) per type
  regression    {metric: {relative | absolute}}: how much worse than the current @production a metric may be
Integrity checks (always on): the eval report, every metric and flag in it, and the quantization report name the
sha256 of exactly the artifacts stored with the version.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from forge import ForgeError

FORMAT = "forge-gate/1"
EVAL_FORMAT = "forge-eval/1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MetricRule(_Strict):
    min: float | None = None
    max: float | None = None
    beat_random_init: bool = False  # the value must be better than the same metric of a random-init model


class RedFlagRule(_Strict):
    required: list[str] = []
    allow_not_run: list[str] = []


class QuantRule(_Strict):
    required: list[str] = []
    max_ppl_drift_vs_f16: dict[str, float] = {}
    max_ppl_drift: dict[str, float] = {}


class RegressionRule(_Strict):
    relative: float | None = Field(None, ge=0)  # worse by at most this fraction of production's value
    absolute: float | None = Field(None, ge=0)  # worse by at most this amount

    @model_validator(mode="after")
    def _one(self) -> RegressionRule:
        if (self.relative is None) == (self.absolute is None):
            raise ValueError("give exactly one of relative or absolute")
        return self


class Policy(_Strict):
    format: str = FORMAT
    metrics: dict[str, MetricRule] = {}
    red_flags: RedFlagRule = RedFlagRule()
    quantization: QuantRule = QuantRule()
    regression: dict[str, RegressionRule] = {}
    sha256: str = ""  # of the policy file's bytes, filled by load_policy

    @model_validator(mode="after")
    def _format(self) -> Policy:
        if self.format != FORMAT:
            raise ValueError(f"format={self.format!r}: this Forge reads {FORMAT!r}")
        return self


def load_policy(path: str | Path) -> Policy:
    """Read and validate a gate policy; ForgeError naming every problem."""
    path = Path(path)
    if not path.is_file():
        raise ForgeError(
            f"gate policy {path} not found; set registry.gate_policy (the repo ships configs/policies/gate.yaml)"
        )
    data = path.read_bytes()
    try:
        raw = yaml.safe_load(data) or {}
    except yaml.YAMLError as exc:
        raise ForgeError(f"gate policy {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ForgeError(f"gate policy {path} must be a mapping (format, metrics, red_flags, quantization, regression)")
    raw.pop("sha256", None)
    try:
        policy = Policy.model_validate(raw)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()
        ]
        raise ForgeError(f"invalid gate policy {path}: " + "; ".join(problems)) from None
    policy.sha256 = hashlib.sha256(data).hexdigest()
    return policy


# ----------------------------------------------------------------------------------------------------------------
# evidence and checks


@dataclass
class Evidence:
    """What is stored with one version, as read back from the registry (None: not there)."""

    eval_report: dict[str, Any] | None
    quantize_report: dict[str, Any] | None
    quantize_manifest: dict[str, Any] | None
    model_sha256: str | None  # sha256_tree of the version's HF model directory
    gguf_sha256: dict[str, str] = field(default_factory=dict)  # file name -> sha256 of the version's GGUF files
    production_eval: dict[str, Any] | None = None  # the current @production version's eval.json
    production_version: str | None = None


@dataclass
class Check:
    name: str
    passed: bool
    value: Any = None
    limit: Any = None
    detail: str = ""


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _metrics(report: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    rows = (report or {}).get("metrics")
    if not isinstance(rows, list):
        return {}
    return {m["name"]: m for m in rows if isinstance(m, dict) and isinstance(m.get("name"), str)}


def evaluate(policy: Policy, ev: Evidence) -> list[Check]:
    """Every check of the policy plus the integrity checks; a version passes only when all pass."""
    checks = _integrity(policy, ev)
    if ev.eval_report is not None:
        checks += _metric_checks(policy, ev.eval_report)
        checks += _flag_checks(policy, ev.eval_report)
        checks += _regression_checks(policy, ev)
    checks += _quant_checks(policy, ev)
    return checks


def passed(checks: list[Check]) -> bool:
    return bool(checks) and all(c.passed for c in checks)


def failing(checks: list[Check]) -> list[str]:
    return [c.name for c in checks if not c.passed]


def _integrity(policy: Policy, ev: Evidence) -> list[Check]:
    out: list[Check] = []
    report = ev.eval_report
    if report is None:
        return [Check("evidence:eval_report", False, None, "present", "no eval.json stored with this version")]
    fmt = report.get("format")
    out.append(Check("evidence:eval_format", fmt == EVAL_FORMAT, fmt, EVAL_FORMAT, "eval.json format"))
    if ev.model_sha256 is None:
        out.append(Check("hash:model", False, None, "present", "no HF model directory stored with this version"))
    else:
        art = report.get("artifact") if isinstance(report.get("artifact"), dict) else {}
        claimed = art.get("sha256")
        ok = claimed == ev.model_sha256
        out.append(Check("hash:model", ok, _short(ev.model_sha256), _short(claimed),
                         "the stored model is the one eval.json evaluated" if ok else
                         "eval.json evaluated a different model than the one stored with this version"))  # fmt: skip
        stray = sorted({str(e.get("name")) for e in _entries(report) if e.get("artifact_sha256") != ev.model_sha256})
        out.append(Check("hash:eval_entries", not stray and bool(_entries(report)), len(stray), 0,
                         "every metric and red flag names the stored model's sha256" if not stray else
                         f"entries of another artifact (or without a hash): {', '.join(stray[:8])}"))  # fmt: skip
    return out


def _entries(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [*(report.get("metrics") or []), *(report.get("flags") or [])]
    return [r for r in rows if isinstance(r, dict)]


def _metric_checks(policy: Policy, report: dict[str, Any]) -> list[Check]:
    metrics = _metrics(report)
    out = []
    for name, rule in policy.metrics.items():
        entry = metrics.get(name)
        value = _num((entry or {}).get("value"))
        if value is None:
            out.append(Check(f"metric:{name}", False, None, _limit(rule), "missing from eval.json (or not a number)"))
            continue
        problems = []
        if rule.min is not None and value < rule.min:
            problems.append(f"below min {rule.min:g}")
        if rule.max is not None and value > rule.max:
            problems.append(f"above max {rule.max:g}")
        if rule.beat_random_init:
            base, higher = _num(entry.get("random_init")), entry.get("higher_is_better")
            if base is None or higher is None:
                problems.append("no random-init value or direction to compare with")
            elif (value <= base) if higher else (value >= base):
                problems.append(f"does not beat random init ({base:.4g})")
        out.append(Check(f"metric:{name}", not problems, value, _limit(rule), "; ".join(problems) or "within limits"))
    return out


def _limit(rule: MetricRule) -> str:
    parts = [f">= {rule.min:g}"] if rule.min is not None else []
    parts += [f"<= {rule.max:g}"] if rule.max is not None else []
    parts += ["beats random init"] if rule.beat_random_init else []
    return ", ".join(parts)


def _flag_checks(policy: Policy, report: dict[str, Any]) -> list[Check]:
    flags = [f for f in report.get("flags") or [] if isinstance(f, dict)]
    if not isinstance(report.get("flags"), list):
        return [Check("red_flags", False, None, "present", "eval.json has no red flag list")]
    out = []
    by_name = {str(f.get("name")): f for f in flags}
    for name in policy.red_flags.required:
        if name not in by_name:
            out.append(Check(f"red_flag:{name}", False, None, "pass", "required red flag missing from eval.json"))
    for name, f in by_name.items():
        state = f.get("passed")
        if state is True:
            out.append(Check(f"red_flag:{name}", True, _brief(f.get("value")), _brief(f.get("threshold")), "passed"))
        elif state is None and name in policy.red_flags.allow_not_run and name not in policy.red_flags.required:
            out.append(Check(f"red_flag:{name}", True, None, "pass or not run", f"not run: {f.get('evidence', '')}"))
        else:
            why = "did not run" if state is None else "FAILED"
            out.append(Check(f"red_flag:{name}", False, _brief(f.get("value")), _brief(f.get("threshold")),
                             f"{why}: {f.get('evidence', '')}"))  # fmt: skip
    return out


def _regression_checks(policy: Policy, ev: Evidence) -> list[Check]:
    if not policy.regression:
        return []
    if ev.production_version is None:
        return [Check("regression", True, None, None, "no current @production: nothing to regress against")]
    if ev.production_eval is None:
        return [Check("regression", False, None, None,
                      f"@production v{ev.production_version} has no eval.json to compare with")]  # fmt: skip
    cand, prod = _metrics(ev.eval_report), _metrics(ev.production_eval)
    out = []
    for name, rule in policy.regression.items():
        c, p = _num((cand.get(name) or {}).get("value")), _num((prod.get(name) or {}).get("value"))
        higher = (cand.get(name) or {}).get("higher_is_better")
        label = f"regression:{name}"
        if c is None or p is None or higher is None:
            out.append(Check(label, False, c, p, f"cannot compare with @production v{ev.production_version}: "
                             "metric or its direction missing"))  # fmt: skip
            continue
        slack = rule.absolute if rule.absolute is not None else abs(p) * (rule.relative or 0.0)
        bound = p - slack if higher else p + slack
        ok = c >= bound if higher else c <= bound
        how = f"{rule.relative:.0%} relative" if rule.relative is not None else f"{rule.absolute:g} absolute"
        out.append(Check(label, ok, c, f"{'>=' if higher else '<='} {bound:.4g}",
                         f"@production v{ev.production_version}: {p:.4g}; tolerance {how}"))  # fmt: skip
    return out


def _quant_checks(policy: Policy, ev: Evidence) -> list[Check]:
    q = policy.quantization
    needed = bool(q.required or q.max_ppl_drift or q.max_ppl_drift_vs_f16) or bool(ev.gguf_sha256)
    if not needed:
        return []
    if ev.quantize_report is None:
        return [Check("evidence:quantize_report", False, None, "present", "no quantize.json stored with this version")]
    artifacts = ev.quantize_report.get("artifacts") if isinstance(ev.quantize_report.get("artifacts"), dict) else {}
    recorded = (ev.quantize_manifest or {}).get("outputs") or {}
    out = []
    model_in = ((ev.quantize_manifest or {}).get("inputs") or {}).get("model")
    ok = model_in is not None and model_in == ev.model_sha256
    out.append(Check("hash:quantized_model", ok, _short(model_in), _short(ev.model_sha256),
                     "the GGUFs were quantized from the stored model" if ok else
                     "the quantize stage read a different model (or its manifest is missing)"))  # fmt: skip
    by_file = {
        str(a.get("path")): (t, a) for t, a in artifacts.items() if isinstance(a, dict) and a.get("kind") == "gguf"
    }
    for file, actual in sorted(ev.gguf_sha256.items()):
        type_name, entry = by_file.get(file, (None, None))
        expected = (entry or {}).get("sha256") or recorded.get(file)
        ok = entry is not None and expected == actual
        detail = ("matches the quantization report" if ok else
                  "not in quantize.json: an unevaluated artifact" if entry is None else
                  "no sha256 recorded for it" if expected is None else "changed after it was measured")  # fmt: skip
        out.append(Check(f"hash:{file}", ok, _short(actual), _short(expected), detail))
    for type_name in q.required:
        entry = artifacts.get(type_name)
        if not isinstance(entry, dict) or str(entry.get("path")) not in ev.gguf_sha256:
            out.append(Check(f"quant:{type_name}", False, None, "present", "required GGUF type not stored/measured"))
    for key, limits in (("ppl_drift_vs_f16", q.max_ppl_drift_vs_f16), ("ppl_drift", q.max_ppl_drift)):
        for type_name, limit in limits.items():
            value = _num((artifacts.get(type_name) or {}).get(key))
            ok = value is not None and value <= limit
            detail = f"{key} of {type_name}" if value is not None else f"{key} of {type_name} missing in quantize.json"
            out.append(Check(f"quant:{type_name}:{key}", ok, value, f"<= {limit:g}", detail))
    return out


def _short(sha: Any) -> Any:
    return sha[:12] if isinstance(sha, str) else sha


def _brief(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_brief(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def format_table(checks: list[Check], title: str = "") -> str:
    """The decision as a plain-text table: check, result, value, limit, detail."""
    rows = [("check", "result", "value", "limit", "detail")]
    rows += [(c.name, "pass" if c.passed else "FAIL", _brief(c.value), _brief(c.limit), c.detail) for c in checks]
    widths = [min(max(len(r[i]) for r in rows), 48) for i in range(4)]
    lines = [title] if title else []
    for i, row in enumerate(rows):
        lines.append("  ".join(cell[:48].ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    verdict = "PASS" if passed(checks) else f"FAIL ({len(failing(checks))} failing: {', '.join(failing(checks))})"
    lines.append(f"decision: {verdict}")
    return "\n".join(lines)
