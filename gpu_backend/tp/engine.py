"""TpEngine: the GPU engine's step, with what the ranks measure agreed across the group.

Every rank holds the same scheduler state (same trace, same decisions), so each collective
below is called by every rank at the same point of the same step:

    pause = MAX over ranks of the elastic action's pause   (also a barrier: no rank starts
                                                            the step before all have mapped)
    ids   = forward (collectives inside the model)
    flags = OR over ranks of (real OOM, kernel compiled)   a compile re-runs the step on
                                                            every rank; an OOM fails it on all
    step  = MAX over ranks of the measured step time -> every rank's clock advances by it

Under async scheduling the same agreements are made at the same points (the flags after a
launch, the seconds when a step is collected), and every rank keeps the same step in flight.

Limitation: an OOM raised in the middle of a forward leaves the other ranks waiting inside a
layer's all-reduce; only an OOM before the first collective (or none) is recoverable.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from gpu_backend.engine.clocks import Clock, WallClock
from gpu_backend.engine.engine import GpuEngine
from gpu_backend.tp.group import TpGroup
from sim.core.request import RequestState


@dataclass
class TpEngine(GpuEngine):
    group: TpGroup | None = None

    @classmethod
    def wrap(cls, engine: GpuEngine, group: TpGroup) -> TpEngine:
        return cls(**{f.name: getattr(engine, f.name) for f in fields(GpuEngine) if f.init},
                   group=group)

    def step(self, clock: Clock) -> list[RequestState]:
        if isinstance(clock, WallClock):
            raise ValueError("tensor parallelism needs the virtual clock (--no-wait): wall "
                             "clocks differ across ranks and so would their schedules")
        assert self.group is not None
        return super().step(clock)

    def _agree_seconds(self, seconds: float) -> float:
        """The slowest rank's time: every rank's clock advances by it (also a barrier)."""
        assert self.group is not None
        return self.group.max_float(seconds)

    def _agree_flags(self, oom: bool, compiled: bool) -> tuple[bool, bool]:
        """An OOM or a kernel compile on any rank counts for all of them."""
        assert self.group is not None
        any_oom, any_compiled = self.group.any(oom, compiled)
        return bool(any_oom), bool(any_compiled)
