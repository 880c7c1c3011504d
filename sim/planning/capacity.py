"""The highest request rate a configuration sustains within its SLOs, found by bisection.

"Sustains" is `sim.planning.sustain.Sustain`: at a given rate scale of the trace the queue
does not grow through it, p99 TTFT and TPOT are within their targets, and at least
``min_attainment`` (0.95) of all requests finish within every target ("goodput >= 0.95 x
offered rate" counted in requests, so the drain tail after the last arrival of a finite
trace does not bias it). A run stops as soon as it cannot sustain (`run_watched`).

The search assumes the predicate is monotone in the rate (true up to simulation noise):
it brackets the boundary by doubling or halving the rate scale from ``start_scale``, then
bisects geometrically until the bracket is within ``rel_tol``. The answer is the largest
rate scale that was seen to sustain, a lower bound within ``rel_tol`` of the boundary.
Scales already run (the plan's own run) are not run again, and a scale above the
throughput bound's ceiling (`sim.planning.bounds.WorkBound.max_rate_scale`) is known to fail
without a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from sim.planning.cases import Case, build_trace
from sim.planning.sustain import Sustain, run_watched

__all__ = ["MaxRate", "RateSearch", "Sustain", "find_max_rate", "offered_rate_req_s",
           "search_task"]


@dataclass(frozen=True)
class RateSearch:
    rule: Sustain
    start_scale: float = 1.0
    rel_tol: float = 0.05
    min_scale: float = 1 / 64
    max_scale: float = 64.0

    def __post_init__(self) -> None:
        if not 0 < self.min_scale <= self.start_scale <= self.max_scale:
            raise ValueError("need 0 < min_scale <= start_scale <= max_scale")
        if not self.rel_tol > 0:
            raise ValueError("rel_tol must be > 0")


@dataclass(frozen=True)
class MaxRate:
    """Result of a search; ``max_rate_scale`` is 0 when even ``min_scale`` fails."""

    max_rate_scale: float
    max_rate_req_s: float
    num_runs: int
    above_range: bool  # sustained even at max_scale: the true maximum is higher
    trail: tuple[tuple[float, bool], ...] = field(default=())  # (rate scale, sustained)

    def as_row(self) -> dict:
        return {"max_rate_scale": self.max_rate_scale, "max_rate_req_s": self.max_rate_req_s,
                "max_rate_runs": self.num_runs, "max_rate_above_range": self.above_range}


def find_max_rate(case: Case, search: RateSearch, known: dict[float, bool] | None = None,
                  ceiling_scale: float | None = None) -> MaxRate:
    """The search; `known`: rate scales already judged (sustained or not); `ceiling_scale`:
    above it nothing sustains (the throughput bound)."""
    trail: list[tuple[float, bool]] = []
    seen = dict(known or {})
    num_runs = 0

    def sustained(scale: float) -> bool:
        nonlocal num_runs
        if scale not in seen:
            if ceiling_scale is not None and scale > ceiling_scale:
                seen[scale] = False
            else:
                num_runs += 1
                trace = build_trace(case.trace).scaled(scale)
                seen[scale] = run_watched(replace(case, rate_scale=scale), trace,
                                          search.rule).verdict.ok
        trail.append((scale, seen[scale]))
        return seen[scale]

    low, high = _bracket(sustained, search)
    while low is not None and high is not None and high / low > 1 + search.rel_tol:
        mid = math.sqrt(low * high)
        if sustained(mid):
            low = mid
        else:
            high = mid
    best = low or 0.0
    return MaxRate(best, best * offered_rate_req_s(case), num_runs, high is None, tuple(trail))


def _bracket(sustained, search: RateSearch) -> tuple[float | None, float | None]:
    """(a sustained scale, a failed scale one doubling above it); None where out of range."""
    scale = search.start_scale
    if sustained(scale):
        while scale * 2 <= search.max_scale:
            if not sustained(scale * 2):
                return scale, scale * 2
            scale *= 2
        return scale, None
    while scale / 2 >= search.min_scale:
        if sustained(scale / 2):
            return scale / 2, scale
        scale /= 2
    return None, scale


def offered_rate_req_s(case: Case) -> float:
    """Mean arrival rate of the case's trace at rate scale 1."""
    return float(build_trace(case.trace).describe()["rate_per_s"])


def search_task(item: tuple[Case, RateSearch, dict[float, bool], float | None]) -> MaxRate:
    """Picklable entry point for `run_parallel`."""
    case, search, known, ceiling_scale = item
    return find_max_rate(case, search, known, ceiling_scale)
