"""TpEngine: the GPU engine's step, with what the ranks measure agreed across the group.

Every rank holds the same scheduler state (same trace, same decisions), so each collective
below is called by every rank at the same point of the same step:

    pause = MAX over ranks of the elastic action's pause   (also a barrier: no rank starts
                                                            the step before all have mapped)
    ids   = forward (collectives inside the model)
    flags = OR over ranks of (real OOM, kernel compiled)   a compile re-runs the step on
                                                            every rank; an OOM fails it on all
    step  = MAX over ranks of the measured step time -> every rank's clock advances by it

Limitation: an OOM raised in the middle of a forward leaves the other ranks waiting inside a
layer's all-reduce; only an OOM before the first collective (or none) is recoverable.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from gpu_backend.engine.engine import Clock, GpuEngine, WallClock
from gpu_backend.tp.group import TpGroup
from sim.core.request import RequestState
from sim.core.step import SchedulerOutput


@dataclass
class TpEngine(GpuEngine):
    group: TpGroup | None = None

    @classmethod
    def wrap(cls, engine: GpuEngine, group: TpGroup) -> TpEngine:
        return cls(**{f.name: getattr(engine, f.name) for f in fields(GpuEngine)}, group=group)

    def step(self, clock: Clock) -> list[RequestState]:
        if isinstance(clock, WallClock):
            raise ValueError("tensor parallelism needs the virtual clock (--no-wait): wall "
                             "clocks differ across ranks and so would their schedules")
        assert self.group is not None
        out = self.scheduler.schedule()
        if out.elastic is not None:
            pause_start_s = clock.now()
            pause_s = self.group.max_float(self.elastic.apply(out))
            self.recorder.elastic(pause_start_s, out.elastic, pause_s)
            clock.advance(pause_s)
        self.mirror.apply(out, self.prompt_len)
        start_s = clock.now()
        out, duration_s, graph = self._run(out)
        duration_s = self.group.max_float(duration_s)
        clock.advance(duration_s)
        finished = self.scheduler.update(out, clock.now())
        self.mirror.finish(r.request_id for r in finished)
        self.recorder.step(start_s, out, np.array([duration_s]))
        self._record_step(out, start_s, duration_s, graph)
        return finished

    def _run(self, out: SchedulerOutput) -> tuple[SchedulerOutput, float, bool]:
        assert self.group is not None
        start = self.timer()
        if not out.scheduled:
            return out, self.timer() - start, False
        self.elastic.ensure_mapped(out)
        batch = self.mirror.build(out)
        self._check_mapped(batch.block_tables)
        graph = bool(getattr(self.runner, "graphs", None)) and batch.is_decode_only
        ids, oom = None, False
        try:
            ids = self.runner.execute(batch)
        except self.oom_errors:
            oom = True
        end = self.timer()
        compiled = getattr(self.runner, "compiled_since_last_call", bool)()
        any_oom, any_compiled = self.group.any(oom, compiled)
        if any_oom:
            return self._fail_step(out), end - start, False
        if any_compiled:  # a JIT compile is no part of the step: every rank re-runs it
            start = self.timer()
            ids = self.runner.execute(batch)
            end = self.timer()
        self.mirror.append_sampled(batch.sample_request_ids, ids)
        return out, end - start, graph
