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
        f"p{p}": float(values[min(np.searchsorted(cumulative, p / 100.0), values.size - 1)])
        for p in PERCENTILES
    }
    result["mean"] = float(np.average(values, weights=weights))
    return result


class WeightedSample:
    """Positive values with weights: exact up to `capacity` values, then a log histogram."""

    def __init__(self, capacity: int = EXACT_STEPS) -> None:
        self.capacity = capacity
        self._values = np.empty(min(capacity, 4096))
        self._weights = np.empty(self._values.size)
        self._size = 0
        self._histogram: np.ndarray | None = None
        self._weighted_sum = 0.0
        self._total_weight = 0.0

    def add(self, values: np.ndarray, weight: float) -> None:
        """Values sharing one weight (a decode run's step durations)."""
        end = self._size + values.size
        if end > self._values.size:
            self._make_room(values.size)
            end = self._size + values.size
        self._values[self._size:end] = values
        self._weights[self._size:end] = weight
        self._size = end

    def _make_room(self, num_values: int) -> None:
        needed = self._size + num_values
        if needed <= self.capacity:
            size = max(needed, min(self.capacity, 2 * self._values.size))
            self._values = np.resize(self._values, size)
            self._weights = np.resize(self._weights, size)
            return
        self._fold()
        if num_values > self._values.size:
            self._values = np.empty(num_values)
            self._weights = np.empty(num_values)

    def _fold(self) -> None:
        """Move the exact values into the histogram."""
        if self._histogram is None:
            self._histogram = np.zeros(_NUM_BUCKETS)
        values, weights = self._values[:self._size], self._weights[:self._size]
        index = np.ceil(np.log(np.clip(values, MIN_S, MAX_S)) / _LOG_GAMMA) - _FIRST_BUCKET
        self._histogram += np.bincount(index.astype(np.int64), weights, _NUM_BUCKETS)
        self._weighted_sum += float(values @ weights)
        self._total_weight += float(weights.sum())
        self._size = 0

    @property
    def is_exact(self) -> bool:
        return self._histogram is None

    def exact_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self._values[:self._size], self._weights[:self._size]


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
    for s in samples:
        s._fold()
        if s._histogram is not None:
            histogram += s._histogram
        weighted_sum += s._weighted_sum
        total += s._total_weight
    cumulative = np.cumsum(histogram) / total
    result: dict[str, float | None] = {}
    for p in PERCENTILES:
        bucket = int(min(np.searchsorted(cumulative, p / 100.0), _NUM_BUCKETS - 1))
        # the bucket (gamma^(i-1), gamma^i] is represented within RELATIVE_ACCURACY
        result[f"p{p}"] = 2.0 * _GAMMA ** (bucket + _FIRST_BUCKET) / (_GAMMA + 1.0)
    result["mean"] = weighted_sum / total
    return result
