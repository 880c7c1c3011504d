"""SimPy model of a serving fleet: one arrivals process, a router, one engine process per replica.

The model covers scheduling (the shared pure core decides every step), step time (the cost
model), the elastic reserve's attach/detach and drain costs (timed events of their own) and
KV memory. It does not model sampling quality, networking between client and server, or
request cancellation.

Same-time events: an arrival is scheduled with SimPy's URGENT priority, so a request arriving
at the very instant a step ends is seen by the next `schedule()`. Decode runs follow the same
rule: a run stops before the first step that would start at or after the next arrival.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import numpy as np
import simpy
from simpy.core import URGENT

from sim.core.cost_model import CostModel
from sim.core.engine_config import EngineCore
from sim.core.request import RequestState
from sim.core.step import SchedulerOutput
from sim.recording.metrics import ReplicaRecorder
from traces import Request


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
        self._run_durations: np.ndarray | None = None

    def submit(self, req: Request) -> None:
        state = RequestState(req.request_id, req.arrival_s, req.prompt_tokens, req.output_tokens,
                             req.block_hashes)
        if self.scheduler.add_request(state):
            self.outstanding_tokens += req.prompt_tokens + req.output_tokens
        self.recorder.requests.append(state)
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def run(self, env: simpy.Environment) -> Generator[simpy.Event, None, None]:
        sched = self.scheduler
        while True:
            if not sched.has_unfinished():
                self._wakeup = env.event()
                yield self._wakeup
                continue
            self._run_durations = None
            out = sched.schedule(decode_run_limit=self._decode_run_limit)
            if out.elastic is not None:
                pause_s = out.elastic.duration_s + self.cost.migration_s(out.elastic.migrated_bytes)
                self.recorder.elastic(env.now, out.elastic, pause_s)
                yield env.timeout(pause_s)
            start_s = env.now
            durations = self._durations(out)
            yield env.timeout(float(durations.sum()))
            for req in sched.update(out, env.now):
                self.outstanding_tokens -= req.num_prompt_tokens + req.max_output_tokens
                self.num_finished += 1
            self.recorder.step(start_s, out, durations)

    def _durations(self, out: SchedulerOutput) -> np.ndarray:
        if out.num_steps > 1:
            assert self._run_durations is not None
            return self._run_durations[: out.num_steps]
        if out.oom is not None:  # the step never ran: the engine failed and dropped it
            return np.array([self.cost.eff.step_overhead_s])
        return np.array([self.cost.step(out).total_s])

    def _decode_run_limit(self, batch_size: int, context_tokens: int, max_steps: int) -> int:
        """How many decode steps start before the next arrival (all of them if none is due)."""
        durations = self.cost.decode_run_s(batch_size, context_tokens, max_steps)
        self._run_durations = durations
        next_arrival_s = self.fleet.next_arrival_s
        if next_arrival_s is None:
            return max_steps
        starts = self.env.now + np.concatenate(([0.0], np.cumsum(durations[:-1])))
        return max(1, int(np.searchsorted(starts, next_arrival_s, side="left")))


class Fleet:
    """Replicas behind a router; holds the arrival schedule so decode runs know the next one."""

    def __init__(self, env: simpy.Environment, requests: Sequence[Request], router: str) -> None:
        if router not in ("round-robin", "least-tokens"):
            raise ValueError(f"unknown router {router!r}; known: round-robin, least-tokens")
        self.env, self.requests, self.router = env, requests, router
        self.replicas: list[Replica] = []
        self._next_index = 0
        self._round_robin = 0

    @property
    def next_arrival_s(self) -> float | None:
        if self._next_index < len(self.requests):
            return self.requests[self._next_index].arrival_s
        return None

    def route(self, req: Request) -> Replica:
        if self.router == "round-robin":
            replica = self.replicas[self._round_robin % len(self.replicas)]
            self._round_robin += 1
            return replica
        return min(self.replicas, key=lambda r: (r.outstanding_tokens, r.replica_id))

    def arrivals(self, env: simpy.Environment) -> Generator[simpy.Event, None, None]:
        while self._next_index < len(self.requests):
            req = self.requests[self._next_index]
            delay = max(0.0, req.arrival_s - env.now)
            event = env.event()
            event._ok = True
            event._value = None
            env.schedule(event, URGENT, delay)
            yield event
            self._next_index += 1
            self.route(req).submit(req)
