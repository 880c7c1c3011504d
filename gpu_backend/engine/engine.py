"""The GPU engine's step: schedule, elastic action, forward, update, record.

    out = scheduler.schedule()          the shared core decides (incl. the elastic action)
    stats = scheduler.make_stats()      pool usage and activation need, apart from the output
    pause = elastic.apply(out)          map / migrate + unmap on the real pool, timed
    mirror.apply(out); batch = build    executor-side block tables and token ids
    ids = runner.execute(batch)         eager or CUDA graph; a real OOM fails the step's requests
    scheduler.update(out, end_s)        the same close as the simulator's; a real OOM is
                                        reported to the scheduler (fail_oom), never written
                                        into the output

Time comes from a `Clock`: the wall clock (arrivals in real time) or a virtual clock that
advances by each measured step and skips idle gaps (`--no-wait`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpu_backend.engine.elastic import ElasticExecutor
from gpu_backend.engine.inputs import BlockTableError, RequestMirror
from gpu_backend.engine.prompts import PromptSpec
from sim.core.engine_config import EngineCore
from sim.core.request import RequestState, RequestStatus
from sim.core.step import OutOfMemory, SchedulerOutput, SchedulerStats
from sim.recording.metrics import ReplicaRecorder

STEP_COLUMNS = ("step_id", "start_s", "num_prefill_tokens", "num_decode_tokens",
                "decode_context_tokens", "num_seqs", "measured_s", "graph", "lent_blocks",
                "mapped_elastic_bytes", "oom", "num_sampled_rows", "max_decode_context",
                "prefill_chunks", "build_s", "enqueue_s", "device_s")
# build_s: the host batch built (and the elastic mapping checked) inside measured_s;
# enqueue_s / device_s: the runner's StepPhases (host enqueue time, device span; NaN unknown).


class Clock(Protocol):
    def now(self) -> float: ...
    def advance(self, seconds: float) -> None: ...


class VirtualClock:
    """Advanced by measured durations only; idle gaps are skipped by `advance_to`."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

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

    def advance_to(self, when_s: float) -> None:
        delay = when_s - self.now()
        if delay > 0:
            time.sleep(delay)


