"""Red flags: checks that can fail a model, each a pass/fail with its measured value, its threshold (from
`EvalConfig`) and one line of evidence. `passed=None` means the check could not run (no reference model, no
training history) and says why; it neither passes nor fails a gate.

  repetition     repeated n-gram rate and distinct-2 over the sampled generations
  ppl_drift      test bits per byte against a reference model (previous stage, production, unquantized original),
                 each scored with its own tokenizer
  val_rise       validation perplexity at the end of training above its minimum (the training history)
  memorisation   verbatim continuation rate of training documents minus that of test documents
  incoherence    low bits per byte (below the unigram floor's) together with degenerate generations
  untrained      bits per byte not far below a uniform guess over the vocabulary's (a random-init model)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from evaluation.tasks import distinct_n, repeated_ngram_rate
from forge.config import EvalConfig


def flag(name: str, passed: bool | None, value: Any, threshold: Any, evidence: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "passed": passed, "value": value, "threshold": threshold, "evidence": evidence, **extra}


def degenerate(ids: Sequence[int], cfg: EvalConfig) -> bool:
    """A generation that is empty or short, or mostly repeats itself."""
    return len(ids) < min(cfg.min_generation_tokens, cfg.max_new_tokens) or (
        repeated_ngram_rate([ids], cfg.repetition_ngram) > cfg.max_repeated_ngram_rate
    )


def repetition(generations: list[Sequence[int]], cfg: EvalConfig) -> dict[str, Any]:
    n = cfg.repetition_ngram
    rate = repeated_ngram_rate(generations, n)
    d2 = distinct_n(generations, 2)
    passed = rate <= cfg.max_repeated_ngram_rate and d2 >= cfg.min_distinct_2
    return flag(
        "repetition", passed if generations else None, {f"repeated_{n}gram_rate": rate, "distinct_2": d2},
        {f"max_repeated_{n}gram_rate": cfg.max_repeated_ngram_rate, "min_distinct_2": cfg.min_distinct_2},
        f"{len(generations)} sampled generations: {rate:.1%} of {n}-grams repeat an earlier one "
        f"(max {cfg.max_repeated_ngram_rate:.0%}); distinct-2 {d2:.3f} (min {cfg.min_distinct_2})",
    )  # fmt: skip


def ppl_drift(
    text: dict[str, Any], reference_text: dict[str, Any] | None, reference: str | None, max_drift: float
) -> dict[str, Any]:
    """Test bits per byte against a reference model's (each scored through its own tokenizer: a per-token
    perplexity would compare different units); `max_drift` is eval.max_ppl_drift, or eval.max_finetune_ppl_drift
    when the reference is the base model a fine-tune started from (some forgetting of raw text is expected there)."""
    if reference_text is None or not reference:
        return flag("ppl_drift", None, None, max_drift, "no reference model (set eval.reference)")
    bpb, ref_bpb = text["bits_per_byte"], reference_text["bits_per_byte"]
    drift = bpb / ref_bpb - 1
    return flag(
        "ppl_drift", drift <= max_drift, drift, max_drift,
        f"test bits per byte {bpb:.4f} vs {ref_bpb:.4f} for the reference {reference}: {drift:+.1%} "
        f"(max +{max_drift:.0%})", reference=reference, reference_bits_per_byte=ref_bpb,
        reference_tokenizer=reference_text["tokenizer"],
    )  # fmt: skip


def val_rise(history: list[dict[str, Any]] | None, source: str | None, cfg: EvalConfig) -> dict[str, Any]:
    """From the training history's evaluations (records with val_loss, or eval_loss for trainers' logs)."""
    points = []
    for record in history or []:
        loss = record.get("val_loss", record.get("eval_loss"))
        if isinstance(loss, (int, float)) and math.isfinite(loss):
            points.append((record.get("step"), float(loss)))
    if len(points) < 2:
        why = "no training history found" if not history else f"{len(points)} validation point(s) in {source}"
        return flag("val_rise", None, None, cfg.max_val_ppl_rise, why)
    best = min(range(len(points)), key=lambda i: points[i][1])
    best_step, best_loss = points[best]
    last_step, last_loss = points[-1]
    rise = math.exp(min(last_loss - best_loss, 700)) - 1  # relative perplexity rise, last over the minimum
    return flag(
        "val_rise", rise <= cfg.max_val_ppl_rise, rise, cfg.max_val_ppl_rise,
        f"val perplexity {math.exp(min(best_loss, 700)):.3f} at its minimum (step {best_step}), "
        f"{math.exp(min(last_loss, 700)):.3f} at the last evaluation (step {last_step}): {rise:+.1%} "
        f"(max +{cfg.max_val_ppl_rise:.0%}) in {source}",
        history=[{"step": s, "val_ppl": math.exp(min(v, 700))} for s, v in points], best_step=best_step,
    )  # fmt: skip


def memorisation(train: dict[str, float], test: dict[str, float], cfg: EvalConfig) -> dict[str, Any]:
    if not train["documents"] or not test["documents"]:
        return flag("memorisation", None, None, cfg.max_memorisation_gap, "no documents long enough to test")
    gap = train["exact"] - test["exact"]
    return flag(
        "memorisation", gap <= cfg.max_memorisation_gap, gap, cfg.max_memorisation_gap,
        f"greedy continuation of {cfg.memorisation_prefix} tokens reproduces the next {cfg.memorisation_suffix} "
        f"verbatim for {train['exact']:.0%} of {int(train['documents'])} training documents vs {test['exact']:.0%} "
        f"of {int(test['documents'])} test documents (gap max {cfg.max_memorisation_gap:.0%})",
        train=train, test=test,
    )  # fmt: skip


def incoherence(bpb: float, unigram_bpb: float, generations: list[Sequence[int]], cfg: EvalConfig) -> dict[str, Any]:
    if not generations:
        return flag("incoherence", None, None, cfg.max_degenerate_rate, "no generations")
    rate = sum(degenerate(g, cfg) for g in generations) / len(generations)
    low = bpb < cfg.incoherence_ppl_ratio * unigram_bpb
    return flag(
        "incoherence", not (low and rate > cfg.max_degenerate_rate),
        {"degenerate_rate": rate, "bits_per_byte_over_unigram": bpb / unigram_bpb},
        {"max_degenerate_rate": cfg.max_degenerate_rate,
         "low_bits_per_byte_below": cfg.incoherence_ppl_ratio * unigram_bpb},
        f"test bits per byte {bpb:.4f} is {'below' if low else 'not below'} {cfg.incoherence_ppl_ratio:g} x the "
        f"unigram floor's {unigram_bpb:.4f}; {rate:.0%} of generations are degenerate (short or repeating; "
        f"max {cfg.max_degenerate_rate:.0%})",
    )  # fmt: skip


def untrained(text: dict[str, Any], vocab_size: int, cfg: EvalConfig) -> dict[str, Any]:
    """A uniform guess over the vocabulary costs log2(vocab) bits per token; the threshold is on the per-token
    perplexity over the vocabulary size, the same comparison in the model's own tokens."""
    uniform_bpb = math.log2(vocab_size) * text["tokens"] / text["bytes"]
    ratio = text["ppl"] / vocab_size
    return flag(
        "untrained", ratio < cfg.max_uniform_ppl_ratio, ratio, cfg.max_uniform_ppl_ratio,
        f"test bits per byte {text['bits_per_byte']:.4f} vs {uniform_bpb:.4f} for a uniform guess over the "
        f"{vocab_size}-token vocabulary: perplexity {text['ppl']:.1f} is {ratio:.2f} x the vocabulary size "
        f"(a uniform guess scores 1.0; max {cfg.max_uniform_ppl_ratio})",
    )  # fmt: skip


def benchmark_flag(task: str, results: list[dict[str, Any]] | None, threshold: float) -> dict[str, Any]:
    """eval.min_benchmark: the task's main score (acc_norm, else acc, else its first metric) at least `threshold`."""
    rows = [r for r in results or [] if r["task"] == task]
    if not rows:
        return flag(f"benchmark:{task}", None, None, threshold, f"{task} was not run (add it to --benchmarks)")
    by_metric = {r["metric"]: r["value"] for r in rows}
    metric = next((m for m in ("acc_norm", "acc") if m in by_metric), rows[0]["metric"])
    value = by_metric[metric]
    return flag(
        f"benchmark:{task}", value >= threshold, value, threshold,
        f"lm-eval {task} {metric} = {value:.4f} (min {threshold})", metric=metric,
    )  # fmt: skip
