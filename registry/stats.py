"""The interval arithmetic the gate decides with: a Wilson score interval for an accuracy against chance, and a paired
bootstrap for the difference between two models scored on the same items.

    wilson_interval(270, 1000, 0.95)              # (0.2434, 0.2984): is 27% over 1000 four-way items above 0.25?
    paired_bootstrap(sft_f1, base_f1, 0.95)        # Interval of mean(sft) - mean(base) over the same held-out pairs
    paired_bootstrap(bits_a, bits_b, 0.95, weights=bytes)   # bits per byte: sum(bits) / sum(bytes) per resample

Why these two: an accuracy over n items is a binomial proportion, and Wilson's interval keeps its coverage near the
nominal level for small n and for proportions near 0 or 1 where the normal (Wald) interval does not (Newcombe 1998,
"Two-sided confidence intervals for the single proportion"). A difference between two models on the same items is
paired: resampling items (not each model's scores separately) keeps the per-item correlation, which is what makes a
small but consistent improvement significant (Koehn 2004, "Statistical significance tests for machine translation
evaluation"; the same percentile bootstrap lm-eval reports its stderr with).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

RESAMPLE_CHUNK = 100  # resamples drawn at once: 100 x n item indices in memory


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int  # items (an accuracy's trials, a paired comparison's pairs)
    confidence: float

    def __str__(self) -> str:
        return f"{self.estimate:.4g} [{self.low:.4g}, {self.high:.4g}] n={self.n}"


def z_value(confidence: float) -> float:
    """The two-sided standard normal quantile: 1.96 for 0.95."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence}: must be between 0 and 1")
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson's score interval for a proportion of `successes` out of `n` trials."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n and n > 0, got {successes}/{n}")
    z = z_value(confidence)
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if successes == 0 else center - half  # exact at the ends, where rounding would leave 1e-17
    high = 1.0 if successes == n else center + half
    return Interval(p, low, high, n, confidence)


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    weights: Sequence[float] | None = None,
) -> Interval:
    """Percentile interval of the difference between two models' scores on the same items (a[i] and b[i] are item
    i's scores). Without weights the statistic is mean(a) - mean(b); with weights (bytes per document) it is
    sum(a) / sum(weights) - sum(b) / sum(weights), bits per byte. The resampling is seeded: same inputs, same
    interval."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or not len(x):
        raise ValueError(f"paired_bootstrap: need two equally long, non-empty score lists, got {x.shape}, {y.shape}")
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != x.shape or (w <= 0).any():
        raise ValueError("paired_bootstrap: weights must be positive, one per item")
    diff = x - y
    estimate = float(diff.sum() / w.sum())
    rng = np.random.default_rng(seed)
    stats = []
    for start in range(0, resamples, RESAMPLE_CHUNK):  # in chunks: a test split of many documents stays small
        rows = rng.integers(0, len(x), size=(min(RESAMPLE_CHUNK, resamples - start), len(x)))
        stats.append(diff[rows].sum(axis=1) / w[rows].sum(axis=1))
    tail = (1 - confidence) / 2
    low, high = np.quantile(np.concatenate(stats), [tail, 1 - tail])
    return Interval(estimate, float(low), float(high), len(x), confidence)
