"""The fleet around the replicas: the arrival schedule, the router and the end of the run.

One arrivals process delivers each request at its arrival time to the replica the router
picks; a replica that ends a step delivers every request already due first (see sim.engine
for why). The fleet knows the next arrival, so a replica's decode run can stop before it, and
it fires `done` once every request has arrived and ended, so nothing polls.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Protocol

import simpy

from traces import Request, Trace

_CHUNK = 1 << 14  # trace rows turned into Python numbers at a time
ProgressFn = Callable[[float, int], None]
"""progress(simulated_s, num_finished)."""


class Replica(Protocol):
    """What the fleet asks of a replica (sim.engine.Replica): routing reads its load, the
    end of the run its unfinished work."""
    replica_id: int
    outstanding_tokens: int
    num_finished: int

    def has_unfinished(self) -> bool: ...

    def submit(self, req: Request) -> None: ...


class TraceRequests(Sequence[Request]):
    """A trace's requests, each made when it is read: a 10M-request trace held as Request
    objects would take gigabytes, its columns take 24 bytes a request."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._chunk: int | None = None
        self._columns: tuple[list, list, list] = ([], [], [])

    def __len__(self) -> int:
        return len(self.trace)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        index = range(len(self))[index]  # negative indices and bounds as a list has them
        chunk, offset = divmod(index, _CHUNK)
        if chunk != self._chunk:  # columns as Python numbers, a chunk at a time
            t, rows = self.trace, slice(chunk * _CHUNK, (chunk + 1) * _CHUNK)
            self._columns = (t.arrival_s[rows].tolist(), t.prompt_tokens[rows].tolist(),
                             t.output_tokens[rows].tolist())
            self._chunk = chunk
        arrival_s, prompt, output = (column[offset] for column in self._columns)
        hashes = self.trace.block_hashes
        return Request(index, arrival_s, prompt, output,
                       hashes[index] if hashes is not None else None)


class Fleet:
    """Replicas behind a router; holds the arrival schedule so decode runs know the next one."""

    def __init__(self, env: simpy.Environment, requests: Sequence[Request], router: str) -> None:
        if router not in ("round-robin", "least-tokens"):
            raise ValueError(f"unknown router {router!r}; known: round-robin, least-tokens")
        self.env, self.requests, self.router = env, requests, router
        self.replicas: list[Replica] = []  # listed by id: round-robin routing relies on it
        self.done = env.event()  # fires once every request has arrived and ended
        self._round_robin = 0
        self._next_index = 0
        self._next: Request | None = requests[0] if len(requests) else None
        self.next_arrival_s: float | None = self._next.arrival_s if self._next else None

    @property
    def num_finished(self) -> int:
        return sum(r.num_finished for r in self.replicas)

    def route(self, req: Request) -> Replica:
        if self.router == "round-robin":
            replica = self.replicas[self._round_robin % len(self.replicas)]
            self._round_robin += 1
            return replica
        return min(self.replicas, key=lambda r: (r.outstanding_tokens, r.replica_id))

    def next_arrival_for(self, replica_id: int) -> float | None:
        """When the next request this replica will get arrives: with round-robin routing
        (replicas listed by id) the one `replica_id` places after the next arrival; with
        another router any arrival may come to it, so the fleet's next. A decode run needs to
        stop only there: the others go to other replicas and change nothing here."""
        num_replicas = len(self.replicas)
        if self.router != "round-robin" or self._next is None or num_replicas == 1:
            return self.next_arrival_s
        index = self._next_index + (replica_id - self._round_robin) % num_replicas
        if index >= len(self.requests):
            return None
        if isinstance(self.requests, TraceRequests):  # without making the Request
            return float(self.requests.trace.arrival_s[index])
        return self.requests[index].arrival_s

    def deliver_due(self, now_s: float) -> None:
        """Route every request whose arrival time is at or before `now_s`."""
        next_s = self.next_arrival_s
        if next_s is None or next_s > now_s:
            return
        requests, num_requests = self.requests, len(self.requests)
        while self._next is not None and self._next.arrival_s <= now_s:
            req = self._next
            self._next_index += 1
            self._next = requests[self._next_index] if self._next_index < num_requests else None
            self.next_arrival_s = self._next.arrival_s if self._next is not None else None
            self.route(req).submit(req)

    def check_done(self) -> None:
        if self.next_arrival_s is None and not self.done.triggered and all(
                not r.has_unfinished() for r in self.replicas):
            self.done.succeed()

    def arrivals(self, env: simpy.Environment) -> Generator[simpy.Event, None, None]:
        while self.next_arrival_s is not None:
            due_s = self.next_arrival_s
            if due_s > env.now:
                yield env.timeout(due_s - env.now)
            # now + (due - now) may round just below due: the timeout stands for `due_s`
            self.deliver_due(max(env.now, due_s))
        self.check_done()

    def monitor(self, env: simpy.Environment, progress: ProgressFn,
                every_s: float) -> Generator[simpy.Event, None, None]:
        """Report progress every `every_s` simulated seconds while there is work; across an
        idle gap, once at its end."""
        while not self.done.triggered:
            progress(env.now, self.num_finished)
            idle = all(not r.has_unfinished() for r in self.replicas)
            wait_s = every_s
            if idle and self.next_arrival_s is not None:
                wait_s = max(every_s, self.next_arrival_s - env.now)
            yield env.timeout(wait_s)
