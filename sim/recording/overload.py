"""Is the engine keeping up with the trace? The waiting queue each arrival finds, and its trend.

An engine that serves requests slower than they arrive has a waiting queue that grows for as
long as the trace lasts; its TTFT then measures the trace's length, not the engine, and must
not be read as a prediction. The rule, per replica:

    samples    the waiting queue (requests arrived, not yet admitted; preempted ones
               included) that each arriving request finds, itself excluded. A bounded store
               keeps every k-th arrival (k doubles whenever MAX_SAMPLES are held), so the
               samples stay evenly spread over the arrivals.
    window     the second half of the replica's arrival span: [t_mid, t_last], t_mid the
               midpoint of its first and last arrival.
    growth     the least-squares slope of queue length against arrival time over the samples
               in the window, in requests per second (0 with fewer than 3 samples there or a
               window of no length).
    at end     the queue the last arrival found.

    overloaded  growth x window length >= max(MIN_REQUESTS, GROWTH_SHARE x arrivals in the
                window)   -- the queue grew by at least 5% of what arrived meanwhile, i.e.
                arrivals outpaced service by 5% or more through the second half --
                or  at end >= max(MIN_REQUESTS, END_SHARE x all arrivals)   -- a tenth of
                the trace was still waiting when its last request came.

Arrivals in the window are counted from the samples (each stands for k arrivals). A fleet is
overloaded when any replica is; its queue at end and growth are the replicas' sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_SAMPLES = 4096
MIN_REQUESTS = 10  # a queue this short is noise whatever the trace
GROWTH_SHARE = 0.05
END_SHARE = 0.10


@dataclass(frozen=True)
class QueueTrend:
    overloaded: bool
    queue_at_last_arrival: int
    growth_req_s: float


class QueueSamples:
    """The waiting queue found by every k-th arrival, at most MAX_SAMPLES of them."""

    def __init__(self) -> None:
        self.num_arrivals = 0
        self.every = 1
        self.times_s: list[float] = []
        self.lengths: list[int] = []
        self.first_s: float | None = None
        self.last_s = 0.0
        self.last_length = 0

    def add(self, now_s: float, num_waiting: int) -> None:
        if self.first_s is None:
            self.first_s = now_s
        self.last_s, self.last_length = now_s, num_waiting
        if self.num_arrivals % self.every == 0:
            self.times_s.append(now_s)
            self.lengths.append(num_waiting)
            if len(self.times_s) > MAX_SAMPLES:
                self.times_s, self.lengths = self.times_s[::2], self.lengths[::2]
                self.every *= 2
        self.num_arrivals += 1

    def trend(self) -> QueueTrend:
        if self.first_s is None:
            return QueueTrend(False, 0, 0.0)
        mid_s = (self.first_s + self.last_s) / 2
        window_s = self.last_s - mid_s
        times = np.array(self.times_s)
        in_window = times >= mid_s
        growth = 0.0
        if window_s > 0 and in_window.sum() >= 3:
            t = times[in_window]
            q = np.array(self.lengths, dtype=np.float64)[in_window]
            spread = ((t - t.mean()) ** 2).sum()
            if spread > 0:
                growth = float(((t - t.mean()) * (q - q.mean())).sum() / spread)
        arrivals_in_window = int(in_window.sum()) * self.every
        grew = growth * window_s >= max(MIN_REQUESTS, GROWTH_SHARE * arrivals_in_window)
        backlog = self.last_length >= max(MIN_REQUESTS, END_SHARE * self.num_arrivals)
        return QueueTrend(bool(grew or backlog), self.last_length, growth)


def fleet_trend(trends: Sequence[QueueTrend]) -> dict:
    """The summary's overload fields for a fleet of replicas."""
    return {
        "overloaded": any(t.overloaded for t in trends),
        "queue_at_last_arrival": sum(t.queue_at_last_arrival for t in trends),
        "queue_growth_req_s": float(sum(t.growth_req_s for t in trends)),
    }
