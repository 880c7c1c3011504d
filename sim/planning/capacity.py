"""The highest request rate a configuration sustains within its SLOs, found by bisection.

"Sustains" (``Sustain.holds``), at a given rate scale of the trace:

1. SLO attainment >= ``min_attainment`` (0.95): the requests that finished within every
   SLO, divided by all requests. This is "goodput >= 0.95 x offered rate" counted in
   requests, so the drain tail after the last arrival of a finite trace does not bias it.
2. p99 TTFT <= the TTFT SLO (when one is set): overload shows first as a growing queue.

The search assumes the predicate is monotone in the rate (true up to simulation noise):
it brackets the boundary by doubling or halving the rate scale from ``start_scale``, then
bisects geometrically until the bracket is within ``rel_tol``. The answer is the largest
rate scale that was seen to sustain, a lower bound within ``rel_tol`` of the boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from sim.planning.cases import Case, build_trace
from sim.recording.metrics import Slo
from sim.runner import simulate


@dataclass(frozen=True)
class Sustain:
    slo: Slo
    min_attainment: float = 0.95

    def __post_init__(self) -> None:
        if self.slo.ttft_s is None and self.slo.tpot_s is None:
            raise ValueError("a max-rate search needs an SLO (--slo-ttft and/or --slo-tpot): "
                             "without one every rate 'sustains' by finishing eventually")
        if not 0 < self.min_attainment <= 1:
            raise ValueError(f"min_attainment must be in (0, 1], got {self.min_attainment}")

    def holds(self, summary: dict) -> bool:
        if attainment(summary) < self.min_attainment:
            return False
        ttft_p99 = summary["ttft_s"]["p99"]
        return self.slo.ttft_s is None or (ttft_p99 is not None and ttft_p99 <= self.slo.ttft_s)


def attainment(summary: dict) -> float:
    """Share of all requests that finished within every SLO."""
    num_good = summary["goodput_req_s"] * summary["makespan_s"]
    return num_good / summary["num_requests"] if summary["num_requests"] else 0.0


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


def find_max_rate(case: Case, search: RateSearch) -> MaxRate:
    trail: list[tuple[float, bool]] = []

    def sustained(scale: float) -> bool:
        summary = simulate(replace(case, rate_scale=scale).run_spec(),
                           build_trace(case.trace).scaled(scale)).summary
        ok = search.rule.holds(summary)
        trail.append((scale, ok))
        return ok

    low, high = _bracket(sustained, search)
    while low is not None and high is not None and high / low > 1 + search.rel_tol:
        mid = math.sqrt(low * high)
        if sustained(mid):
            low = mid
        else:
            high = mid
    best = low or 0.0
    return MaxRate(best, best * offered_rate_req_s(case), len(trail), high is None, tuple(trail))


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


def search_task(item: tuple[Case, RateSearch]) -> MaxRate:
    """Picklable entry point for `run_parallel`."""
    case, search = item
    return find_max_rate(case, search)
