"""SimPy model of a serving replica: one engine process per replica, fed by the fleet (sim/fleet.py).

The model covers scheduling (the shared pure core decides every step), step time (the cost
model), the elastic reserve's attach/detach and drain costs (timed events of their own) and
KV memory. It does not model sampling quality, networking between client and server, or
request cancellation.

Same-time events, through SimPy's public API only: the arrivals process delivers each request
at its arrival time, and a replica whose step ends also delivers, before it closes the step,
every request whose arrival time has come (`Fleet.deliver_due`). So a request arriving at
the very instant a step ends is routed and queued before that step's `update()` and is seen
by the next `schedule()`, whichever of the two same-time events SimPy runs first. Decode runs
follow the same rule: a run stops before the first step that would start at or after the
replica's next arrival (under round-robin routing, the next one routed to it; under a
state-dependent router, the fleet's next, since any may come to it).

A decode run takes the blocks of all its steps at its first step (the scheduler must know
they are there), so the timeline's used blocks for a run are those of its last step (its
peak); the recorder takes off the steps each block waited for its first use
(`SchedulerStats.run_block_wait_steps`), so the mean KV use counts step by step.

Under async scheduling (EngineConfig.async_scheduling, vLLM's default) each step is scheduled
as the one before it starts (a decode run's next step: as its last step starts), and the
scheduler closes it at once, as the GPU engine does (gpu_backend/engine/engine.py): a request
arriving during a step is seen one step later, a decode run may go one step past the next
arrival, and a step's requests are stamped with its end only when it ends. The cost model
then hides a step's host work behind the step before (CostModel's `host_hidden`), except
where nothing runs before it: a step scheduled on an idle replica, or after an elastic pause
(the engine drains the step in flight to map or unmap), is priced as a synchronous one.

Nothing polls. An idle replica sleeps on an event its next request triggers; the arrivals
process sleeps until the next arrival; the fleet's `done` event fires when the last request
has ended, so a gap of 1e12 s between two arrivals costs one event, not 2e11.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass

import simpy

from sim.core.cost_model import CostModel, step_total_s
from sim.core.engine_config import EngineCore
from sim.core.request import RequestState, RequestStatus
from sim.core.step import ElasticAction, SchedulerOutput, SchedulerStats
from sim.fleet import Fleet
from sim.recording.metrics import ReplicaRecorder
from traces import Request


@dataclass
class AheadStep:
    """A step scheduled, and closed in the scheduler, before it runs (async scheduling)."""
    out: SchedulerOutput
    stats: SchedulerStats
    durations: list[float]
    duration_s: float
    first: list[RequestState]  # requests whose first token it samples
    ended: list[RequestState]  # finished or failed in it


class Replica:
    """One engine (a TP group of GPUs) with its own scheduler, block pool and reserve."""

    def __init__(self, env: simpy.Environment, replica_id: int, core: EngineCore,
                 cost: CostModel, fleet: Fleet) -> None:
        self.env, self.replica_id, self.core, self.cost, self.fleet = env, replica_id, core, cost, fleet
        self.scheduler = core.scheduler
        self.recorder = ReplicaRecorder(replica_id, core.config.block_size)
        self.outstanding_tokens = 0
        self.num_finished = 0
        self._wakeup = env.event()
        self._run: tuple[list[float], float] | None = None  # the decode run's steps, its length
        self._ahead = core.config.async_scheduling
        self._run_start_s = 0.0  # when the step being scheduled starts (after any pause)
        self._num_ahead = 0  # async: steps scheduled and closed, not yet ended (up to two)
        self._exposed = False  # async: the step being scheduled has none in flight before it

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._num_ahead > 0

    def submit(self, req: Request) -> None:
        state = RequestState(req.request_id, req.arrival_s, req.prompt_tokens, req.output_tokens,
                             req.block_hashes)
        num_waiting = len(self.scheduler.waiting)
        if self.scheduler.add_request(state):
            self.outstanding_tokens += req.prompt_tokens + req.output_tokens
        self.recorder.arrival(self.env.now, state, num_waiting)
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def run(self, env: simpy.Environment) -> Generator[simpy.Event, None, None]:
        if self._ahead:
            yield from self._run_ahead(env)
            return
        sched, fleet = self.scheduler, self.fleet
        limit = self._decode_run_limit
        while True:
            if not sched.has_unfinished():
                self._wakeup = env.event()
                yield self._wakeup
                continue
            self._run = None
            self._run_start_s = env.now
            out = sched.schedule(decode_run_limit=limit)
            stats = sched.make_stats()
            if out.elastic is not None:
                yield from self._pause(env, out.elastic)
            start_s = env.now
            durations, duration_s = self._durations(out)
            yield env.timeout(duration_s)
            due_s = fleet.next_arrival_s
            if due_s is not None and due_s <= env.now:
                fleet.deliver_due(env.now)  # same-time arrivals join before the step closes
            self._close(out, stats, sched.update(out, env.now), start_s, durations, duration_s)
            if fleet.next_arrival_s is None:
                fleet.check_done()

    def _run_ahead(self, env: simpy.Environment) -> Generator[simpy.Event, None, None]:
        """The engine process under async scheduling: the next step is scheduled (and closed
        in the scheduler) as the current one starts, and stamped when it ends."""
        sched, fleet = self.scheduler, self.fleet
        step: AheadStep | None = None
        while True:
            if step is None:
                if not sched.has_unfinished():
                    self._wakeup = env.event()
                    yield self._wakeup
                    continue
                step = self._schedule_ahead(env.now, exposed=True)
                yield from self._pause(env, step.out.elastic)
            start_s = env.now
            head_s = step.duration_s - step.durations[-1] if step.out.num_steps > 1 else 0.0
            if head_s > 0:  # a decode run: the next step is scheduled as its last one starts
                yield env.timeout(head_s)
            last_s = step.durations[-1]
            after = self._schedule_ahead(env.now + last_s) if sched.has_unfinished() else None
            action = None if after is None else after.out.elastic
            if action is not None and not action.needs_idle_device:
                # a detach taken while this step runs: its unmap holds the device
                held_s = self._pause_s(action)
                self.recorder.elastic(env.now + last_s, action, held_s)
                last_s += held_s
                step.durations = [*step.durations[:-1], last_s]
                step.duration_s += held_s
                action = None  # charged to this step: no pause before the next
            yield env.timeout(last_s)
            due_s = fleet.next_arrival_s
            if due_s is not None and due_s <= env.now:
                fleet.deliver_due(env.now)  # same-time arrivals join before the step closes
            self._close_ahead(step, start_s)
            step = after
            yield from self._pause(env, action)
            if fleet.next_arrival_s is None:
                fleet.check_done()

    def _schedule_ahead(self, start_s: float, exposed: bool = False) -> AheadStep:
        """Schedule the step that starts at `start_s` (after its elastic pause, if any) and
        close it in the scheduler at once; its requests are stamped when it ends. `exposed`:
        the replica is idle, so no step runs before this one to hide its host work (nor does
        one after an elastic action that waits for the device to drain)."""
        sched = self.scheduler
        self._run = None
        self._run_start_s = start_s
        self._exposed = exposed
        out = sched.schedule(decode_run_limit=self._decode_run_limit)
        stats = sched.make_stats()
        action = out.elastic
        drained = action is not None and action.needs_idle_device
        durations, duration_s = self._durations(out, exposed or drained)
        requests = sched.requests
        # only a step with prefill tokens gives a request its first token (a decode row's came
        # before, or is due from the step in flight, which stamps it)
        first = [req for req in (requests.get(s.request_id) for s in out.scheduled if s.samples)
                 if req is not None and req.first_token_s is None] if out.num_prefill_tokens else []
        ended = sched.update(out, math.nan)
        self._num_ahead += 1
        return AheadStep(out, stats, durations, duration_s, first, ended)

    def _durations(self, out: SchedulerOutput,
                   exposed: bool = False) -> tuple[list[float], float]:
        """The durations of `out`'s steps and their sum (a decode run's, as its limit priced
        them); `exposed`: a step with no step in flight before it hides none of its host work
        (async scheduling; the synchronous price)."""
        if out.num_steps > 1:
            assert self._run is not None
            return self._run
        if out.oom is not None:  # the step never ran: the engine failed and dropped it
            duration_s = self.cost.eff.step_overhead_s
        elif exposed and self.cost.hides_host:
            cost = self.cost.step(out)
            duration_s = step_total_s(cost.device_s, cost.launch_s,
                                      cost.launch_serial_fraction, cost.overhead_s)
        else:
            duration_s = self.cost.step(out).total_s
        return [duration_s], duration_s

    def _pause(self, env: simpy.Environment,
               action: ElasticAction | None) -> Generator[simpy.Event, None, None]:
        """A step's elastic action, if any, before the step, with the device idle. Under async
        scheduling a detach whose step in flight holds no elastic block is taken while that
        step runs instead (EngineConfig.detach_behind_step; `_run_ahead`): the next step still
        hides its host gap, but the unmap holds the device back, so the step in flight runs
        the detach's time longer. In the replays a decode step with a detach behind it took
        0.50-1.17 of the detach's time longer on Llama-3.1-8B and 0.12-0.93 on Llama-3.2-3B
        and Qwen2.5-0.5B, whose steps leave the device idle between launches (runs with 30
        such steps or more, `benchmarks/detach_behind.py`)."""
        if action is not None:
            pause_s = self._pause_s(action)
            self.recorder.elastic(env.now, action, pause_s)
            yield env.timeout(pause_s)

    def _close(self, out: SchedulerOutput, stats: SchedulerStats, ended: list[RequestState],
               start_s: float, durations: list[float], duration_s: float) -> None:
        """Record a step (or decode run) that ended now and the requests that ended in it."""
        recorder = self.recorder
        for req in ended:
            self.outstanding_tokens -= req.num_prompt_tokens + req.max_output_tokens
            self.num_finished += req.status is RequestStatus.FINISHED
            recorder.done(req)
        recorder.step(start_s, out, stats, durations, duration_s=duration_s)

    def _close_ahead(self, step: AheadStep, start_s: float) -> None:
        """`_close` of a step scheduled ahead: its requests stamped with its end first."""
        now = self.env.now
        self._num_ahead -= 1
        for req in step.first:
            req.first_token_s = now
        for req in step.ended:
            if req.status is RequestStatus.FINISHED:
                req.finish_s = now
        self._close(step.out, step.stats, step.ended, start_s, step.durations, step.duration_s)

    def _pause_s(self, action: ElasticAction) -> float:
        """The engine's pause for an elastic action: VMM time, then migration copies."""
        return action.duration_s + self.cost.migration_s(action.migrated_bytes)

    def _decode_run_limit(self, batch_size: int, context_tokens: int, max_steps: int,
                          attach: ElasticAction | None) -> int:
        """How many decode steps start before this replica's next arrival (all of them if none
        is due); the run starts after `attach`'s pause when it waits for one.

        Steps are priced one at a time (`CostModel.decode_step_terms`, the figures
        `CostModel.decode_run_s` gives), up to the first that would start at or after the
        arrival: step i starts at the run's start plus the first i durations, added in order,
        and the run lasts their sum, added the same way. Under async scheduling a step is
        scheduled as the one before it starts, so the run goes up to the first step whose
        predecessor starts at or after the arrival; its first step hides no host work when
        none runs before it (an idle replica, or the attach's drain)."""
        next_arrival_s = self.fleet.next_arrival_for(self.replica_id)
        start_s = self._run_start_s + (0.0 if attach is None else self._pause_s(attach))
        due_s = float("inf") if next_arrival_s is None else next_arrival_s
        fixed_s, per_token_s, launch, fraction, overhead = self.cost.decode_step_terms(batch_size)
        hidden_s = self.cost.decode_hidden_s
        hidden = 0.0 if attach is not None or self._exposed else hidden_s
        durations: list[float] = []
        elapsed_s = 0.0
        context = context_tokens
        ahead = self._ahead
        while True:
            duration_s = step_total_s(fixed_s + context * per_token_s, launch, fraction,
                                      overhead, hidden)
            durations.append(duration_s)
            hidden = hidden_s
            begun_s = elapsed_s
            elapsed_s += duration_s
            # the next step is scheduled as it would start (async: as this one starts)
            scheduled_s = start_s + (begun_s if ahead else elapsed_s)
            context += batch_size
            if len(durations) == max_steps or scheduled_s >= due_s:
                break
        self._run = (durations, elapsed_s)
        return len(durations)
