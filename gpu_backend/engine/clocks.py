"""The engine's timeline: a `Clock` the GPU engine reads and advances, either the wall clock
(arrivals in real time) or a virtual clock that advances by each measured step and skips idle
gaps (`--no-wait`)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...
    def advance(self, seconds: float) -> None: ...
    def before(self, seconds: float) -> float: ...


class VirtualClock:
    """Advanced by measured durations only; idle gaps are skipped by `advance_to`."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def before(self, seconds: float) -> float:
        """Now: only measured durations move this clock, so nothing happened since them."""
        return self._now

    def advance_to(self, when_s: float) -> None:
        self._now = max(self._now, when_s)


class WallClock:
    """Seconds since construction (plus an offset); time passes on its own."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._origin = time.perf_counter() - start_s

    def now(self) -> float:
        return time.perf_counter() - self._origin

    def advance(self, seconds: float) -> None:
        pass

    def before(self, seconds: float) -> float:
        """The time `seconds` ago."""
        return self.now() - seconds

    def advance_to(self, when_s: float) -> None:
        delay = when_s - self.now()
        if delay > 0:
            time.sleep(delay)
