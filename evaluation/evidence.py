"""The evidence the gate will judge, checked before anything trains, and what collecting it will cost.

Every quality rule of the gate policy (configs/policies/gate.yaml) needs at least `min_items` items to decide: the
multiple-choice items for above-chance, the test items for the bits-per-byte rules, the held-out pairs for a
fine-tune against its base. How many it gets is the smaller of what the eval settings draw and what the data holds:

  quality:mc_acc_pmi>chance          eval.mc_max_examples     held-out Q&A pairs (one item each)
  quality:bits_per_byte<...          eval.text_items          test text cut into eval.text_item_bytes pieces
  quality:qa_f1>base                 eval.qa_max_examples     held-out Q&A pairs

`forge plan` and the pipeline (right after its plan, and again once the data and Q&A stages have run, before the
tokenizer and training) call `check`: a rule that cannot get its items is an error that names the setting and the
smallest value that works, so a refusal for missing evidence never comes after an hour of training. The check also
says what the evaluations will cost: the items of each, and seconds from the speed of the model's own shape
measured on this machine (a random-init model, a few forward passes; cached in ~/.cache/forge/speed.json).

    report = check(cfg)       # ForgeError listing every shortfall; else {"rules": [...], "eval_seconds": ...}
"""

from __future__ import annotations

import logging
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from forge import ForgeError
from forge.config import ForgeConfig
from forge.io import atomic_write_json, read_json_object
from forge.lineage import completed_manifest
from forge.machine import usable_cores
from forge.paths import run_dir
from forge.policy import Policy, load_policy

log = logging.getLogger("forge.eval")

# Tokens an item costs a model, for the time estimate. A multiple-choice item is its four answers each after the
# question and alone (PMI): measured on SmolLM2-135M and git's manual, 100 items took 230 s on 2 cores at a measured
# 511 tokens/s, ~1,100 tokens each. A Q&A prompt (few-shot examples for a base model) ~250; domain text ~4 UTF-8
# bytes per token; answers are decoded ~4 at a time (models/access.py batches them).
MC_TOKENS, QA_PROMPT_TOKENS, BYTES_PER_TOKEN, DECODE_BATCH = 1100, 250, 4.0, 4
# The random-init twin reads every test item and RANDOM_SHARE of the rest (evaluation/stage.py).
RANDOM_SHARE = 0.25
SPEED_CACHE = Path(os.environ.get("FORGE_CACHE", Path.home() / ".cache" / "forge")) / "speed.json"


@dataclass
class Need:
    rule: str  # the gate's check name
    task: str  # mc | text | qa
    setting: str  # the eval setting that draws the items
    drawn: int  # what that setting draws
    available: int | None  # what the data holds (None: the data or Q&A stage has not run yet)
    needed: int  # the policy's min_items

    @property
    def items(self) -> int:
        return self.drawn if self.available is None else min(self.drawn, self.available)


def needs(cfg: ForgeConfig, policy: Policy) -> list[Need]:
    """Every quality rule the gate will judge for this run, with the items it will get."""
    e, q = cfg.eval, policy.quality
    pairs, pieces = held_out_pairs(cfg), test_pieces(cfg)
    out = [Need(f"quality:{m}>chance", "mc", "eval.mc_max_examples", e.mc_max_examples, pairs, policy.min_items)
           for m in q.above_chance]  # fmt: skip
    out += [Need(f"quality:bits_per_byte<{f}", "text", "eval.text_items", e.text_items, pieces, policy.min_items)
            for f in q.beats_floors]  # fmt: skip
    out += [Need(f"quality:{m}>base", "qa", "eval.qa_max_examples", e.qa_max_examples, pairs, policy.min_items)
            for m in q.beats_base]  # fmt: skip
    if q.beats_init_from and cfg.model.init_from:
        out.append(Need("quality:bits_per_byte<init_from", "text", "eval.text_items", e.text_items, pieces,
                        policy.min_items))  # fmt: skip
    return out


def held_out_pairs(cfg: ForgeConfig) -> int | None:
    """The held-out Q&A pairs the qa stage wrote for this run (None before it has run)."""
    stage = run_dir(cfg) / "qa"
    path = stage / "qa_eval.jsonl"
    if completed_manifest(stage) is None or not path.is_file():
        return None
    with open(path, encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())


def test_pieces(cfg: ForgeConfig) -> int | None:
    """How many items the test split can give at eval.text_item_bytes (None before the data stage has run)."""
    if completed_manifest(run_dir(cfg) / "data") is None:
        return None
    from evaluation.text import cut, read_split

    try:
        return sum(len(cut(d, cfg.eval.text_item_bytes)) for d in read_split(cfg, "test", None).documents)
    except ForgeError:
        return None


