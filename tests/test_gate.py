"""The gate policy as pure logic: the interval arithmetic against textbook values, the shipped policy loads, every
check refuses missing evidence, each quality rule decides by its interval, and the table names what failed with its
interval and sample size. Candidates' reports are built in the eval and quantize stages' schema (see
test_registry.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from test_registry import GGUF_TYPES, ITEMS, QA_SHA, REPO, TEST_TEXT_SHA, eval_report, quantize_report

from forge import ForgeError
from registry import gate, gate_table
from registry.stats import paired_bootstrap, wilson_interval

MODEL_SHA, BASE_SHA = "a" * 64, "b" * 64
LINEAGE = {"target": "pretrain", "evidence": {"test_text_sha256": TEST_TEXT_SHA, "qa_sha256": QA_SHA}}


def evidence(**overrides) -> gate.Evidence:
    gguf = {f"model-{t}.gguf": f"{t}-sha" for t in GGUF_TYPES}
    manifest = {"inputs": {"model": MODEL_SHA}, "outputs": dict(gguf)}
    ev = gate.Evidence(
        eval_report=eval_report(MODEL_SHA), quantize_report=quantize_report(Path("m")), quantize_manifest=manifest,
        model_sha256=MODEL_SHA, gguf_sha256=gguf, lineage=copy.deepcopy(LINEAGE),
    )  # fmt: skip
    for key, value in overrides.items():
        setattr(ev, key, value)
    return ev


def finetune(sft_f1: float, base_f1: float, **overrides) -> gate.Evidence:
    ev = evidence(eval_report=eval_report(MODEL_SHA, qa_f1=sft_f1), base_eval=eval_report(BASE_SHA, qa_f1=base_f1))
    ev.lineage |= {"target": "sft", "stages": {"sft": {"inputs": {"base": BASE_SHA}}}}
    for key, value in overrides.items():
        setattr(ev, key, value)
    return ev


@pytest.fixture(scope="module")
def policy() -> gate.Policy:
    return gate.load_policy(REPO / "configs" / "policies" / "gate.yaml")


def failing(policy: gate.Policy, ev: gate.Evidence) -> list[str]:
    return gate.failing(gate.evaluate(policy, ev))


def check(policy: gate.Policy, ev: gate.Evidence, name: str) -> gate.Check:
    return next(c for c in gate.evaluate(policy, ev) if c.name == name)


# ----------------------------------------------------------------------------------------------------------------
# the interval arithmetic


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3 (score)
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718),
     (29, 29, 0.8830, 1.0)],
)  # fmt: skip
def test_wilson_interval_matches_the_textbook(successes, n, low, high):
    iv = wilson_interval(successes, n, 0.95)
    assert (round(iv.low, 4), round(iv.high, 4)) == (low, high)
    assert iv.estimate == successes / n and iv.n == n
    wider = wilson_interval(successes, n, 0.99)
    assert wider.low <= iv.low and wider.high >= iv.high
    with pytest.raises(ValueError):
        wilson_interval(5, 4)


def test_paired_bootstrap_is_seeded_and_pairs_the_items():
    assert paired_bootstrap([3.0] * 5, [1.0] * 5) == paired_bootstrap([3.0] * 5, [1.0] * 5)
    constant = paired_bootstrap([3.0, 4.0, 5.0], [1.0, 2.0, 3.0])  # every pair differs by exactly 2
    assert (constant.estimate, constant.low, constant.high) == (2.0, 2.0, 2.0)
    # Large differences between items, a small consistent one between the models: paired, it is significant.
    a = [float(i) + 0.1 for i in range(100)]
    b = [float(i) for i in range(100)]
    assert paired_bootstrap(a, b).low > 0
    per_byte = paired_bootstrap([10.0, 30.0], [0.0, 0.0], weights=[10.0, 10.0])  # bits over bytes of each resample
    assert per_byte.estimate == 2.0 and per_byte.low == 1.0 and per_byte.high == 3.0
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0, 2.0])


# ----------------------------------------------------------------------------------------------------------------
# the policy


def test_shipped_policy_loads_and_a_clean_candidate_passes(policy):
    assert len(policy.sha256) == 64 and set(policy.quantization.required) == set(GGUF_TYPES)
    assert policy.quality.above_chance == ["mc_acc_pmi"] and policy.confidence == 0.95
    checks = gate.evaluate(policy, evidence())
    assert gate.passed(checks), gate_table.format_table(checks)
    names = {c.name for c in checks}
    expected = {"hash:model", "hash:model-q4_k_m.gguf", "red_flag:repetition", "quality:mc_acc_pmi>chance",
                "quality:bits_per_byte<random_init", "quality:bits_per_byte<unigram", "quality:qa_f1>base",
                "evidence:test_text", "evidence:qa", "regression"}  # fmt: skip
    assert expected <= names


def test_bad_policy_is_refused_with_the_field(tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text("format: forge-gate/2\nmetrics: {perplexity: {maxx: 3}}\nquality: {above_chance: [qa_f1]}\n"
                    "regression: {perplexity: {tolerance: 0}}\n")  # fmt: skip
    with pytest.raises(ForgeError) as err:
        gate.load_policy(path)
    message = str(err.value)
    assert "metrics.perplexity.maxx" in message and "quality: above_chance: unknown ['qa_f1'], use [" in message
    assert "regression: ['perplexity'] cannot be compared item by item" in message
    path.write_text("format: forge-gate/1\nmetrics: {mc_acc: {min: 0.0}}\n")
    with pytest.raises(ForgeError, match="this Forge reads 'forge-gate/2'"):
        gate.load_policy(path)
    with pytest.raises(ForgeError, match="not found"):
        gate.load_policy(tmp_path / "missing.yaml")


def test_missing_evidence_is_a_failure_never_a_pass(policy):
    assert failing(policy, evidence(eval_report=None)) == ["evidence:eval_report"]
    assert failing(policy, evidence(quantize_report=None)) == ["evidence:quantize_report"]
    assert failing(policy, evidence(lineage=None)) == ["evidence:lineage"]
    assert "hash:model" in failing(policy, evidence(model_sha256=None))
    no_items = eval_report(MODEL_SHA)
    del no_items["items"]
    assert failing(policy, evidence(eval_report=no_items)) == [
        "quality:mc_acc_pmi>chance", "quality:bits_per_byte<random_init", "quality:bits_per_byte<unigram"]  # fmt: skip
    no_twin = eval_report(MODEL_SHA)
    del no_twin["items"]["text"]["bits_random_init"]  # a GGUF target has no random-init twin
    assert failing(policy, evidence(eval_report=no_twin)) == ["quality:bits_per_byte<random_init"]
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


def test_evidence_must_be_about_the_versions_own_data(policy):
    other_split = eval_report(MODEL_SHA, data={"test_text_sha256": "e" * 64})  # another run's test split
    assert failing(policy, evidence(eval_report=other_split)) == ["evidence:test_text"]
    row = check(policy, evidence(eval_report=other_split), "evidence:test_text")
    assert "measured another test text (sha256 eeeeeeeeeeee) than this run's (sha256 666666666666)" in row.detail
    other_domain = eval_report(MODEL_SHA, data={"qa_sha256": "f" * 64})
    assert failing(policy, evidence(eval_report=other_domain)) == ["evidence:qa"]
    base_elsewhere = finetune(0.6, 0.3, base_eval=eval_report(BASE_SHA, qa_f1=0.3, data={"qa_sha256": "f" * 64}))
    assert failing(policy, base_elsewhere) == ["evidence:base_qa"]
    edited = evidence(evidence_sha256={"reports/eval.json": ("1" * 64, "1" * 64), "lineage.json": ("2" * 64, "3" * 64)})
    assert failing(policy, edited) == ["hash:evidence_files"]  # lineage.json is not what registration stored
    assert "lineage.json" in check(policy, edited, "hash:evidence_files").detail


# ----------------------------------------------------------------------------------------------------------------
# quality


def test_multiple_choice_must_clear_chance_at_the_wilson_lower_bound(policy):
    # 200 four-way items: 30% right is above chance (25%) but its lower bound (24.07%) is not; 35% clears it.
    lucky = check(policy, evidence(eval_report=eval_report(MODEL_SHA, mc_acc=0.30)), "quality:mc_acc_pmi>chance")
    assert not lucky.passed and lucky.n == ITEMS and lucky.interval[0] == pytest.approx(0.2407, abs=1e-4)
    assert lucky.limit == "low > 0.25" and "60 of 200 right" in lucky.detail
    assert check(policy, evidence(eval_report=eval_report(MODEL_SHA, mc_acc=0.35)), "quality:mc_acc_pmi>chance").passed


def test_bits_per_byte_must_beat_both_floors(policy):
    assert failing(policy, evidence(eval_report=eval_report(MODEL_SHA, ppl=6.0))) == ["quality:bits_per_byte<unigram"]
    untrained = eval_report(MODEL_SHA, ppl=9.0)  # worse than its random-init twin (8.0)
    assert failing(policy, evidence(eval_report=untrained)) == [
        "quality:bits_per_byte<random_init", "quality:bits_per_byte<unigram"]  # fmt: skip
    row = check(policy, evidence(), "quality:bits_per_byte<unigram")
    assert row.value == pytest.approx(3.0, rel=1e-3) and row.n == ITEMS and row.interval[0] > 0  # 5.0 - 2.0 bits


def test_a_finetune_must_beat_its_base_on_the_same_pairs(policy):
    assert failing(policy, finetune(0.6, 0.3)) == []
    assert failing(policy, finetune(0.3, 0.3)) == ["quality:qa_f1>base"]  # no better
    row = check(policy, finetune(0.3, 0.4), "quality:qa_f1>base")
    assert not row.passed and row.value == pytest.approx(-0.1) and row.interval[1] < 0
    # the stored base eval must be of the model the fine-tune started from, not of a weaker one
    weak_base = finetune(0.6, 0.3, base_eval=eval_report("c" * 64, qa_f1=0.0))
    assert failing(policy, weak_base) == ["quality:qa_f1>base"]
    assert "measured another model than the one the fine-tune started from" in check(
        policy, weak_base, "quality:qa_f1>base").detail  # fmt: skip
    missing = finetune(0.6, 0.3, base_eval=None)
    assert failing(policy, missing) == ["quality:qa_f1>base"]
    assert "run `forge eval --target pretrain`" in check(policy, missing, "quality:qa_f1>base").detail
    assert check(policy, evidence(), "quality:qa_f1>base").detail == "not a fine-tune: no base model to beat"


def test_a_continued_base_must_beat_the_base_it_started_from(policy):
    init = {"path": "smollm2.gguf", "kind": "gguf", "sha256": "9" * 64, "origin": "SmolLM2-135M-Instruct"}
    name = "quality:bits_per_byte<init_from"
    assert check(policy, evidence(), name).detail == "not continued from a base model (model.init_from unset)"
    learned = evidence(eval_report=eval_report(MODEL_SHA, ppl=2.0, reference=("9" * 64, 2.2)))
    learned.lineage["base"] = init
    row = check(policy, learned, name)
    assert row.passed and row.value == pytest.approx(0.2, rel=1e-3) and row.n == ITEMS
    assert "below its base SmolLM2-135M-Instruct's (2.201) on the test items" in row.detail
    forgot = evidence(eval_report=eval_report(MODEL_SHA, ppl=2.0, reference=("9" * 64, 1.9)), lineage=learned.lineage)
    assert failing(policy, forgot) == [name]
    no_reference = evidence(lineage=learned.lineage)  # evaluated without its base as the reference
    assert failing(policy, no_reference) == [name]
    assert "was not measured against model.init_from's base (smollm2.gguf)" in check(policy, no_reference, name).detail
    # a fine-tune of the continued model: the rule reads the stored eval of the model it was fine-tuned from
    tuned = finetune(0.6, 0.3, base_eval=eval_report(BASE_SHA, qa_f1=0.3, reference=("9" * 64, 2.2)))
    tuned.lineage["base"] = init
    assert failing(policy, tuned) == []
    tuned.base_eval = eval_report(BASE_SHA, qa_f1=0.3, reference=("9" * 64, 1.5))
    assert failing(policy, tuned) == [name]


# ----------------------------------------------------------------------------------------------------------------
# regression, red flags, quantization, the table


def test_regression_against_production_is_paired_and_significant(policy):
    prod = eval_report(MODEL_SHA, ppl=2.0)

    def against(report: dict) -> list[str]:
        return failing(policy, evidence(eval_report=report, production_eval=prod, production_version="1"))

    assert against(eval_report(MODEL_SHA, ppl=1.9)) == []
    assert against(eval_report(MODEL_SHA, ppl=2.1)) == ["regression:bits_per_byte"]
    assert against(eval_report(MODEL_SHA, mc_acc=0.42)) == ["regression:mc_acc_pmi"]  # 0.5 -> 0.42 of 200
    # A difference inside the noise is not a regression: one item of 200 flips back and forth.
    noisy = copy.deepcopy(prod)
    noisy["items"]["mc"]["correct_pmi"][0] = 0
    noisy["items"]["mc"]["correct_pmi"][ITEMS - 1] = 1
    noisy["items"]["mc"]["correct_pmi"][1] = 0
    assert against(noisy) == []
    # Different test text: the bits-per-byte comparison is void (shown, not failed); the Q&A ones still run.
    moved = eval_report(MODEL_SHA, ppl=3.0, data={"test_text_sha256": "9" * 64})
    ev = evidence(eval_report=moved, production_eval=prod, production_version="1", lineage={
        "target": "pretrain", "evidence": {"test_text_sha256": "9" * 64, "qa_sha256": QA_SHA}})  # fmt: skip
    row = check(policy, ev, "regression:bits_per_byte")
    assert row.passed and row.void and row.result == "void" and "unlike numbers are not compared" in row.detail
    assert "regression:bits_per_byte" not in failing(policy, ev)
    assert failing(policy, evidence(production_eval=None, production_version="1")) == ["regression"]
    # production's eval predates per-item scores: nothing to pair with, said so, not failed
    old = copy.deepcopy(prod)
    del old["items"]
    row = check(policy, evidence(production_eval=old, production_version="1"), "regression:qa_f1")
    assert row.void and "has no per-item f1 of qa items: re-run `forge eval`" in row.detail


def test_too_few_items_decide_nothing(policy, tmp_path):
    few = eval_report(MODEL_SHA, mc_acc=0.9)
    for task in ("mc", "text"):
        few["items"][task] = {k: v[:12] if isinstance(v, list) else v for k, v in few["items"][task].items()}
    rows = {c.name: c for c in gate.evaluate(policy, evidence(eval_report=few))}
    for name in ("quality:mc_acc_pmi>chance", "quality:bits_per_byte<unigram"):
        assert not rows[name].passed and rows[name].n == 12 and "fewer than min_items (30)" in rows[name].detail
    path = tmp_path / "gate.yaml"
    path.write_text((REPO / "configs" / "policies" / "gate.yaml").read_text() + "min_items: 10\n")
    assert failing(gate.load_policy(path), evidence(eval_report=few)) == []


def test_a_refusal_for_lack_of_evidence_says_which_setting_to_raise(policy):
    few = eval_report(MODEL_SHA)
    few["items"]["text"] = {k: v[:16] if isinstance(v, list) else v for k, v in few["items"]["text"].items()}
    ev = evidence(eval_report=few)
    ev.lineage["config"] = {"eval": {"text_items": 200}, "data": {"min_eval_tokens": 20000}}
    row = check(policy, ev, "quality:bits_per_byte<unigram")
    assert not row.passed and row.n == 16
    assert row.advice == ("lacked evidence: the run's data gave only 16 test items (eval.text_items=200 asked for "
                          "more): raise data.min_eval_tokens (now 20,000) or lower eval.text_item_bytes (more, "
                          "smaller items)")  # fmt: skip
    ev.lineage["config"]["eval"]["text_items"] = 16
    assert check(policy, ev, "quality:bits_per_byte<unigram").advice == (
        "lacked evidence: 16 test items; raise eval.text_items (now 16) to at least the policy's min_items"
    )
    table = gate_table.format_table(gate.evaluate(policy, ev))
    assert "what to change: quality:bits_per_byte<unigram: lacked evidence: 16 test items" in table
    assert gate_table.advice_tag_key(row) == "forge.gate.advice.quality.bits_per_byte below unigram"


def test_a_refusal_on_the_models_merit_says_by_how_much_and_the_lever(policy):
    ev = finetune(0.3, 0.4)
    ev.lineage["config"] = {"sft": {"max_steps": 60, "micro_batch_size": 8, "grad_accum_steps": 1}}
    ev.lineage["stages"]["sft"]["metrics"] = {"train_examples": 6756}
    row = check(policy, ev, "quality:qa_f1>base")
    assert not row.passed and row.advice.startswith("fell short: the fine-tune beats its base by -0.1 (interval [")
    assert row.advice.endswith("sft.max_steps=60 x 8 examples covered 0.07 epochs of the 6,756 train pairs: raise "
                               "sft.max_steps (or unset it and use sft.epochs)")  # fmt: skip
    assert check(policy, finetune(0.5, 0.3), "quality:qa_f1>base").advice == ""  # a pass needs no advice


def test_drift_bounds_and_the_table(policy):
    assert failing(policy, evidence(quantize_report=quantize_report(Path("m"), drift_q4=0.06))) == [
        "quant:q4_k_m:ppl_drift_vs_f16"
    ]
    flagged = gate.evaluate(policy, evidence(eval_report=eval_report(MODEL_SHA, failing_flag="incoherence")))
    table = gate_table.format_table(flagged)
    row = next(line for line in table.splitlines() if line.startswith("red_flag:incoherence"))
    assert "FAIL" in row and "incoherence evidence" in row
    assert table.endswith("decision: FAIL (1 failing: red_flag:incoherence)")
    header = table.splitlines()[0].split()
    assert header[:6] == ["check", "result", "value", "interval", "n", "limit"]
    mc = next(line for line in table.splitlines() if line.startswith("quality:mc_acc_pmi>chance"))
    assert "[0.4314, 0.5686]" in mc and " 200 " in mc and "low > 0.25" in mc
    tag = next(c for c in flagged if c.name == "quality:mc_acc_pmi>chance")
    assert gate_table.tag_key(tag) == "forge.gate.check.quality.mc_acc_pmi above chance"
    assert gate_table.tag_value(tag).startswith("pass 0.5 [0.4314, 0.5686] n=200 limit low > 0.25")
