"""The promotion gate: a YAML policy judged against the evidence stored with one registered model version.

Pure logic (no MLflow, no files but the policy): registry/promote.py downloads a version's artifacts, hashes them
and hands the reports here. Every check returns pass/fail with the measured value, its interval and sample size
where it has one, the limit and one line of detail; missing evidence is a failure, never a pass. The table and
the MLflow tags that show a decision are registry/gate_table.py's.

    policy = load_policy("configs/policies/gate.yaml")
    checks = evaluate(policy, Evidence(eval_report=..., quantize_report=..., quantize_manifest=...,
                                       model_sha256=..., gguf_sha256={"model-q4_k_m.gguf": ...}, lineage=...))
    print(gate_table.format_table(checks))

Policy file (format "forge-gate/2"; see configs/policies/gate.yaml):
  confidence    the level of every interval (two-sided; 0.95)
  quality       rules about the domain, each a comparison with uncertainty (registry/stats.py):
                  above_chance   accuracies whose Wilson lower bound must be above chance (1 / choices)
                  beats_floors   random_init, unigram: the candidate's bits per byte must be below each floor's, at
                                 the upper bound of a paired bootstrap over the test items
                  beats_base     for a fine-tune: per-pair metrics (qa_f1) whose paired-bootstrap lower bound over
                                 the held-out pairs, fine-tune minus the model it was fine-tuned from, is above 0
                  beats_init_from  for a run continued from a base (model.init_from): bits_per_byte of the continued
                                 model below the base's own on the same test items (paired bootstrap), read from
                                 the eval of the continued model (a fine-tune's stored base eval)
  metrics       {metric: {min, max}}: plain thresholds on eval.json metrics (none shipped)
  red_flags     required (names that must be present), allow_not_run (flags whose passed=null is accepted);
                every other flag must have passed: true
  quantization  required GGUF types, max_ppl_drift_vs_f16 and max_ppl_drift (vs the HF model) per type
  regression    {metric: {tolerance}}: against the current @production, paired over the items both were scored on;
                fails when the candidate is worse by more than the tolerance at the interval's better end. When the
                two were measured on different test text or Q&A sets the comparison is void (shown, not failed).
Always on: the eval report, every metric and flag in it, and the quantization report name the sha256 of exactly the
artifacts stored with the version; the eval reports measured the run's own test text and Q&A set (lineage.json).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from evaluation.report import FORMAT as EVAL_FORMAT
from forge.policy import FLOORS, FORMAT, ITEM_FIELDS, MetricRule, Policy, load_policy  # noqa: F401 - its file
from registry.advice import advice
from registry.stats import Interval, paired_bootstrap, wilson_interval

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
    lineage: dict[str, Any] | None = None  # the version's lineage.json (registry/register.py)
    base_eval: dict[str, Any] | None = None  # a fine-tune's: the eval.json of the model it was fine-tuned from
    # stored file (reports/*, lineage.json) -> (its sha256 now, the sha256 registration recorded in the version's tags)
    evidence_sha256: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    production_eval: dict[str, Any] | None = None  # the current @production version's eval.json
    production_version: str | None = None


@dataclass
class Check:
    name: str
    passed: bool
    value: Any = None
    limit: Any = None
    detail: str = ""
    interval: list[float] | None = None  # [low, high] at the policy's confidence, where the rule has one
    n: int | None = None  # the items (documents, pairs) behind the value
    void: bool = False  # a comparison that could not be made honestly (shown, not failed)
    advice: str = ""  # for a failing quality rule: lacked evidence (which setting) or fell short (the lever)

    @property
    def result(self) -> str:
        return "void" if self.void else "pass" if self.passed else "FAIL"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _metrics(report: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    rows = (report or {}).get("metrics")
    if not isinstance(rows, list):
        return {}
    return {m["name"]: m for m in rows if isinstance(m, dict) and isinstance(m.get("name"), str)}


def evaluate(policy: Policy, ev: Evidence) -> list[Check]:
    """Every check of the policy plus the integrity checks; a version passes only when all pass."""
    checks = _integrity(policy, ev)
    if ev.eval_report is not None:
        checks += _data_checks(ev)
        checks += _quality_checks(policy, ev)
        checks += _metric_checks(policy, ev.eval_report)
        checks += _flag_checks(policy, ev.eval_report)
        checks += _regression_checks(policy, ev)
    checks += _quant_checks(policy, ev)
    config = (ev.lineage or {}).get("config") or {}
    sft = ((((ev.lineage or {}).get("stages") or {}).get("sft") or {}).get("metrics")) or {}
    for c in checks:
        c.advice = advice(c.name, c.passed, c.detail, _num(c.value), c.interval, config, sft)
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
    changed = sorted(name for name, (now, then) in ev.evidence_sha256.items() if now is None or now != then)
    out.append(Check("hash:evidence_files", not changed, len(changed), 0,
                     "every report and lineage.json is what registration recorded" if not changed else
                     f"changed or missing since registration: {', '.join(changed)}"))  # fmt: skip
    if ev.model_sha256 is None:
        out.append(Check("hash:model", False, None, "present", "no HF model directory stored with this version"))
    else:
        claimed = _dict(report.get("artifact")).get("sha256")
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
        out.append(Check(f"metric:{name}", not problems, value, _limit(rule), "; ".join(problems) or "within limits"))
    return out


def _limit(rule: MetricRule) -> str:
    parts = [f">= {rule.min:g}"] if rule.min is not None else []
    parts += [f"<= {rule.max:g}"] if rule.max is not None else []
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
            out.append(Check(f"red_flag:{name}", True, brief(f.get("value")), brief(f.get("threshold")), "passed"))
        elif state is None and name in policy.red_flags.allow_not_run and name not in policy.red_flags.required:
            out.append(Check(f"red_flag:{name}", True, None, "pass or not run", f"not run: {f.get('evidence', '')}"))
        else:
            why = "did not run" if state is None else "FAILED"
            out.append(Check(f"red_flag:{name}", False, brief(f.get("value")), brief(f.get("threshold")),
                             f"{why}: {f.get('evidence', '')}"))  # fmt: skip
    return out


# ----------------------------------------------------------------------------------------------------------------
# the evidence is about the version's own data


def _data_checks(ev: Evidence) -> list[Check]:
    """The eval report measured the run's own test text and held-out Q&A set: the sha256 lineage.json recorded from
    the run's data and qa stages. A model evaluated on another run's test split, or on another domain's Q&A, is
    refused here, whatever its numbers."""
    recorded = (ev.lineage or {}).get("evidence")
    if not isinstance(recorded, dict):
        return [Check("evidence:lineage", False, None, "present", "no lineage.json with evidence hashes stored")]
    reports = [("", ev.eval_report)]
    if _is_finetune(ev) and ev.base_eval is not None:
        reports.append(("base_", ev.base_eval))
    out = []
    for prefix, report in reports:
        data = (report or {}).get("data") or {}
        for key, what in (("test_text_sha256", "test text"), ("qa_sha256", "held-out Q&A set")):
            claimed, own = data.get(key), recorded.get(key)
            ok = claimed is not None and claimed == own
            label = "the base model's eval" if prefix else "eval.json"
            detail = (f"{label} measured the run's own {what}" if ok else
                      f"{label} measured another {what} (sha256 {_short(claimed)}) than this run's "
                      f"(sha256 {_short(own)}): evaluate the model on its own run's data")  # fmt: skip
            out.append(Check(f"evidence:{prefix}{key.removesuffix('_sha256')}", ok, _short(claimed), _short(own),
                             detail))  # fmt: skip
    return out


def _is_finetune(ev: Evidence) -> bool:
    return (ev.lineage or {}).get("target") == "sft"


# ----------------------------------------------------------------------------------------------------------------
# quality and regression: comparisons with uncertainty


def _items(report: dict[str, Any] | None, task: str) -> dict[str, Any]:
    items = ((report or {}).get("items") or {}).get(task)
    return items if isinstance(items, dict) else {}


class ItemsMissing(Exception):
    """An eval report without the per-item scores a rule needs; the message says which and what to do."""


def _scores(report: dict[str, Any] | None, metric: str, key: str | None = None) -> dict[str, tuple[float, float]]:
    """Item id -> (score, weight) of a metric in an eval report: (bits, bytes) per test document for bits_per_byte
    (`key` picks a floor's bits instead), (score, 1) per item otherwise. ItemsMissing when the lists are absent or
    of different lengths: a silent truncation would pair the wrong items."""
    task, field_name = ITEM_FIELDS[metric]
    items = _items(report, task)
    ids, values = items.get("ids"), items.get(key or field_name)
    weights = items.get("bytes") if task == "text" else [1.0] * len(ids or [])
    if not ids or not isinstance(values, list) or not isinstance(weights, list):
        fmt = (report or {}).get("format")
        raise ItemsMissing(
            f"eval.json ({fmt}) has no per-item {key or field_name} of {task} items: re-run "
            "`forge eval` with this Forge (and eval.random_baseline on an HF model for its floor)"
        )
    if not len(ids) == len(values) == len(weights):
        raise ItemsMissing(
            f"eval.json's {task} items have {len(ids)} ids but {len(values)} scores: re-run `forge eval`"
        )
    return {i: (float(v), float(w)) for i, v, w in zip(ids, values, weights, strict=True) if _num(v) is not None}


def _better_by(
    mine: dict[str, tuple[float, float]], theirs: dict[str, tuple[float, float]], metric: str, policy: Policy
) -> Interval | None:
    """How much better the candidate is than another model over the items both were scored on (positive: better),
    as a paired-bootstrap interval; bits per byte are weighted by each document's bytes. None: no shared items."""
    shared = sorted(set(mine) & set(theirs))
    if not shared:
        return None
    a, b = [mine[i][0] for i in shared], [theirs[i][0] for i in shared]
    if metric == "bits_per_byte":  # lower is better
        a, b = b, a
    weights = [mine[i][1] for i in shared]
    return paired_bootstrap(a, b, policy.confidence, policy.bootstrap_resamples, weights=weights)


def _interval_check(name: str, iv: Interval | None, need: str, limit: float, detail: str, policy: Policy) -> Check:
    """need "better": the interval's lower end above `limit`; "not worse": its upper end at or above -limit. Fewer
    than policy.min_items shared items fail: an interval over a handful of items decides nothing."""
    if iv is None:
        return Check(name, False, None, None, "no items in common to compare")
    ok = iv.low > limit if need == "better" else iv.high >= -limit
    shown = f"low > {limit:g}" if need == "better" else f"high >= {-limit if limit else 0:g}"
    detail = f"{detail} (positive: the candidate is better)"
    if iv.n < policy.min_items:
        ok, detail = False, f"only {iv.n} items to compare, fewer than min_items ({policy.min_items}); {detail}"
    return Check(name, ok, iv.estimate, shown, detail, [iv.low, iv.high], iv.n)


def _quality_checks(policy: Policy, ev: Evidence) -> list[Check]:
    q = policy.quality
    out = [_above_chance(ev.eval_report, m, policy) for m in q.above_chance]
    for floor in q.beats_floors:
        detail = f"bits per byte below the {floor.replace('_', '-')} floor's"
        out.append(_below_in_report(f"quality:bits_per_byte<{floor}", ev.eval_report, floor, detail, policy))
    for metric in q.beats_base:
        out.append(_beats_base(ev, metric, policy))
    if q.beats_init_from:
        out.append(_beats_init_from(ev, policy))
    return out


def _below_in_report(name: str, report: dict[str, Any] | None, other: str, detail: str, policy: Policy) -> Check:
    """Per test document of one eval report: the model's bits against `bits_{other}` (a floor's, the reference
    model's), over the same bytes; the upper end of the paired difference must be below 0."""
    try:
        mine = _scores(report, "bits_per_byte")
        theirs = _scores(report, "bits_per_byte", f"bits_{other}")
    except ItemsMissing as exc:
        return Check(name, False, None, None, str(exc))
    iv = _better_by(mine, theirs, "bits_per_byte", policy)
    bpb = sum(b for b, _ in theirs.values()) / sum(n for _, n in theirs.values())
    return _interval_check(name, iv, "better", 0.0, f"{detail} ({bpb:.4g}) on the test items", policy)


def _beats_init_from(ev: Evidence, policy: Policy) -> Check:
    """A run continued from a base (model.init_from) must predict the domain's test text better than that base."""
    name = "quality:bits_per_byte<init_from"
    base = _dict((ev.lineage or {}).get("base"))
    if not base:
        return Check(name, True, None, None, "not continued from a base model (model.init_from unset)")
    # the continued model is the candidate itself, or for a fine-tune the base it was fine-tuned from
    report, which = (ev.base_eval, "the base model's eval") if _is_finetune(ev) else (ev.eval_report, "eval.json")
    measured = _dict(_dict(report).get("reference")).get("sha256")
    if measured is None or measured != base.get("sha256"):
        return Check(name, False, _short(measured), _short(base.get("sha256")), f"{which} was not measured against "
                     f"model.init_from's base ({base.get('path')}): re-run `forge eval --target pretrain` without "
                     "eval.reference, then `forge register`")  # fmt: skip
    return _below_in_report(name, report, "reference", f"bits per byte below its base {base.get('origin')}'s", policy)


def _beats_base(ev: Evidence, metric: str, policy: Policy) -> Check:
    """A fine-tune against the eval of the very model it was fine-tuned from (the sft stage's recorded base)."""
    name = f"quality:{metric}>base"
    if not _is_finetune(ev):
        return Check(name, True, None, None, "not a fine-tune: no base model to beat")
    if ev.base_eval is None:
        return Check(name, False, None, None, "no eval of the base model stored (reports/eval-base.json): run "
                     "`forge eval --target pretrain` before `forge register`")  # fmt: skip
    base = ((((ev.lineage or {}).get("stages") or {}).get("sft") or {}).get("inputs") or {}).get("base")
    evaluated = _dict(ev.base_eval.get("artifact")).get("sha256")
    if base is None or evaluated != base:
        return Check(name, False, _short(evaluated), _short(base), "the stored base eval measured another model "
                     "than the one the fine-tune started from (lineage.json, sft inputs): re-run `forge eval "
                     "--target pretrain`, then `forge register`")  # fmt: skip
    try:
        iv = _better_by(_scores(ev.eval_report, metric), _scores(ev.base_eval, metric), metric, policy)
    except ItemsMissing as exc:
        return Check(name, False, None, None, str(exc))
    detail = "fine-tune minus the model it was fine-tuned from, on the same held-out pairs"
    return _interval_check(name, iv, "better", 0.0, detail, policy)


def _above_chance(report: dict[str, Any] | None, metric: str, policy: Policy) -> Check:
    name = f"quality:{metric}>chance"
    items = _items(report, "mc")
    chance = _num(items.get("chance"))
    hits = [bool(v) for v in items.get(ITEM_FIELDS[metric][1]) or []]
    if not hits or chance is None:
        return Check(
            name,
            False,
            None,
            None,
            "no multiple-choice items in eval.json: the held-out Q&A needs at "
            "least eval.mc_choices distinct answers; see the qa stage's report, then re-run `forge eval`",
        )
    iv = wilson_interval(sum(hits), len(hits), policy.confidence)
    ok = iv.low > chance and iv.n >= policy.min_items
    detail = (f"{sum(hits)} of {len(hits)} right, {policy.confidence:.0%} Wilson interval; chance is 1 in "
              f"{round(1 / chance)}")  # fmt: skip
    if iv.n < policy.min_items:
        detail = f"only {iv.n} items, fewer than min_items ({policy.min_items}); {detail}"
    return Check(name, ok, iv.estimate, f"low > {chance:.4g}", detail, [iv.low, iv.high], iv.n)


def _regression_checks(policy: Policy, ev: Evidence) -> list[Check]:
    if not policy.regression:
        return []
    if ev.production_version is None:
        return [Check("regression", True, None, None, "no current @production: nothing to regress against")]
    prod = f"@production v{ev.production_version}"
    if ev.production_eval is None:
        return [Check("regression", False, None, None, f"{prod} has no eval.json to compare with")]
    mine_data, prod_data = (ev.eval_report or {}).get("data") or {}, ev.production_eval.get("data") or {}
    out = []
    for metric, rule in policy.regression.items():
        name = f"regression:{metric}"
        key, what = ("test_text_sha256", "test text") if metric == "bits_per_byte" else ("qa_sha256", "Q&A set")
        if mine_data.get(key) != prod_data.get(key):
            theirs, mine = _short(prod_data.get(key)), _short(mine_data.get(key))
            out.append(Check(name, True, None, None, f"void: {prod} was measured on another {what} (sha256 {theirs}, "
                             f"the candidate's {mine}): unlike numbers are not compared", void=True))  # fmt: skip
            continue
        try:
            production_scores = _scores(ev.production_eval, metric)
        except ItemsMissing as exc:  # an eval from before per-item scores: nothing to pair with
            out.append(Check(name, True, None, None, f"void: {prod}'s {exc}", void=True))
            continue
        try:
            iv = _better_by(_scores(ev.eval_report, metric), production_scores, metric, policy)
        except ItemsMissing as exc:
            out.append(Check(name, False, None, None, str(exc)))
            continue
        detail = f"candidate minus {prod}, tolerance {rule.tolerance:g}"
        out.append(_interval_check(name, iv, "not worse", rule.tolerance, detail, policy))
    return out


def _quant_checks(policy: Policy, ev: Evidence) -> list[Check]:
    q = policy.quantization
    needed = bool(q.required or q.max_ppl_drift or q.max_ppl_drift_vs_f16) or bool(ev.gguf_sha256)
    if not needed:
        return []
    if ev.quantize_report is None:
        return [Check("evidence:quantize_report", False, None, "present", "no quantize.json stored with this version")]
    artifacts = _dict(ev.quantize_report.get("artifacts"))
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


def brief(value: Any) -> str:
    """A value as one short cell of the table: 4 significant digits, a dict as "key value, ..."."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {brief(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
