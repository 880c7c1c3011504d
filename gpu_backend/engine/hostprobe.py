"""The host CPU's speed, measured now and then: a fixed pure-Python loop, timed.

Launch-bound steps (every eager step; a small model's decode steps) take what the host takes
to launch them. On one H200 host this loop took 7.0 ms at one time and 9-14 ms at another,
minutes apart, and an eager step's enqueue time followed it (`benchmarks/host_noise.py`). A
replay on the virtual clock and a calibration profile each record it, so a validation can say
whether the host ran as fast during the replay as during the profile.
"""

from __future__ import annotations

import time

from sim.core.calibration.merge import summarize_host_probe

PROBE_ITERATIONS = 200_000


def probe() -> float:
    """Seconds of a fixed pure-Python loop: the host CPU's speed at this moment."""
    start = time.perf_counter()
    total = 0
    for i in range(PROBE_ITERATIONS):
        total += i & 7
    return time.perf_counter() - start


class HostProbe:
    """Runs `probe()` at most once per `every_s` of wall time, between steps (never inside a
    timed step); `summary()` for summary.json / the calibration."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._next_s = time.perf_counter()

    def maybe(self) -> None:
        now = time.perf_counter()
        if now >= self._next_s:
            self.samples.append(probe())
            self._next_s = now + self.every_s

    def summary(self) -> dict:
        return summarize(self.samples)


def summarize(samples: list[float]) -> dict:
    return summarize_host_probe(samples, PROBE_ITERATIONS)
