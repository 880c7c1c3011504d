"""The GPU engine's step: schedule, elastic action, forward, update, record.

    out = scheduler.schedule()          the shared core decides (incl. the elastic action)
    stats = scheduler.make_stats()      pool usage and activation need, apart from the output
    pause = elastic.apply(out)          map / migrate + unmap on the real pool, timed
    mirror.apply(out); batch = build    executor-side block tables and token ids
    ids = runner.execute(batch)         eager or CUDA graph; a real OOM fails the step's requests
    scheduler.update(out, end_s)        the same close as the simulator's; a real OOM is
                                        reported to the scheduler (fail_oom), never written
                                        into the output

Under async scheduling (`EngineConfig.async_scheduling`, vLLM's default) one step stays in
flight: step N is launched, then step N-1 is collected (its ids read back, its requests
stamped and recorded), then the scheduler closes step N at once (the trace fixes every output
length, so which requests N finishes is known before its ids are), and the next `step()`
schedules N+1 while N runs. N+1's decode rows take their input ids from N's on the device
(`HostBatch.pending_rows`). An eager or piecewise launch keeps the host busy while N runs, so N
may be collected well after it ended: it is stamped when the device finished it
(`LaunchedStep.done_t`, dated by the device's timer). A step's measured time runs from the
later of the last step's end and its own start to its own end: the host's work between two
steps overlaps the device's. An elastic action waits for the step in flight first (unmap needs
an idle device), as does a step that compiled a kernel (re-timed synchronously), unless the
action is a detach and the step in flight holds no elastic block in its tables (the core's
`ElasticAction.needs_idle_device`, checked against the tables the engine launched): then the
reserve is unmapped while that step runs and the next step is launched behind it, timed from
before the unmap, so what of the unmap outlasts the step in flight counts in the next step.
Unlike vLLM, which frees a finished request's blocks when its step's output arrives, the
scheduler frees them as it closes the step, one step earlier.

Time comes from a `Clock` (`clocks.py`): the wall clock (arrivals in real time) or a
virtual clock that advances by each measured step and skips idle gaps (`--no-wait`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from gpu_backend.engine.clocks import Clock, WallClock
from gpu_backend.engine.elastic import ElasticExecutor
from gpu_backend.engine.inputs import BlockTableError, HostBatch, RequestMirror
from gpu_backend.engine.prompts import PromptSpec
from sim.core.engine_config import EngineCore
from sim.core.request import RequestState, RequestStatus
from sim.core.step import ElasticAction, OutOfMemory, SchedulerOutput, SchedulerStats
from sim.recording.metrics import ReplicaRecorder

STEP_COLUMNS = ("step_id", "start_s", "num_prefill_tokens", "num_decode_tokens",
                "decode_context_tokens", "num_seqs", "measured_s", "graph", "lent_blocks",
                "mapped_elastic_bytes", "oom", "num_sampled_rows", "max_decode_context",
                "prefill_chunks", "build_s", "enqueue_s", "device_s")
# build_s: the host batch built (and the elastic mapping checked) inside measured_s;
# enqueue_s / device_s: the runner's StepPhases (host enqueue time, device span; NaN unknown).


def step_phases(build_s: float, runner_phases: object) -> tuple[float, float, float]:
    """A step's phases row: its build seconds, then the runner's enqueue seconds and device
    span where it kept them (`StepPhases`; NaN otherwise)."""
    return (build_s, getattr(runner_phases, "enqueue_s", math.nan),
            getattr(runner_phases, "device_s", math.nan))


@dataclass
class InFlight:
    """A step launched under async scheduling and not collected yet."""
    out: SchedulerOutput
    stats: SchedulerStats
    launched: object | None  # the runner's LaunchedStep; None when nothing was launched
    batch: HostBatch | None
    graph: bool
    failed: OutOfMemory | None
    start_t: float  # the timer when its host work began
    phases: tuple[float, float, float]  # build_s, then enqueue_s and device_s once collected
    first: list[RequestState] = field(default_factory=list)  # first token sampled in it
    ended: list[RequestState] = field(default_factory=list)  # finished or failed in it


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
    _in_flight: InFlight | None = field(default=None, init=False, repr=False)
    _last_end_t: float = field(default=-math.inf, init=False, repr=False)

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
        """Requests not finished, or a step still in flight (async scheduling)."""
        return self.scheduler.has_unfinished() or self._in_flight is not None

    def step(self, clock: Clock) -> list[RequestState]:
        """Run one scheduler step at `clock`; returns the requests that finished (under async
        scheduling: in the step collected meanwhile, the one launched before)."""
        if self.core.config.async_scheduling:
            return self._step_async(clock)
        out = self.scheduler.schedule()
        stats = self.scheduler.make_stats()
        if out.elastic is not None:
            self._pause(out, clock)
        self.mirror.apply(out, self.prompt_len)
        start_s = clock.now()
        duration_s, graph, failed, phases = self._run(out, stats)
        duration_s = self._agree_seconds(duration_s)
        clock.advance(duration_s)
        end_s = clock.now()
        duration_s = end_s - start_s if isinstance(clock, WallClock) else duration_s
        ended = self.scheduler.update(out, end_s)
        return self._close(out, stats, ended, start_s, duration_s, graph, failed, phases)

    def _pause(self, out: SchedulerOutput, clock: Clock, wait: bool = True) -> None:
        """Carry out the step's elastic action on the pool, timed, and record it. `wait=False`:
        a detach behind the step in flight; its time overlaps that step, so the clock does not
        advance by it (the next step's time counts what outlasts the step in flight)."""
        assert out.elastic is not None
        pause_start_s = clock.now()
        pause_s = self._agree_seconds(self.elastic.apply(out, wait=wait))
        self.recorder.elastic(pause_start_s, out.elastic, pause_s)
        if wait:
            clock.advance(pause_s)

    def _needs_idle_device(self, action: ElasticAction) -> bool:
        """Must the step in flight end before `action` runs? Yes when the core says so, or
        when the tables that step was launched with point at an elastic block (never
        unmapped under a kernel that may read it), or when nothing is in flight."""
        step = self._in_flight
        if action.needs_idle_device or step is None or step.batch is None:
            return True
        tables = step.batch.block_tables
        return bool(tables.size) and int(tables.max()) >= self.elastic.first_elastic_device_block

    def _close(self, out: SchedulerOutput, stats: SchedulerStats, ended: list[RequestState],
               start_s: float, duration_s: float, graph: bool, failed: OutOfMemory | None,
               phases: tuple[float, float, float]) -> list[RequestState]:
        """Record a step that ran and the requests that ended in it (`ended`, stamped);
        returns those that finished."""
        finished = [r for r in ended if r.status is RequestStatus.FINISHED]
        self.mirror.finish(r.request_id for r in finished)
        for req in ended:
            self.recorder.done(req)
        self.recorder.step(start_s, out, stats, [duration_s], failed)
        self._record_step(out, stats, start_s, duration_s, graph, failed, phases)
        return finished

    # ------------------------------------------------------------ async scheduling
    def _step_async(self, clock: Clock) -> list[RequestState]:
        if not self.scheduler.has_unfinished():  # only the step in flight is left
            return self._collect(clock)
        out = self.scheduler.schedule()
        stats = self.scheduler.make_stats()
        finished: list[RequestState] = []
        start_t = None
        if out.elastic is not None:
            if self._needs_idle_device(out.elastic):
                finished += self._collect(clock)  # map / unmap with nothing running
                self._pause(out, clock)
            else:  # unmapped behind the step in flight, which does not touch the reserve
                start_t = self.timer()
                self._pause(out, clock, wait=False)
        self.mirror.apply(out, self.prompt_len)
        step = self._launch(out, stats, start_t)
        finished += self._collect(clock)  # the step before, while this one runs
        requests = self.scheduler.requests
        if step.failed is None:
            step.first = [r for r in (requests.get(s.request_id) for s in out.scheduled
                                      if s.samples) if r is not None and r.first_token_s is None]
        step.ended = self.scheduler.update(out, math.nan)  # stamped when collected
        self._in_flight = step
        if step.launched is None:  # nothing runs: close it now
            finished += self._collect(clock)
        return finished

    def _launch(self, out: SchedulerOutput, stats: SchedulerStats,
                start_t: float | None = None) -> InFlight:
        """Build and launch `out` behind the step in flight (a real OOM fails it here). An
        eager or piecewise launch (every kernel launched from Python) keeps the host busy
        while the step in flight runs; that step is collected afterwards but stamped when the
        device finished it (`LaunchedStep.done_t`). `start_t`: when its host work began, if
        before now (an elastic action run behind the step in flight)."""
        start_t = self.timer() if start_t is None else start_t
        step = InFlight(out, stats, None, None, False, None, start_t, (math.nan,) * 3)
        if not out.scheduled:
            self.mirror.launched(())  # no ids will come from it
            return step
        batch, build_s, step.graph = self._build(out, stats)
        step.phases = (build_s, math.nan, math.nan)
        step.batch = batch
        before = self._in_flight
        after = before.launched if before is not None else None
        launched, oom = self._guarded(self.runner.launch, batch, after)  # type: ignore[attr-defined]
        compiled = getattr(self.runner, "compiled_since_last_call", bool)()
        oom, compiled = self._agree_flags(oom, compiled)
        if compiled and not oom:  # a JIT compile is no part of the step: time a re-run
            assert launched is not None
            resolved = self._resolved(batch, before)  # its ids from the step before, on the host
            launched.collect()
            step.start_t = self.timer()
            launched, oom = self._guarded(self.runner.launch, resolved, None)  # type: ignore[attr-defined]
            oom, _ = self._agree_flags(oom, False)
        if oom:
            step.failed = self._fail_step(out, stats)
            step.graph = False
            self.mirror.launched(())  # no ids will come from it
            return step
        step.launched = launched
        self.mirror.launched(batch.sample_request_ids)
        return step

    def _resolved(self, batch: HostBatch, before: InFlight | None) -> HostBatch:
        """`batch` with its pending input ids read from the step before (collected now)."""
        if not batch.pending_rows.size:
            return batch
        assert before is not None and before.launched is not None
        ids = before.launched.collect()  # type: ignore[attr-defined]
        input_ids = batch.input_ids.copy()
        input_ids[batch.pending_rows] = ids[batch.pending_sources]
        empty = np.zeros(0, np.int64)
        return replace(batch, input_ids=input_ids, pending_rows=empty, pending_sources=empty)

    def _collect(self, clock: Clock) -> list[RequestState]:
        """Wait for the step in flight and close it: its ids to the mirror, its requests
        stamped with its end, its rows recorded. Returns the requests that finished in it."""
        step, self._in_flight = self._in_flight, None
        if step is None:
            return []
        ids = step.launched.collect() if step.launched is not None else None  # type: ignore[attr-defined]
        now_t = self.timer()
        done_t = getattr(step.launched, "done_t", None)  # when the device finished it
        end_t = now_t if done_t is None else min(done_t, now_t)
        seconds = max(end_t - max(step.start_t, self._last_end_t), 0.0)
        self._last_end_t = end_t
        if ids is not None and step.batch is not None:
            self.mirror.append_sampled(step.batch.sample_request_ids, ids, known_only=True)
            step.phases = step_phases(step.phases[0], getattr(step.launched, "phases", None))
        duration_s = self._agree_seconds(seconds)
        clock.advance(duration_s)
        end_s = clock.before(now_t - end_t)
        for req in step.first:
            req.first_token_s = end_s
        for req in step.ended:
            if req.status is RequestStatus.FINISHED:
                req.finish_s = end_s
        return self._close(step.out, step.stats, step.ended, end_s - duration_s, duration_s,
                           step.graph, step.failed, step.phases)

    # Agreement points: one GPU agrees with itself; the TP engine reduces over its ranks.
    def _agree_seconds(self, seconds: float) -> float:
        return seconds

    def _agree_flags(self, oom: bool, compiled: bool) -> tuple[bool, bool]:
        return oom, compiled

    def _run(self, out: SchedulerOutput, stats: SchedulerStats
             ) -> tuple[float, bool, OutOfMemory | None, tuple[float, float, float]]:
        """(seconds, ran as a CUDA graph?, the out-of-memory that failed the step or None,
        the step's phases: build_s, enqueue_s, device_s)."""
        start = self.timer()
        if not out.scheduled:
            return self.timer() - start, False, None, (math.nan,) * 3
        batch, build_s, graph = self._build(out, stats)
        ids, oom = self._guarded(self.runner.execute, batch)  # type: ignore[attr-defined]
        end = self.timer()
        compiled = getattr(self.runner, "compiled_since_last_call", bool)()
        oom, compiled = self._agree_flags(oom, compiled)
        if compiled and not oom:  # a JIT compile is no part of the step: time a re-run
            start = self.timer()
            # idempotent: same KV writes, same ids
            ids, oom = self._guarded(self.runner.execute, batch)  # type: ignore[attr-defined]
            end = self.timer()
            oom, _ = self._agree_flags(oom, False)
        phases = step_phases(build_s, getattr(self.runner, "phases", None))
        if oom:
            return end - start, False, self._fail_step(out, stats), phases
        self.mirror.append_sampled(batch.sample_request_ids, ids)
        return end - start, graph, None, phases

    def _build(self, out: SchedulerOutput, stats: SchedulerStats) -> tuple[HostBatch, float, bool]:
        """The step's host batch, its build seconds (wall clock, a diagnostic beside the
        timer) and whether it runs as a CUDA graph; the elastic mapping checked under it."""
        build_start = time.perf_counter()
        self.elastic.ensure_mapped(out)
        batch = self.mirror.build(out, stats.num_usable_blocks)
        self._check_mapped(batch.block_tables)
        build_s = time.perf_counter() - build_start
        return batch, build_s, bool(getattr(self.runner, "graphs", None)) and batch.is_decode_only

    def _guarded(self, call: Callable, *args):
        """(call(*args), False), or (None, True) when the GPU ran out of memory."""
        try:
            return call(*args), False
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
                     duration_s: float, graph: bool, failed: OutOfMemory | None,
                     phases: tuple[float, float, float]) -> None:
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
                           *phases))