@dataclass
class GpuEngine:
    core: EngineCore
    runner: object  # ModelRunner or anything with execute(HostBatch) -> np.ndarray
    mirror: RequestMirror
    elastic: ElasticExecutor
    recorder: ReplicaRecorder
    oom_errors: tuple[type[BaseException], ...] = (MemoryError,)  # torch.OutOfMemoryError on GPU
    on_oom: Callable[[], None] | None = None  # e.g. torch.cuda.empty_cache
    steps: list[tuple] = field(default_factory=list)
    prompt_len: dict[int, int] = field(default_factory=dict)
    num_real_oom: int = 0
    timer: Callable[[], float] = time.perf_counter  # measures each step (tests inject one)
    _phases: tuple[float, float, float] = field(default=(math.nan,) * 3, init=False, repr=False)

    @property
    def scheduler(self):
        return self.core.scheduler

    def add_request(self, state: RequestState) -> bool:
        """Queue a request; False if the scheduler rejected it.

        A request with block hashes gets its prompt ids from them (`PromptSpec`), so that a
        prefix-cache hit reads KV another request wrote for the same tokens; registering it
        here, with the scheduler, means no caller can queue one and forget it."""
        self.prompt_len[state.request_id] = state.num_prompt_tokens
        num_waiting = len(self.scheduler.waiting)
        accepted = self.scheduler.add_request(state)
        self.recorder.arrival(state.arrival_s, state, num_waiting)
        if accepted and state.block_hashes:
            self.mirror.add_prompt(state.request_id, PromptSpec(
                state.num_prompt_tokens, state.block_hashes,
                self.core.config.hash_block_tokens))
        return accepted

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self, clock: Clock) -> list[RequestState]:
        """Run one scheduler step at `clock`; returns the requests that finished."""
        out = self.scheduler.schedule()
        stats = self.scheduler.make_stats()
        if out.elastic is not None:
            pause_start_s = clock.now()
            pause_s = self._agree_seconds(self.elastic.apply(out))
            self.recorder.elastic(pause_start_s, out.elastic, pause_s)
            clock.advance(pause_s)
        self.mirror.apply(out, self.prompt_len)
        start_s = clock.now()
        duration_s, graph, failed = self._run(out, stats)
        duration_s = self._agree_seconds(duration_s)
        clock.advance(duration_s)
        end_s = clock.now()
        duration_s = end_s - start_s if isinstance(clock, WallClock) else duration_s
        ended = self.scheduler.update(out, end_s)
        finished = [r for r in ended if r.status is RequestStatus.FINISHED]
        self.mirror.finish(r.request_id for r in finished)
        for req in ended:
            self.recorder.done(req)
        self.recorder.step(start_s, out, stats, [duration_s], failed)
        self._record_step(out, stats, start_s, duration_s, graph, failed)
        return finished

    # Agreement points: one GPU agrees with itself; the TP engine reduces over its ranks.
    def _agree_seconds(self, seconds: float) -> float:
        return seconds

    def _agree_flags(self, oom: bool, compiled: bool) -> tuple[bool, bool]:
        return oom, compiled

    def _run(self, out: SchedulerOutput,
             stats: SchedulerStats) -> tuple[float, bool, OutOfMemory | None]:
        """(seconds, ran as a CUDA graph?, the out-of-memory that failed the step or None)."""
        start = self.timer()
        self._phases = (math.nan, math.nan, math.nan)
        if not out.scheduled:
            return self.timer() - start, False, None
        build_start = time.perf_counter()  # phases: wall-clock diagnostics beside the timer
        self.elastic.ensure_mapped(out)
        batch = self.mirror.build(out, stats.num_usable_blocks)
        self._check_mapped(batch.block_tables)
        build_s = time.perf_counter() - build_start
        graph = bool(getattr(self.runner, "graphs", None)) and batch.is_decode_only
        ids, oom = self._execute(batch)
        end = self.timer()
        compiled = getattr(self.runner, "compiled_since_last_call", bool)()
        oom, compiled = self._agree_flags(oom, compiled)
        if compiled and not oom:  # a JIT compile is no part of the step: time a re-run
            start = self.timer()
            ids, oom = self._execute(batch)  # idempotent: same KV writes, same ids
            end = self.timer()
            oom, _ = self._agree_flags(oom, False)
        phases = getattr(self.runner, "phases", None)
        self._phases = (build_s, getattr(phases, "enqueue_s", math.nan),
                        getattr(phases, "device_s", math.nan))
        if oom:
            return end - start, False, self._fail_step(out, stats)
        self.mirror.append_sampled(batch.sample_request_ids, ids)
        return end - start, graph, None

    def _execute(self, batch):
        """(sampled ids, False), or (None, True) when the GPU ran out of memory."""
        try:
            return self.runner.execute(batch), False
        except self.oom_errors:
            return None, True

    def _check_mapped(self, tables: np.ndarray) -> None:
        mapped = self.elastic.num_mapped_device_blocks
        if tables.size and int(tables.max()) >= mapped:
            raise BlockTableError(f"a block table points at device block {int(tables.max())} but "
                                  f"only blocks below {mapped} are mapped")

    def _fail_step(self, out: SchedulerOutput, stats: SchedulerStats) -> OutOfMemory:
        """A real out-of-memory the activation model did not predict: the scheduler fails the
        step's requests (the output stays as it was scheduled)."""
        if self.on_oom is not None:
            self.on_oom()
        failed = tuple(s.request_id for s in out.scheduled)
        self.scheduler.fail_oom(failed)
        self.mirror.drop(failed)
        self.num_real_oom += 1
        return OutOfMemory(stats.activation_bytes, stats.activation_available_bytes, failed)

    def _record_step(self, out: SchedulerOutput, stats: SchedulerStats, start_s: float,
                     duration_s: float, graph: bool, failed: OutOfMemory | None) -> None:
        """One STEP_COLUMNS row; a step failed by a real OOM ran no tokens."""
        ran = failed is None
        items = out.scheduled if ran else ()
        self.steps.append((out.step_id, start_s, out.num_prefill_tokens if ran else 0,
                           out.num_decode_tokens if ran else 0,
                           out.decode_context_tokens if ran else 0, len(items), duration_s,
                           int(graph), stats.num_lent_blocks, self.elastic.mapped_bytes,
                           int(out.oom is not None or not ran),
                           out.num_sampled_rows if ran else 0,
                           max((s.num_computed_tokens + 1 for s in items if s.is_decode),
                               default=0),
                           ";".join(f"{c}:{p}" for c, p in out.prefill_chunks) if ran else "",
                           *self._phases))