def shortfalls(cfg: ForgeConfig, wanted: list[Need]) -> list[str]:
    """One sentence per rule that cannot get its items: which setting (or data) to change, to what."""
    problems = []
    for n in wanted:
        if n.drawn < n.needed:
            problems.append(f"{n.setting}={n.drawn} gives {n.rule} {n.drawn} items, fewer than the gate's min_items="
                            f"{n.needed}: set {n.setting} to at least {n.needed}")  # fmt: skip
        elif n.available is not None and n.available < n.needed:
            problems.append(f"{n.rule} can get only {n.available} items from this run's data, fewer than the gate's "
                            f"min_items={n.needed}: {_more_data(cfg, n)}")  # fmt: skip
    return problems


def _more_data(cfg: ForgeConfig, n: Need) -> str:
    """What gives a rule more items when the data is what runs short."""
    d = cfg.data
    if n.task == "text":
        test_bytes = n.available * cfg.eval.text_item_bytes  # at most
        smaller = max(64, test_bytes // n.needed)
        return (f"the test split holds about {n.available} pieces of eval.text_item_bytes={cfg.eval.text_item_bytes}; "
                f"set eval.text_item_bytes={smaller} (more, smaller items) or raise data.min_eval_tokens (now "
                f"{d.min_eval_tokens:,}) so the test split holds more text")  # fmt: skip
    kind = cfg.qa.source
    if kind in ("auto", "corpus") and list(d.inputs) != ["builtin:python-stdlib"]:
        factor = math.ceil(d.min_eval_tokens * n.needed / max(n.available, 1))
        return (f"held-out pairs come from the val and test documents: raise data.min_eval_tokens from "
                f"{d.min_eval_tokens:,} to about {factor:,}, add a teacher (qa.teacher), or give your own pairs "
                "(qa.source=PATH)")  # fmt: skip
    share = min(0.5, cfg.qa.eval_fraction * n.needed / max(n.available, 1))
    return f"raise qa.eval_fraction from {cfg.qa.eval_fraction:g} to about {share:.2g}"


# ----------------------------------------------------------------------------------------------------------------
# the check, and what the evaluations will cost


def check(cfg: ForgeConfig, measure_speed: bool = True) -> dict[str, Any]:
    """The rules and their items, the SFT budget and the evaluations' expected time; ForgeError on a shortfall."""
    policy = load_policy(cfg.registry.gate_policy)
    wanted = needs(cfg, policy)
    problems = shortfalls(cfg, wanted)
    if problems:
        raise ForgeError(
            f"the gate ({cfg.registry.gate_policy}) would refuse this run for want of evidence, whatever the model: "
            + "; ".join(problems)
        )
    speed = measured_speed(cfg) if measure_speed else None
    return {"min_items": policy.min_items, "rules": [asdict(n) | {"items": n.items} for n in wanted],
            "sft": sft_budget(cfg, speed), "eval": eval_cost(cfg, wanted, speed)}  # fmt: skip


def eval_cost(cfg: ForgeConfig, wanted: list[Need], speed: dict[str, float] | None) -> dict[str, Any]:
    """Tokens each evaluation scores and generates, and the seconds they take at the measured speed."""
    e = cfg.eval
    items = {n.task: n.items for n in wanted}
    text_tokens = items.get("text", e.text_items) * e.text_item_bytes / BYTES_PER_TOKEN
    scored = text_tokens * (1 + 1 + bool(cfg.model.init_from)) + items.get("mc", e.mc_max_examples) * MC_TOKENS * (
        1 + RANDOM_SHARE)  # the model, its random-init twin, the base it started from  # fmt: skip
    qa = items.get("qa", e.qa_max_examples) * (1 + RANDOM_SHARE)
    generated = qa * e.max_new_tokens
    scored += qa * QA_PROMPT_TOKENS
    out: dict[str, Any] = {"scored_tokens": round(scored), "generated_tokens": round(generated), "evaluations": 2}
    if speed:
        seconds = scored / speed["prefill_tokens_s"] + generated / (speed["decode_tokens_s"] * DECODE_BATCH)
        out |= {"seconds_each": round(seconds), "speed": speed}
    return out


def sft_budget(cfg: ForgeConfig, speed: dict[str, float] | None) -> dict[str, Any]:
    """The share of the Q&A set the SFT budget covers (sft.epochs, or sft.max_steps when set) and its time."""
    s = cfg.sft
    pairs = _train_pairs(cfg)
    per_step = s.micro_batch_size * s.grad_accum_steps
    steps = s.max_steps if s.max_steps > 0 else (math.ceil(s.epochs * pairs / per_step) if pairs else None)
    out: dict[str, Any] = {"train_pairs": pairs, "examples_per_step": per_step, "steps": steps}
    if steps and pairs:
        out["epochs"] = round(steps * per_step / pairs, 3)
    if steps and speed:
        tokens = steps * per_step * min(s.max_seq_length, 256)  # a Q&A pair rendered is rarely longer
        passes = 3 if s.mode == "full" else 2  # forward + backward ~3 forwards; LoRA computes no weight gradients
        out["seconds"] = round(passes * tokens / speed["prefill_tokens_s"])  # 60 LoRA steps of SmolLM2: 444 s
    return out


def _train_pairs(cfg: ForgeConfig) -> int | None:
    report = read_json_object(run_dir(cfg) / "qa" / "report.json") or {}
    value = report.get("train_pairs")
    return int(value) if isinstance(value, int) else None


def measured_speed(cfg: ForgeConfig) -> dict[str, float] | None:
    """Prefill and decode tokens/s of a random-init model of the run's shape on this machine's CPU, cached by
    shape; None for a GPU plan (the plan's MFU estimate stands there) or when the shape cannot be built."""
    if cfg.plan.hardware != "cpu":
        return None
    from pretrain.model import build_model, model_config

    m = model_config(cfg)
    vocab = m.vocab_size or cfg.tokenizer.vocab_size
    key = f"{m.architecture}:{m.hidden_size}x{m.num_layers}:{m.intermediate_size}:{vocab}:{usable_cores()}:" \
          f"{platform.processor() or platform.machine()}"  # fmt: skip
    cache = read_json_object(SPEED_CACHE) or {}
    if key in cache:
        return cache[key]
    try:
        speed = _time_forwards(build_model(m.model_copy(update={"vocab_size": vocab})), min(m.context_length, 256))
    except Exception as exc:  # noqa: BLE001 - an estimate is never worth failing the plan over
        log.warning("eval time estimate: could not time the model's shape (%s)", exc)
        return None
    atomic_write_json(SPEED_CACHE, {**cache, key: speed})
    return speed


def _time_forwards(model: Any, length: int) -> dict[str, float]:
    import torch

    model.eval()
    ids = torch.randint(3, model.config.vocab_size, (1, length))
    with torch.inference_mode():
        model(ids)  # warm-up
        start = time.perf_counter()
        out = model(ids, use_cache=True)
        prefill = length / (time.perf_counter() - start)
        past, token, steps = out.past_key_values, ids[:, -1:], 16
        start = time.perf_counter()
        for _ in range(steps):
            past = model(token, past_key_values=past, use_cache=True).past_key_values
        decode = steps / (time.perf_counter() - start)
    return {"prefill_tokens_s": round(prefill, 1), "decode_tokens_s": round(decode, 1), "measured_at": time.time()}


def render(report: dict[str, Any]) -> str:
    """The check as plan.txt shows it."""
    lines = [f"evidence    each gate rule needs {report['min_items']} items (registry min_items)"]
    for r in report["rules"]:
        have = "" if r["available"] is None else f", data holds {r['available']}"
        lines.append(f"  {r['rule']:<34} {r['items']:>5} items ({r['setting']}={r['drawn']}{have})")
    ev, sft = report["eval"], report["sft"]
    when = f", ~{ev['seconds_each'] / 60:.1f} min each on this machine" if "seconds_each" in ev else ""
    lines.append(f"  evaluations: {ev['evaluations']} of ~{ev['scored_tokens']:,} tokens scored and "
                 f"{ev['generated_tokens']:,} generated{when}")  # fmt: skip
    if sft.get("epochs") is not None:
        took = f", ~{sft['seconds'] / 60:.1f} min" if sft.get("seconds") else ""
        lines.append(f"sft         {sft['steps']:,} steps x {sft['examples_per_step']} examples = {sft['epochs']:.2f} "
                     f"epochs of the {sft['train_pairs']:,} train pairs{took}")  # fmt: skip
    elif sft.get("steps"):
        lines.append(f"sft         {sft['steps']:,} steps x {sft['examples_per_step']} examples (the Q&A set is "
                     "not built yet: run forge qa to see the share of it they cover)")  # fmt: skip
    return "\n".join(lines)


def check_run(cfg: ForgeConfig, force: bool = False) -> dict[str, Any]:
    """The pipeline's step: the check, logged (never skipped: it reads what the stages before it wrote)."""
    report = check(cfg)
    for line in render(report).split("\n"):
        log.info("%s", line)
    return report
