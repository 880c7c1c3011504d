"""Which stretch of a long trace a search simulates: its busiest run of requests.

A search simulates every candidate it cannot rule out, some several times; over an hour of
the Azure conv trace (19,366 requests) that is minutes per candidate on two cores. So a trace
of more than `max_requests` requests is searched on `max_requests` consecutive requests: the
run whose offered work (the cost model's lower bound on each request's engine seconds,
`sim.planning.bounds`) per second of arrivals is highest. The SLO percentiles of a trace are
set where its load peaks, so a configuration that holds the busiest stretch holds the
quieter ones; the choice errs towards more capacity, never less. The stretch starts on an
idle fleet, as the trace itself does. Every output that used a stretch says which one
(`Stretch.note`), and the searches take `--full-trace` to use every request instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sim.planning.bounds import request_work_s
from sim.planning.cases import Case, TraceSpec, build_trace

DEFAULT_MAX_REQUESTS = 4000


@dataclass(frozen=True)
class Stretch:
    first: int  # first request kept
    last: int  # one past the last
    num_total: int
    start_s: float  # arrival of the first request kept, at rate scale 1
    end_s: float
    work_ratio: float  # its offered work per second over the whole trace's

    @property
    def num_requests(self) -> int:
        return self.last - self.first

    def note(self) -> str:
        return (f"searched on the busiest {self.num_requests:,} of {self.num_total:,} requests "
                f"(numbers {self.first:,}-{self.last - 1:,}, arriving {self.start_s:,.0f}-"
                f"{self.end_s:,.0f} s into the trace at rate x1; offered work "
                f"{self.work_ratio:.2f}x the trace's mean): SLO percentiles are set where the "
                f"load peaks; --full-trace searches every request")


def busiest(work_s: np.ndarray, arrival_s: np.ndarray, num_requests: int) -> int:
    """Index of the first of the `num_requests` consecutive requests with the most work per
    second of arrivals (a stretch's span counts one mean gap more, so no span is zero)."""
    n = len(work_s)
    if num_requests >= n:
        return 0
    gap_s = (arrival_s[-1] - arrival_s[0]) / max(1, n - 1)
    totals = np.concatenate(([0.0], np.cumsum(work_s)))
    sums = totals[num_requests:] - totals[:-num_requests]
    spans = arrival_s[num_requests - 1:] - arrival_s[: n - num_requests + 1] + gap_s
    return int(np.argmax(sums / spans))


def choose_stretch(spec: TraceSpec, case: Case, max_requests: int | None
                   ) -> tuple[TraceSpec, Stretch | None]:
    """`spec` itself when it holds at most `max_requests` requests (or None is given), else
    the spec of its busiest stretch, priced by `case`'s engine, and that stretch."""
    trace = build_trace(spec)
    if max_requests is None or len(trace) <= max_requests:
        return spec, None
    work = request_work_s(case, trace)
    first = busiest(work, trace.arrival_s, max_requests)
    last = first + max_requests
    span_s = float(trace.arrival_s[-1] - trace.arrival_s[0]) or 1.0
    stretch_span_s = float(trace.arrival_s[last - 1] - trace.arrival_s[first]) or 1.0
    ratio = (work[first:last].sum() / stretch_span_s) / (work.sum() / span_s)
    stretch = Stretch(first, last, len(trace), float(trace.arrival_s[first]),
                      float(trace.arrival_s[last - 1]), float(ratio))
    offset = 0 if spec.request_range is None else spec.request_range[0]
    return replace(spec, request_range=(offset + first, offset + last)), stretch
