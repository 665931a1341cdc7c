"""The gate policy as pure logic: the shipped policy loads, every check refuses missing evidence, and the table names
what failed. Candidates' reports are built in the eval and quantize stages' schema (see test_registry.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from test_registry import GGUF_TYPES, REPO, eval_report, quantize_report

from evaluation import gate
from forge import ForgeError

MODEL_SHA = "a" * 64


def evidence(**overrides) -> gate.Evidence:
    gguf = {f"model-{t}.gguf": f"{t}-sha" for t in GGUF_TYPES}
    manifest = {"inputs": {"model": MODEL_SHA}, "outputs": dict(gguf)}
    ev = gate.Evidence(
        eval_report=eval_report(MODEL_SHA), quantize_report=quantize_report(Path("m")), quantize_manifest=manifest,
        model_sha256=MODEL_SHA, gguf_sha256=gguf,
    )  # fmt: skip
    for key, value in overrides.items():
        setattr(ev, key, value)
    return ev


@pytest.fixture(scope="module")
def policy() -> gate.Policy:
    return gate.load_policy(REPO / "configs" / "policies" / "gate.yaml")


def failing(policy: gate.Policy, ev: gate.Evidence) -> list[str]:
    return gate.failing(gate.evaluate(policy, ev))


def test_shipped_policy_loads_and_a_clean_candidate_passes(policy):
    assert len(policy.sha256) == 64 and set(policy.quantization.required) == set(GGUF_TYPES)
    checks = gate.evaluate(policy, evidence())
    assert gate.passed(checks), gate.format_table(checks)
    names = {c.name for c in checks}
    expected = {"hash:model", "hash:model-q4_k_m.gguf", "red_flag:repetition", "metric:bits_per_byte", "regression"}
    assert expected <= names


def test_bad_policy_is_refused_with_the_field(tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text("format: forge-gate/1\nmetrics: {perplexity: {maxx: 3}}\nregression: {qa_f1: {}}\n")
    with pytest.raises(ForgeError) as err:
        gate.load_policy(path)
    assert "metrics.perplexity.maxx" in str(err.value) and "exactly one of relative or absolute" in str(err.value)
    with pytest.raises(ForgeError, match="not found"):
        gate.load_policy(tmp_path / "missing.yaml")


def test_missing_evidence_is_a_failure_never_a_pass(policy):
    assert failing(policy, evidence(eval_report=None)) == ["evidence:eval_report"]
    assert failing(policy, evidence(quantize_report=None)) == ["evidence:quantize_report"]
    assert "hash:model" in failing(policy, evidence(model_sha256=None))
    no_metric = eval_report(MODEL_SHA)
    no_metric["metrics"] = [m for m in no_metric["metrics"] if m["name"] != "mc_acc"]
    assert failing(policy, evidence(eval_report=no_metric)) == ["metric:mc_acc"]
    no_flag = eval_report(MODEL_SHA)
    no_flag["flags"] = [f for f in no_flag["flags"] if f["name"] != "untrained"]
    assert failing(policy, evidence(eval_report=no_flag)) == ["red_flag:untrained"]
    not_run = eval_report(MODEL_SHA)
    next(f for f in not_run["flags"] if f["name"] == "memorisation")["passed"] = None
    assert failing(policy, evidence(eval_report=not_run)) == ["red_flag:memorisation"]  # required: must have run
    q = quantize_report(Path("m"))
    del q["artifacts"]["q8_0"]["ppl_drift_vs_f16"]
    assert failing(policy, evidence(quantize_report=q)) == ["quant:q8_0:ppl_drift_vs_f16"]
    assert "quant:q4_k_m" in failing(policy, evidence(gguf_sha256={"model-f16.gguf": "f16-sha",
                                                                   "model-q8_0.gguf": "q8_0-sha"}))  # fmt: skip


def test_evidence_must_name_the_stored_artifacts(policy):
    assert failing(policy, evidence(model_sha256="b" * 64))[:2] == ["hash:model", "hash:eval_entries"]
    mixed = eval_report(MODEL_SHA)
    mixed["flags"][0]["artifact_sha256"] = "c" * 64  # one flag measured on another model
    assert failing(policy, evidence(eval_report=mixed)) == ["hash:eval_entries"]
    changed = {**evidence().gguf_sha256, "model-q8_0.gguf": "other"}
    assert failing(policy, evidence(gguf_sha256=changed)) == ["hash:model-q8_0.gguf"]
    extra = {**evidence().gguf_sha256, "model-q2_k.gguf": "x"}
    assert failing(policy, evidence(gguf_sha256=extra)) == ["hash:model-q2_k.gguf"]  # never measured
    other_input = {"inputs": {"model": "d" * 64}, "outputs": evidence().quantize_manifest["outputs"]}
    assert failing(policy, evidence(quantize_manifest=other_input)) == ["hash:quantized_model"]


def test_thresholds_and_drift_bounds(policy):
    above_random = eval_report(MODEL_SHA, ppl=70.0)  # the random-init twin scores 64
    assert failing(policy, evidence(eval_report=above_random)) == ["metric:bits_per_byte"]
    assert failing(policy, evidence(quantize_report=quantize_report(Path("m"), drift_q4=0.06))) == [
        "quant:q4_k_m:ppl_drift_vs_f16"
    ]
    flagged = gate.evaluate(policy, evidence(eval_report=eval_report(MODEL_SHA, failing_flag="incoherence")))
    table = gate.format_table(flagged)
    row = next(line for line in table.splitlines() if line.startswith("red_flag:incoherence"))
    assert "FAIL" in row and "incoherence evidence" in row
    assert table.endswith("decision: FAIL (1 failing: red_flag:incoherence)")


def test_regression_against_production_within_tolerance_only(policy):
    prod = eval_report(MODEL_SHA, ppl=20.0)
    for ppl, ok in ((20.9, True), (21.1, False), (15.0, True)):  # 5% relative on bits per byte (lower is better)
        ev = evidence(eval_report=eval_report(MODEL_SHA, ppl=ppl), production_eval=prod, production_version="1")
        assert (failing(policy, ev) == []) is ok, (ppl, failing(policy, ev))
    worse_mc = eval_report(MODEL_SHA, mc_acc=0.44)  # 0.06 below production's 0.5 (tolerance 0.05 absolute)
    assert "regression:mc_acc" in failing(policy, evidence(eval_report=worse_mc, production_eval=prod,
                                                           production_version="1"))  # fmt: skip
    assert failing(policy, evidence(production_eval=None, production_version="1")) == ["regression"]
    no_direction = copy.deepcopy(prod)
    next(m for m in no_direction["metrics"] if m["name"] == "bits_per_byte")["value"] = None
    assert "regression:bits_per_byte" in failing(policy, evidence(production_eval=no_direction, production_version="1"))
