"""Calibration: every cleaning rule measured on this corpus, so no rule discards a large share of it unseen.

Each quality rule (quality.rules) and the language rule is measured on every train document that reaches the
filters (all rules, not only the first that fires; a deterministic sample of CALIBRATION_DOCS when train is larger).
For each rule the report gives its value distribution, the threshold, the share of train documents it alone would
drop, and how many it did drop (first in pipeline order). A rule that alone would drop more than
data.calibration_max_drop_share (10%) of train is flagged: the report lists the largest train documents it fails
with their measured value, names the setting to change with the value that would keep 90% of them, and the stage
logs a warning.

The decision: calibration WARNS, it does not relax a threshold by itself. A threshold that moves with the corpus
loosens exactly where junk is common (the more spam a crawl holds, the more a relaxed repetition rule lets in), and
it would make one document's fate depend on the others. Every document's fate stays a function of itself and the
config, and the config (config.yaml and the manifest's config hash) reproduces it; report.json records what
calibration measured and suggested ("calibration": mode "warn"), and the manifest's metrics count the flagged rules
(calibration_flagged_rules). The profiles (forge/data_config.py DATA_PROFILES) are what keeps the defaults right.

    cal = Calibration(cfg.data, expected_train_docs=9_000)
    cal.add(record)                                   # a train record after clean_record (kept or dropped)
    summary = cal.summary()                           # -> report.json["calibration"]
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from forge.config import DataConfig
from pretrain.data import quality

CALIBRATION_DOCS = 100_000  # train documents measured at most (values kept as float32: 4 B per rule each)
EXAMPLES = 5
QUANTILES = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
LANGUAGE_METRIC = "language_score"  # data.languages' score together (filters.judge_language), 0 for another language


@dataclass
class Check:
    """A rule as calibration sees it: which metric, which bound, the threshold in force and where it is set."""

    name: str
    filter: str
    metric: str
    kind: str
    path: str
    threshold: Any

    def fails(self, value: float) -> bool:
        return quality.fails(self.kind, value, self.threshold)


def checks(cfg: DataConfig) -> list[Check]:
    out = []
    if cfg.language:
        out.append(Check("min_language_score", "language", LANGUAGE_METRIC, "min", "data.min_language_score",
                         cfg.min_language_score))  # fmt: skip
    if cfg.quality.enabled:
        q = cfg.quality
        out += [Check(r.name, r.filter, r.metric, r.kind, r.path, r.threshold(q)) for r in quality.rules(q)]
    return out


def language_value(lang: str, score: float, judged_words: int, cfg: DataConfig) -> float:
    if not cfg.language or judged_words < cfg.language_min_words:
        return float("nan")  # not judged: too little prose
    return score if lang in cfg.languages else 0.0


class Calibration:
    def __init__(self, cfg: DataConfig, expected_train_docs: int):
        self.cfg = cfg
        self.checks = checks(cfg)
        self.rate = min(1.0, CALIBRATION_DOCS / max(expected_train_docs, 1))
        self.values = {c.name: array("f") for c in self.checks}
        self.failing = Counter()
        self.dropped = Counter()  # first rule to fire, among the measured train documents
        self.examples: dict[str, list[tuple[int, str, float, str]]] = {c.name: [] for c in self.checks}
        self.other_languages: Counter = Counter()
        self.measured = 0
        self.train_docs = 0

    def add(self, record: dict[str, Any]) -> None:
        metrics = record.get("metrics")
        if record.get("split") != "train" or metrics is None:
            return
        self.train_docs += 1
        if self.rate < 1.0 and xxhash.xxh64_intdigest(record["id"].encode(), seed=7) / 2**64 >= self.rate:
            return
        self.measured += 1
        dropped_by = record.get("rule") or record.get("drop") or ""
        if "drop" in record:
            self.dropped[dropped_by] += 1
        chars = len(record["text"])
        for check in self.checks:
            value = metrics.get(check.metric, float("nan"))
            self.values[check.name].append(value)
            if check.fails(value):
                self.failing[check.name] += 1
                entry = (chars, record["id"], value, dropped_by or "kept")
                heap = self.examples[check.name]
                (heapq.heappush if len(heap) < EXAMPLES else heapq.heappushpop)(heap, entry)
                if check.metric == LANGUAGE_METRIC:
                    self.other_languages[record.get("meta", {}).get("lang", "und")] += 1

    def summary(self) -> dict[str, Any]:
        share = self.cfg.calibration_max_drop_share
        rules = []
        for check in self.checks:
            values = np.asarray(self.values[check.name], dtype=np.float64)
            values = values[~np.isnan(values)]
            failing = self.failing[check.name]
            pct = 100 * failing / max(self.measured, 1)
            entry = {
                "rule": check.name,
                "filter": check.filter,
                "setting": check.path,
                "kind": check.kind,
                "threshold": check.threshold,
                "measured": int(len(values)),
                "failing": failing,
                "failing_pct": round(pct, 2),
                "dropped": self.dropped[check.name],
                "quantiles": {f"p{round(q * 100)}": round(float(np.quantile(values, q)), 4) for q in QUANTILES}
                if len(values) and check.kind != "flag" else {},
                "flagged": failing > share * self.measured and failing > 0,
                "examples": [{"id": i, "chars": c, "value": round(v, 4), "dropped_by": d}
                             for c, i, v, d in sorted(self.examples[check.name], reverse=True)],
            }  # fmt: skip
            if entry["flagged"]:
                entry["suggestion"] = suggestion(check, values, share)
                entry["set"] = setting_line(check, entry["suggestion"], self.cfg)
                if check.metric == LANGUAGE_METRIC:
                    entry["languages_failing"] = dict(self.other_languages.most_common(8))
                    found = [lang for lang in entry["languages_failing"] if lang not in self.cfg.languages][:3]
                    if found:  # pages in other languages: keeping them is a choice of languages, not of a score
                        listed = ", ".join([*self.cfg.languages, *found])
                        entry["set"] = f"--set 'data.languages=[{listed}]' (to keep those languages), or {entry['set']}"
            rules.append(entry)
        return {
            "mode": "warn",
            "max_drop_share": share,
            "train_docs": self.train_docs,
            "train_docs_measured": self.measured,
            "rules": rules,
            "flagged": [r["rule"] for r in rules if r["flagged"]],
        }


def suggestion(check: Check, values: np.ndarray, share: float) -> Any:
    """The threshold at which this rule alone would drop `share` of the measured train documents."""
    if check.kind == "flag":
        return False
    if not len(values):
        return check.threshold
    if check.kind == "min":
        value = float(np.quantile(values, share))
        rounded = _round(value, down=True)
    else:
        value = float(np.quantile(values, 1 - share))
        rounded = _round(value, down=False)
    return int(rounded) if isinstance(check.threshold, int) and not isinstance(check.threshold, bool) else rounded


def _round(value: float, down: bool) -> float:
    """Two significant digits, rounded in the direction that keeps the document at the quantile."""
    if value == 0 or not math.isfinite(value):
        return value
    scale = 10 ** (math.floor(math.log10(abs(value))) - 1)
    return (math.floor if down else math.ceil)(value / scale) * scale


def setting_line(check: Check, value: Any, cfg: DataConfig) -> str:
    """The override a user would pass, e.g. --set data.quality.min_words=12 (an n-gram size: its whole dict)."""
    if "[" in check.path:
        name = check.path.split("[")[0]
        table = dict(getattr(cfg.quality, name.rsplit(".", 1)[1]))
        table[int(check.path.split("[")[1].rstrip("]"))] = value
        return f"--set '{name}={{{', '.join(f'{k}: {v:g}' for k, v in sorted(table.items()))}}}'"
    shown = str(value).lower() if isinstance(value, bool) else f"{value:g}"
    return f"--set {check.path}={shown}"
