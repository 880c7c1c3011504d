"""Predicted vs measured: the metrics compared, their relative errors, gains and targets.

The gain is what a user decides on ("elastic buys 18% throughput at chunk 8192"), so next to
each metric's error we compare the predicted and measured *gain* of elastic over static at
the same chunk, and of elastic over static at every smaller chunk (the alternative: shrink
the chunk and keep the reserve static).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.recording.outputs import slug
from validation.metrics import METRICS

if TYPE_CHECKING:
    from validation.runs import RunSummary

NO_CHANGE_BELOW = 0.01  # a gain smaller than 1% counts as "no change" when directions are compared
GAIN_METRICS = ("kv_capacity_tokens", "throughput_tok_s", "ttft_p50_s", "ttft_p99_s",
                "tpot_p50_s", "num_preemptions")


@dataclass(frozen=True)
class Target:
    metric: str
    limit: float  # largest acceptable |relative error|
    aggregate: str  # "median" or "max" of |relative error| over runs
    measure: str = "relative"  # or "points": |predicted - measured| of a share, not relative


TARGETS = (
    Target("ttft_p50_s", 0.05, "median"),
    Target("tpot_p50_s", 0.05, "median"),
    Target("throughput_tok_s", 0.05, "median"),
    Target("ttft_p99_s", 0.10, "median"),
    Target("kv_capacity_tokens", 0.02, "max"),
    # the activation reserve as a share of the KV pool: within 2 percentage points
    Target("reserve_share", 0.02, "max", "points"),
)


def format_target_value(value: float, measure: str) -> str:
    return f"{value * 100:.2f} pp" if measure == "points" else f"{value:.1%}"


def summary_metric(summary: dict, key: str, sub: str | None) -> float | None:
    value = summary.get(key)
    if sub is not None:
        value = value.get(sub) if isinstance(value, dict) else None
    return None if value is None else float(value)


def metric_values(summary: dict, measured_kv_tokens: float | None = None) -> dict[str, float | None]:
    """Every METRICS value of one summary; `measured_kv_tokens` replaces the KV capacity."""
    values = {name: summary_metric(summary, key, sub) for name, key, sub, _ in METRICS}
    if measured_kv_tokens is not None:
        values["kv_capacity_tokens"] = measured_kv_tokens
    return values


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / |measured|; 0 when both are 0; None when either is missing
    or only the measured value is 0 (report the difference instead)."""
    if predicted is None or measured is None:
        return None
    if measured == 0:
        return 0.0 if predicted == 0 else None
    return (predicted - measured) / abs(measured)


def compare_metrics(predicted: dict[str, float | None],
                    measured: dict[str, float | None]) -> dict[str, dict]:
    """Per metric: predicted, measured, absolute difference and relative error."""
    rows = {}
    for name, *_ in METRICS:
        p, m = predicted.get(name), measured.get(name)
        rows[name] = {"predicted": p, "measured": m,
                      "difference": None if p is None or m is None else p - m,
                      "relative_error": relative_error(p, m)}
    return rows


def median_steepness(values: np.ndarray, width: float = 5.0) -> float | None:
    """(p[50 + width] - p[50 - width]) / p50 of `values`: how far the median moves when the
    requests shift by `width` percent of the distribution. A TTFT p50 that sits between two
    groups of requests (those that wait behind a long prefill step and those that do not) has
    a steep neighbourhood, and a small step-time error moves it by many times as much. None
    for fewer than two values or a zero median."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size < 2:
        return None
    low, mid, high = np.percentile(values, [50.0 - width, 50.0, 50.0 + width])
    return float((high - low) / mid) if mid else None


def gain(value: float | None, base: float | None) -> float | None:
    """Relative change of `value` over `base` ((value - base) / |base|)."""
    return relative_error(value, base)


def direction(relative_gain: float) -> int:
    """+1 or -1 for a change of at least NO_CHANGE_BELOW, else 0 (no decision either way)."""
    if abs(relative_gain) < NO_CHANGE_BELOW:
        return 0
    return 1 if relative_gain > 0 else -1


@dataclass(frozen=True)
class RunPair:
    """One configuration's predicted and measured metric values."""

    policy: str
    chunk: int
    predicted: dict[str, float | None]
    measured: dict[str, float | None]


def gains(pairs: Sequence[RunPair]) -> list[dict]:
    """Predicted vs measured gain of elastic over static, same chunk and every smaller one."""
    by_key = {(p.policy, p.chunk): p for p in pairs}
    rows = []
    for (policy, chunk), run in sorted(by_key.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if policy != "elastic":
            continue
        for (base_policy, base_chunk), base in sorted(by_key.items(), key=lambda kv: kv[0][1]):
            if base_policy != "static" or base_chunk > chunk:
                continue
            rows.append(_gain_row(run, base))
    return rows


def _gain_row(run: RunPair, base: RunPair) -> dict:
    metrics = {}
    for name in GAIN_METRICS:
        predicted = gain(run.predicted.get(name), base.predicted.get(name))
        measured = gain(run.measured.get(name), base.measured.get(name))
        same_sign = None
        if predicted is not None and measured is not None:
            same_sign = direction(predicted) == direction(measured)
        metrics[name] = {
            "predicted_gain": predicted, "measured_gain": measured,
            "gain_error": None if predicted is None or measured is None else predicted - measured,
            "same_direction": same_sign,
        }
    return {"run": f"{run.policy}/chunk={run.chunk}",
            "baseline": f"{base.policy}/chunk={base.chunk}", "metrics": metrics}


def mark_replayed_apart(gains: list[dict], apart: Sequence[str],
                        starts: Mapping[str, str | None] | None = None) -> None:
    """Mark each gain whose run and baseline ran on different starts of the machine: one of
    them in `apart` (slice.json) and the other not, or both with a recorded start
    (`starts`: a run's label -> its summary's measured.machine_start) and the two differ. Its
    replay pairs compare two hosts, so they settle nothing (validation.table.replay_gains)."""
    starts = starts or {}
    for g in gains:
        run, base = starts.get(g["run"]), starts.get(g["baseline"])
        # a run's folder under runs/ is its label's slug, as a replay names it
        if ((slug(g["run"]) in apart) != (slug(g["baseline"]) in apart)
                or (run is not None and base is not None and run != base)):
            g["replayed_apart"] = True


def machine_start(summary: Mapping) -> str | None:
    """The start of the machine a replay's summary recorded (None before replays did)."""
    return (summary.get("measured") or {}).get("machine_start")


def machine_starts(runs: Sequence[RunSummary]) -> dict[str, str | None]:
    """Each run's start of the machine, as its replay recorded it (`machine_start`)."""
    return {r.label: machine_start(r.summary) for r in runs}


def check_targets(per_run: Sequence[dict[str, dict]]) -> list[dict]:
    """Pass/fail per target over the runs' relative errors (missing values fail, not pass)."""
    results = []
    for target in TARGETS:
        field = "difference" if target.measure == "points" else "relative_error"
        errors = [run.get(target.metric, {}).get(field) for run in per_run]
        finite = [abs(e) for e in errors if e is not None]
        head = {"metric": target.metric, "aggregate": target.aggregate, "limit": target.limit,
                "measure": target.measure}
        if not finite:
            results.append({**head, "value": None, "passed": False,
                            "note": "no measured value to compare"})
            continue
        value = float(np.median(finite) if target.aggregate == "median" else max(finite))
        note = f"{len(errors) - len(finite)} run(s) without a value" if len(finite) < len(errors) else ""
        results.append({**head, "value": value, "passed": value <= target.limit, "note": note})
    return results
