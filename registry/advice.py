"""What to change when the gate says no: for every failing quality rule, whether it lacked evidence (which setting,
to what value) or the model fell short (by how much, and the lever that moves it).

The run's own settings come from the version's lineage.json (its resolved config), so the advice names the values
the run had: "sft.max_steps=60 covered 0.07 epochs of the 6,756 train pairs", not a generic hint. The advice is
printed under the decision table, shown in the report card and tagged on the version (forge.gate.advice.*).

    for check in checks:
        check.advice = advice(check, config, report)    # "" for a passing check or one with nothing to add
"""

from __future__ import annotations

import re
from typing import Any

# rule prefix -> (the eval setting that draws its items, what those items are)
ITEMS = {
    "quality:mc_acc": ("eval.mc_max_examples", "multiple-choice items"),
    "quality:bits_per_byte": ("eval.text_items", "test items"),
    "quality:qa_f1": ("eval.qa_max_examples", "held-out Q&A pairs"),
    "regression:bits_per_byte": ("eval.text_items", "test items"),
    "regression:qa_f1": ("eval.qa_max_examples", "held-out Q&A pairs"),
    "regression:mc_acc_pmi": ("eval.mc_max_examples", "multiple-choice items"),
}
TOO_FEW = re.compile(r"only (\d+) items")


def advice(name: str, passed: bool, detail: str, estimate: float | None, interval: list[float] | None,
           config: dict[str, Any], sft: dict[str, Any]) -> str:  # fmt: skip
    """One sentence for a failing rule ("" when it passed or there is nothing to add). `config` is the run's resolved
    config (lineage.json), `sft` the SFT stage's data report (train_examples), when known."""
    if passed:
        return ""
    few = TOO_FEW.search(detail)
    if few:
        return _lacked(name, int(few.group(1)), config)
    if name.startswith("quality:") and interval is not None:
        return _fell_short(name, estimate, interval, config, sft)
    return ""


def _lacked(name: str, n: int, config: dict[str, Any]) -> str:
    setting, what = next((v for k, v in ITEMS.items() if name.startswith(k)), ("", "items"))
    section, _, key = setting.partition(".")
    drawn = (config.get(section) or {}).get(key)
    data = (config.get("data") or {}).get("min_eval_tokens")
    if isinstance(drawn, int) and drawn < 30:
        return f"lacked evidence: {n} {what}; raise {setting} (now {drawn}) to at least the policy's min_items"
    more = f"raise data.min_eval_tokens (now {data:,})" if isinstance(data, int) else "add data"
    if "text" in setting:
        more += " or lower eval.text_item_bytes (more, smaller items)"
    return f"lacked evidence: the run's data gave only {n} {what} ({setting}={drawn} asked for more): {more}"


def _fell_short(name: str, estimate: float | None, interval: list[float], config: dict[str, Any],
                sft: dict[str, Any]) -> str:  # fmt: skip
    low, high = interval
    by = f"{estimate:+.3g} (interval [{low:.3g}, {high:.3g}], needs its low end above the limit)"
    train, s = config.get("train") or {}, config.get("sft") or {}
    if name.endswith(">base"):
        return f"fell short: the fine-tune beats its base by {by}. {_sft_lever(s, sft)}"
    if "init_from" in name:
        return (f"fell short: continued pretraining improved bits per byte on its base by {by}. More continued "
                f"pretraining (train.max_steps, now {train.get('max_steps')}) on more of the corpus, or a lower "
                f"train.lr (now {train.get('lr')}) if the validation loss rose")  # fmt: skip
    if "bits_per_byte<" in name:
        return (
            f"fell short: bits per byte below the floor by {by}. Train longer (train.max_steps, now "
            f"{train.get('max_steps')}) or a larger model; see the pretrain loss curve for divergence"
        )
    if name.endswith(">chance"):
        return f"fell short: multiple choice {by} against chance. {_sft_lever(s, sft)}, or start from a larger base"
    return ""


def _sft_lever(s: dict[str, Any], sft: dict[str, Any]) -> str:
    """More of the Q&A set: what the SFT budget covered, in epochs of it."""
    pairs = sft.get("train_examples")
    per_step = (s.get("micro_batch_size") or 1) * (s.get("grad_accum_steps") or 1)
    steps = s.get("max_steps") or -1
    if steps > 0 and pairs:
        return (f"sft.max_steps={steps} x {per_step} examples covered {steps * per_step / pairs:.2f} epochs of the "
                f"{pairs:,} train pairs: raise sft.max_steps (or unset it and use sft.epochs)")  # fmt: skip
    return f"more SFT (sft.epochs, now {s.get('epochs')}), a higher sft.lr (now {s.get('lr')}) or sft.mode=full"
