"""Bounded-memory value stores for a run's percentiles.

`FloatColumn` holds one float per finished request (TTFT, TPOT, end-to-end) as float64
chunks: 8 bytes a request, so 10M requests keep 240 MB for the three, and their percentiles
stay exact.

`WeightedSample` holds the inter-token latency: every decode step's duration, weighted by the
decode tokens it produced. A long run has tens of millions of steps, so it keeps them exactly
only up to `EXACT_STEPS` per replica; past that it folds them into a log-bucketed histogram
(as DDSketch does) whose percentiles are within `RELATIVE_ACCURACY` (0.1%) of the exact
weighted percentile, for durations between `MIN_S` and `MAX_S` (others are clamped into the
end buckets). Its mean stays exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

PERCENTILES = (50, 90, 99)
EXACT_STEPS = 1 << 21  # 2M steps: 32 MB of values and weights per replica
RELATIVE_ACCURACY = 1e-3
MIN_S, MAX_S = 1e-9, 1e6
_GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
_FIRST_BUCKET = math.floor(math.log(MIN_S) / _LOG_GAMMA)
_NUM_BUCKETS = math.ceil(math.log(MAX_S) / _LOG_GAMMA) - _FIRST_BUCKET + 1
_CHUNK = 1 << 16


class FloatColumn:
    """Append-only float64 values, kept as arrays of `_CHUNK` values."""

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._pending: list[float] = []

    def append(self, value: float) -> None:
        self._pending.append(value)
        if len(self._pending) >= _CHUNK:
            self._chunks.append(np.array(self._pending, dtype=np.float64))
            self._pending = []

    def array(self) -> np.ndarray:
        if self._pending:
            self._chunks.append(np.array(self._pending, dtype=np.float64))
            self._pending = []
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros(0)


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    result: dict[str, float | None] = {
        f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES))
    }
    result["mean"] = float(values.mean())
    return result


def weighted_percentiles(values: np.ndarray, weights: np.ndarray) -> dict[str, float | None]:
    """The smallest value whose cumulative weight share reaches each percentile."""
    if values.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    order = np.argsort(values)
    values, weights = values[order], weights[order]
    cumulative = np.cumsum(weights) / weights.sum()
    result: dict[str, float | None] = {
        f"p{p}": float(values[min(int(np.searchsorted(cumulative, p / 100.0)), values.size - 1)])
        for p in PERCENTILES
    }
    result["mean"] = float(np.average(values, weights=weights))
    return result


class WeightedSample:
    """Positive values with weights: exact up to `capacity` values, then a log histogram.

    Values arrive a few at a time (a step, or a decode run's steps) and wait in Python lists,
    which take them far cheaper than a numpy array does, until a block of them is folded into
    arrays (or into the histogram)."""

    def __init__(self, capacity: int = EXACT_STEPS) -> None:
        self.capacity = capacity
        self._values: list[float] = []  # pending
        self._weights: list[float] = []  # pending, one per add()
        self._counts: list[int] = []  # pending, values per add()
        self._exact: list[tuple[np.ndarray, np.ndarray]] = []
        self._num_exact = 0
        self._histogram: np.ndarray | None = None
        self._weighted_sum = 0.0
        self._total_weight = 0.0

    def add(self, values: list[float], weight: float) -> None:
        """Values (Python floats) sharing one weight (a decode run's step durations)."""
        self._values += values
        self._weights.append(weight)
        self._counts.append(len(values))
        if len(self._values) >= _CHUNK:
            self._flush()

    def _flush(self) -> None:
        if not self._values:
            return
        values = np.array(self._values, dtype=np.float64)
        weights = np.repeat(np.array(self._weights, dtype=np.float64), self._counts)
        self._values, self._weights, self._counts = [], [], []
        if self._histogram is None and self._num_exact + values.size <= self.capacity:
            self._exact.append((values, weights))
            self._num_exact += values.size
            return
        for held_values, held_weights in self._exact:
            self._fold(held_values, held_weights)
        self._exact, self._num_exact = [], 0
        self._fold(values, weights)

    def _fold(self, values: np.ndarray, weights: np.ndarray) -> None:
        if self._histogram is None:
            self._histogram = np.zeros(_NUM_BUCKETS)
        index = np.ceil(np.log(np.clip(values, MIN_S, MAX_S)) / _LOG_GAMMA) - _FIRST_BUCKET
        self._histogram += np.bincount(index.astype(np.int64), weights, _NUM_BUCKETS)
        self._weighted_sum += float((values * weights).sum())  # no BLAS threads for this
        self._total_weight += float(weights.sum())

    @property
    def is_exact(self) -> bool:
        self._flush()
        return self._histogram is None

    def exact_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        self._flush()
        if len(self._exact) > 1:
            self._exact = [(np.concatenate([v for v, _ in self._exact]),
                            np.concatenate([w for _, w in self._exact]))]
        return self._exact[0] if self._exact else (np.zeros(0), np.zeros(0))

    def folded(self) -> tuple[np.ndarray, float, float]:
        """(histogram, sum of value x weight, sum of weights), every value folded in."""
        self._flush()
        for values, weights in self._exact:
            self._fold(values, weights)
        self._exact, self._num_exact = [], 0
        if self._histogram is None:
            self._histogram = np.zeros(_NUM_BUCKETS)
        return self._histogram, self._weighted_sum, self._total_weight


def merged_percentiles(samples: Sequence[WeightedSample]) -> dict[str, float | None]:
    """Weighted percentiles over several samples: exact while every one of them is."""
    if all(s.is_exact for s in samples):
        pairs = [s.exact_arrays() for s in samples]
        if not pairs:
            return weighted_percentiles(np.zeros(0), np.zeros(0))
        return weighted_percentiles(np.concatenate([v for v, _ in pairs]),
                                    np.concatenate([w for _, w in pairs]))
    histogram = np.zeros(_NUM_BUCKETS)
    weighted_sum = total = 0.0
    for sample in samples:
        counts, sample_sum, sample_total = sample.folded()
        histogram += counts
        weighted_sum += sample_sum
        total += sample_total
    cumulative = np.cumsum(histogram) / total
    result: dict[str, float | None] = {}
    for p in PERCENTILES:
        bucket = min(int(np.searchsorted(cumulative, p / 100.0)), _NUM_BUCKETS - 1)
        # the bucket (gamma^(i-1), gamma^i] is represented within RELATIVE_ACCURACY
        result[f"p{p}"] = 2.0 * _GAMMA ** (bucket + _FIRST_BUCKET) / (_GAMMA + 1.0)
    result["mean"] = weighted_sum / total
    return result
