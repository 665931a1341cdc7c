"""The promotion gate's policy file (configs/policies/gate.yaml): its schema and how it is read.

The gate (registry/gate.py) judges a version by it; evaluation sizes its evidence to it (every rule gets at least
`min_items` items) and `forge plan` checks a run's settings against it before anything trains, so the schema lives
here, below all three.

    policy = load_policy("configs/policies/gate.yaml")
    policy.min_items, policy.quality.beats_base
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from forge import ForgeError

FORMAT = "forge-gate/2"
# A metric the gate can compare item by item: eval.json's items[task][field] (evaluation/report.py).
ITEM_FIELDS = {
    "mc_acc": ("mc", "correct"), "mc_acc_norm": ("mc", "correct_norm"), "mc_acc_pmi": ("mc", "correct_pmi"),
    "qa_f1": ("qa", "f1"), "qa_exact_match": ("qa", "exact_match"), "bits_per_byte": ("text", "bits"),
}  # fmt: skip
FLOORS = ("random_init", "unigram")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MetricRule(_Strict):
    min: float | None = None
    max: float | None = None


class QualityRule(_Strict):
    above_chance: list[str] = []
    beats_floors: list[str] = []
    beats_base: list[str] = []
    beats_init_from: list[str] = []

    @model_validator(mode="after")
    def _known(self) -> QualityRule:
        allowed = {"above_chance": [m for m, f in ITEM_FIELDS.items() if f[0] == "mc"], "beats_floors": list(FLOORS),
                   "beats_base": [m for m, f in ITEM_FIELDS.items() if f[0] != "text"],
                   "beats_init_from": [m for m, f in ITEM_FIELDS.items() if f[0] == "text"]}  # fmt: skip
        problems = [f"{rule}: unknown {bad}, use {allowed[rule]}" for rule in allowed
                    if (bad := [m for m in getattr(self, rule) if m not in allowed[rule]])]  # fmt: skip
        if problems:
            raise ValueError("; ".join(problems))
        return self


class RedFlagRule(_Strict):
    required: list[str] = []
    allow_not_run: list[str] = []


class QuantRule(_Strict):
    required: list[str] = []
    max_ppl_drift_vs_f16: dict[str, float] = {}
    max_ppl_drift: dict[str, float] = {}


class RegressionRule(_Strict):
    tolerance: float = Field(0.0, ge=0)  # in the metric's own units: how much worse is not yet a regression


class Policy(_Strict):
    format: str = FORMAT
    confidence: float = Field(0.95, gt=0.5, lt=1)
    bootstrap_resamples: int = Field(2000, ge=200)
    min_items: int = Field(30, ge=1)  # fewer items (pairs, documents) than this fail a rule instead of deciding it
    quality: QualityRule = QualityRule()
    metrics: dict[str, MetricRule] = {}
    red_flags: RedFlagRule = RedFlagRule()
    quantization: QuantRule = QuantRule()
    regression: dict[str, RegressionRule] = {}
    sha256: str = ""  # of the policy file's bytes, filled by load_policy

    @model_validator(mode="after")
    def _format(self) -> Policy:
        if self.format != FORMAT:
            raise ValueError(
                f"format={self.format!r}: this Forge reads {FORMAT!r} (quality rules with intervals); start from "
                "configs/policies/gate.yaml"
            )
        return self

    @field_validator("regression")
    @classmethod
    def _comparable(cls, value: dict[str, RegressionRule]) -> dict[str, RegressionRule]:
        unknown = sorted(set(value) - set(ITEM_FIELDS))
        if unknown:
            raise ValueError(f"{unknown} cannot be compared item by item; use {sorted(ITEM_FIELDS)}")
        return value


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
        raise ForgeError(f"gate policy {path} must be a mapping (format, quality, red_flags, quantization, regression)")
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
