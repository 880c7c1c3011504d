"""Does a run sustain its load within the SLO targets? The rule, and runs that stop once the
answer is already no.

The rule (`Sustain.check`), on a run's summary:

1. not overloaded: the waiting queue did not grow through the trace (the summary's
   ``overloaded``, `sim.recording.overload`). A growing queue means the TTFT measured is the
   trace's length, not the engine's, and no SLO figure of that run is a prediction;
2. p99 TTFT <= the TTFT target and p99 TPOT <= the TPOT target (each when set);
3. attainment >= ``min_attainment``: the requests that finished within every target, over
   all requests (a rejected or failed request counts against it).

A run that already breaks rule 2 or 3 whatever its remaining requests do stops there
(`run_watched`): failing candidates of a search cost a fraction of a run. Only what has
ended is counted, so a stop is never wrong: p99 is numpy's linear interpolation, and once
``k >= m - floor(0.99 (m - 1))`` of at most ``m`` values exceed a target their p99 does too.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from sim.core.request import RequestState, RequestStatus
from sim.planning.cases import Case
from sim.recording.metrics import ReplicaRecorder, Slo
from sim.runner import simulate
from traces import Trace

P99 = 0.99


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reasons: tuple[str, ...] = ()  # why not (empty when ok)

    @property
    def text(self) -> str:
        return "meets the targets" if self.ok else "; ".join(self.reasons)


@dataclass(frozen=True)
class Sustain:
    slo: Slo
    min_attainment: float = 0.95

    def __post_init__(self) -> None:
        if self.slo.ttft_s is None and self.slo.tpot_s is None:
            raise ValueError("sizing for a load needs an SLO (--slo-ttft and/or --slo-tpot): "
                             "without one every rate 'sustains' by finishing eventually")
        if not 0 < self.min_attainment <= 1:
            raise ValueError(f"min_attainment must be in (0, 1], got {self.min_attainment}")

    def holds(self, summary: dict) -> bool:
        return self.check(summary).ok

    def check(self, summary: dict) -> Verdict:
        """The verdict on a run's summary (or its flattened sweep row)."""
        reasons = []
        if summary.get("overloaded", False):
            reasons.append(overload_text(summary))
        for name, target in (("TTFT", self.slo.ttft_s), ("TPOT", self.slo.tpot_s)):
            p99 = _p99(summary, f"{name.lower()}_s")
            if target is not None and p99 is None and name == "TTFT":
                reasons.append("no request finished")
            elif target is not None and p99 is not None and p99 > target:
                reasons.append(f"{name} p99 {p99:.3g} s > {target:g} s")
        share = attainment(summary)
        if share < self.min_attainment:
            reasons.append(f"{share:.1%} of requests within the SLO < {self.min_attainment:.0%}")
        return Verdict(not reasons, tuple(reasons))

    def describe(self) -> str:
        parts = [f"{name} p99 <= {target:g} s" for name, target in
                 (("TTFT", self.slo.ttft_s), ("TPOT", self.slo.tpot_s)) if target is not None]
        return (", ".join(parts) + f", >= {self.min_attainment:.0%} of requests within them, "
                "and the queue not growing through the trace")


def _p99(summary: dict, metric: str) -> float | None:
    """A run's p99 of `metric`, from its summary or from a sweep row (flattened)."""
    if metric in summary:
        return summary[metric]["p99"]
    return summary.get(f"{metric}_p99")


def attainment(summary: dict) -> float:
    """Share of all requests that finished within every SLO."""
    num_good = summary["goodput_req_s"] * summary["makespan_s"]
    return num_good / summary["num_requests"] if summary["num_requests"] else 0.0


def overload_text(summary: dict) -> str:
    return (f"overloaded: {summary.get('queue_at_last_arrival', 0):,} requests waiting at the "
            f"last arrival, queue growing {summary.get('queue_growth_req_s', 0.0):+.2f} req/s")


def p99_exceeded(num_over: int, num_values: int) -> bool:
    """Is the p99 of at most `num_values` values above a target that `num_over` of them
    exceed? (m - floor(0.99 (m - 1)) never falls as m grows, so the bound at the most values
    holds for fewer.)"""
    return num_values > 0 and num_over >= num_values - math.floor(P99 * (num_values - 1))


class StopRun(Exception):
    """The run already breaks the targets whatever its remaining requests do."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Watch:
    """Counts the requests that ended outside the targets, over every replica of one run."""

    def __init__(self, rule: Sustain, num_requests: int) -> None:
        self.rule, self.num_requests = rule, num_requests
        self.num_ended = self.num_bad = self.num_ttft_over = self.num_tpot_over = 0

    def ended(self, req: RequestState) -> None:
        self.num_ended += 1
        slo = self.rule.slo
        good = req.status is RequestStatus.FINISHED
        if good:
            assert req.first_token_s is not None and req.finish_s is not None
            ttft_s = req.first_token_s - req.arrival_s
            if slo.ttft_s is not None and ttft_s > slo.ttft_s:
                self.num_ttft_over += 1
                good = False
            if req.num_output_tokens > 1 and slo.tpot_s is not None:
                tpot_s = (req.finish_s - req.first_token_s) / (req.num_output_tokens - 1)
                if tpot_s > slo.tpot_s:
                    self.num_tpot_over += 1
                    good = False
        self.num_bad += not good
        self._check()

    def _check(self) -> None:
        n, slo = self.num_requests, self.rule.slo
        if n - self.num_bad < self.rule.min_attainment * n:
            self._stop(f"{self.num_bad:,} requests outside the SLO: attainment "
                       f"< {self.rule.min_attainment:.0%}")
        if slo.ttft_s is not None and p99_exceeded(self.num_ttft_over, n):
            self._stop(f"{self.num_ttft_over:,} requests over the TTFT target: TTFT p99 "
                       f"> {slo.ttft_s:g} s")
        if slo.tpot_s is not None and p99_exceeded(self.num_tpot_over, n):
            self._stop(f"{self.num_tpot_over:,} requests over the TPOT target: TPOT p99 "
                       f"> {slo.tpot_s:g} s")

    def _stop(self, why: str) -> None:
        raise StopRun(f"{why} (stopped after {self.num_ended:,} of {self.num_requests:,} "
                      "requests ended)")


class WatchedRecorder(ReplicaRecorder):
    """A replica recorder that also hands every ended request to a shared `Watch`."""

    def __init__(self, replica_id: int, block_size: int, watch: Watch) -> None:
        super().__init__(replica_id, block_size)
        self.watch = watch

    def done(self, req: RequestState) -> None:
        super().done(req)
        self.watch.ended(req)


@dataclass(frozen=True)
class Trial:
    """One run of a case against the targets: its verdict, and its summary when it ran to
    the end (None when it stopped early)."""

    num_replicas: int
    rate_scale: float
    verdict: Verdict
    summary: dict | None
    wall_s: float

    @property
    def stopped_early(self) -> bool:
        return self.summary is None


def run_watched(case: Case, trace: Trace, rule: Sustain) -> Trial:
    """Simulate `case` over `trace` (already scaled), stopping once the targets are broken."""
    start_s = time.perf_counter()
    watch = Watch(rule, len(trace))
    try:
        result = simulate(case.run_spec(), trace,
                          recorder=lambda replica_id, block_size: WatchedRecorder(
                              replica_id, block_size, watch))
    except StopRun as stop:
        return Trial(case.num_replicas, case.rate_scale, Verdict(False, (stop.reason,)), None,
                     time.perf_counter() - start_s)
    return Trial(case.num_replicas, case.rate_scale, rule.check(result.summary), result.summary,
                 time.perf_counter() - start_s)
