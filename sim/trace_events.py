"""`--trace-events FILE`: engine steps and request spans as Chrome trace events (Perfetto).

The file is the Trace Event Format's JSON object form, `{"traceEvents": [...]}`, which
ui.perfetto.dev and chrome://tracing open. Each run of a command is one process (its label
the process name); in it:

    tid = replica     one complete event ("X") per engine step, or per decode run of
                      several identical steps, with its tokens (prefill/decode split),
                      batch size, steps and KV blocks in `args`; attach and detach of the
                      elastic reserve as complete events of their own
    counters          "KV blocks rR" (used, usable) at every step, "waiting rR" (the queue
                      each arrival found)
    async, per request  nestable async spans ("b"/"e", category "request"): `request N`
                      from arrival to its end, holding `queued` (arrival to first
                      scheduled), `prefill` (first scheduled to first token) and `decode`
                      (first token to finish); a rejected request is an instant event

Times are microseconds of simulated time. Async ids are global in the format, so a request's
id is `run index x ID_STRIDE + request id` (its own id is in `args`). Each run's events are
written to a hidden file as the run goes and the trace file is rewritten whole (atomically)
when a run ends, so a stopped command leaves the trace of every finished run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO

from sim.core.request import RequestState, RequestStatus
from sim.core.step import ElasticAction, OutOfMemory, SchedulerOutput, SchedulerStats
from sim.recording.folder import TEMP_PREFIX, atomic_path
from sim.recording.metrics import ReplicaRecorder, sum_in_order
from sim.recording.sinks import RequestSink

ID_STRIDE = 1_000_000_000
US_PER_S = 1e6


class TraceEventsFile:
    """The trace file of a command's runs; `start_run` gives the events of the next one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._body = _hidden_file(path, "body")  # finished runs' events, each ",\n{...}"
        self._num_runs = 0

    def start_run(self, label: str) -> RunEvents:
        return RunEvents(_hidden_file(self.path, "run").open("w"), self._num_runs, label)

    def finish_run(self, run: RunEvents) -> Path:
        """Add a finished run's events and rewrite the trace file with every finished run."""
        run.file.close()
        part = Path(run.file.name)
        with self._body.open("ab") as body, part.open("rb") as src:
            shutil.copyfileobj(src, body)
        part.unlink()
        self._num_runs += 1
        with atomic_path(self.path) as tmp, tmp.open("wb") as out, self._body.open("rb") as body:
            out.write(b'{"displayTimeUnit": "ms", "traceEvents": [')
            body.read(1)  # the first event's leading comma
            shutil.copyfileobj(body, out)
            out.write(b"\n]}\n")
        return self.path

    def discard_run(self, run: RunEvents) -> None:
        """Drop an unfinished run's events (the command was stopped during it)."""
        run.file.close()
        Path(run.file.name).unlink(missing_ok=True)

    def close(self) -> None:
        self._body.unlink(missing_ok=True)


def _hidden_file(beside: Path, what: str) -> Path:
    fd, name = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{what}-", suffix="-" + beside.name,
                                dir=beside.parent)
    os.close(fd)
    return Path(name)


class RunEvents:
    """One run's events, written as they happen."""

    def __init__(self, file: IO[str], run_index: int, label: str) -> None:
        self.file, self.pid = file, run_index
        self.id_base = run_index * ID_STRIDE
        self._emit({"ph": "M", "name": "process_name", "pid": self.pid, "tid": 0,
                    "args": {"name": label}})

    def _emit(self, event: dict) -> None:
        self.file.write(",\n" + json.dumps(event, separators=(",", ":")))

    def replica(self, replica_id: int) -> None:
        self._emit({"ph": "M", "name": "thread_name", "pid": self.pid, "tid": replica_id,
                    "args": {"name": f"replica {replica_id} steps"}})

    def step(self, replica_id: int, start_s: float, duration_s: float, out: SchedulerOutput,
             stats: SchedulerStats, ran: bool) -> None:
        ts, pid = start_s * US_PER_S, self.pid
        name = _step_name(out, ran)
        args = (f'"prefill_tokens":{out.num_prefill_tokens if ran else 0},'
                f'"decode_tokens":{out.num_decode_tokens if ran else 0},'
                f'"batch_size":{len(out.scheduled) if ran else 0},"num_steps":{out.num_steps},'
                f'"kv_blocks_used":{stats.num_used_blocks},'
                f'"num_preempted":{len(out.preempted_ids)}')
        self.file.write(
            f',\n{{"ph":"X","cat":"step","name":"{name}","pid":{pid},"tid":{replica_id},'
            f'"ts":{ts:.3f},"dur":{duration_s * US_PER_S:.3f},"args":{{{args}}}}}'
            f',\n{{"ph":"C","name":"KV blocks r{replica_id}","pid":{pid},"ts":{ts:.3f},'
            f'"args":{{"used":{stats.num_used_blocks},"usable":{stats.num_usable_blocks}}}}}')

    def waiting(self, replica_id: int, now_s: float, num_waiting: int) -> None:
        self.file.write(f',\n{{"ph":"C","name":"waiting r{replica_id}","pid":{self.pid},'
                        f'"ts":{now_s * US_PER_S:.3f},"args":{{"requests":{num_waiting}}}}}')

    def elastic(self, replica_id: int, now_s: float, action: ElasticAction,
                pause_s: float) -> None:
        self._emit({"ph": "X", "cat": "elastic", "name": action.kind.value, "pid": self.pid,
                    "tid": replica_id, "ts": now_s * US_PER_S, "dur": pause_s * US_PER_S,
                    "args": {"handles": action.num_handles,
                             "drain_victims": len(action.preempted_ids),
                             "migrated_bytes": action.migrated_bytes}})

    def request(self, replica_id: int, req: RequestState, scheduled_s: float | None,
                end_s: float) -> None:
        """A request's spans, from its arrival to `end_s` (its finish, or the step it
        failed in); `scheduled_s`: when it was first scheduled (None: never)."""
        args = {"request_id": req.request_id, "replica": replica_id,
                "status": req.status.value, "prompt_tokens": req.num_prompt_tokens,
                "output_tokens": req.num_output_tokens, "preemptions": req.num_preemptions}
        if req.status is RequestStatus.REJECTED:
            args["reject_reason"] = req.reject_reason.value if req.reject_reason else ""
            self._emit({"ph": "i", "s": "p", "cat": "request", "name": "rejected",
                        "pid": self.pid, "tid": replica_id, "ts": req.arrival_s * US_PER_S,
                        "args": args})
            return
        first_token_s = req.first_token_s
        spans = [("queued", req.arrival_s, scheduled_s if scheduled_s is not None else end_s)]
        if scheduled_s is not None:
            spans.append(("prefill", scheduled_s,
                          first_token_s if first_token_s is not None else end_s))
        if first_token_s is not None:
            spans.append(("decode", first_token_s, end_s))
        self._span(f"request {req.request_id}", req.arrival_s, end_s, args, spans)

    def _span(self, name: str, begin_s: float, end_s: float, args: dict,
              inner: list[tuple[str, float, float]]) -> None:
        rid = self.id_base + args["request_id"]
        common = {"cat": "request", "id": rid, "pid": self.pid, "tid": args["replica"]}
        self._emit({"ph": "b", "name": name, "ts": begin_s * US_PER_S, "args": args, **common})
        for part, start_s, stop_s in inner:
            self._emit({"ph": "b", "name": part, "ts": start_s * US_PER_S, **common})
            self._emit({"ph": "e", "name": part, "ts": stop_s * US_PER_S, **common})
        self._emit({"ph": "e", "name": name, "ts": end_s * US_PER_S, **common})


def _step_name(out: SchedulerOutput, ran: bool) -> str:
    if not ran or out.oom is not None:
        return "out of memory"
    if out.num_steps > 1:
        return f"decode x{out.num_steps}"
    if out.num_prefill_tokens and out.num_decode_tokens:
        return "prefill+decode"
    return "prefill" if out.num_prefill_tokens else "decode"


class TracingRecorder(ReplicaRecorder):
    """A `ReplicaRecorder` that also writes its replica's trace events. It notes when each
    request is first scheduled (a step with prefill tokens, the only kind that admits one).
    The executor reports the requests that ended in a step before the step itself, so their
    spans are written with the step, once its scheduling is noted; a failed request ends
    with the step it failed in."""

    def __init__(self, replica_id: int, block_size: int, events: RunEvents,
                 request_sink: RequestSink | None = None) -> None:
        super().__init__(replica_id, block_size, request_sink=request_sink)
        self.events = events
        self._scheduled_s: dict[int, float] = {}
        self._ended: list[RequestState] = []
        events.replica(replica_id)

    def arrival(self, now_s: float, req: RequestState, num_waiting: int) -> None:
        self.events.waiting(self.replica_id, now_s, num_waiting)
        super().arrival(now_s, req, num_waiting)

    def done(self, req: RequestState) -> None:
        super().done(req)
        if req.status is RequestStatus.REJECTED:
            self.events.request(self.replica_id, req, None, req.arrival_s)
        else:
            self._ended.append(req)

    def step(self, start_s: float, out: SchedulerOutput, stats: SchedulerStats,
             durations: list[float], failed: OutOfMemory | None = None,
             duration_s: float | None = None) -> None:
        if duration_s is None:
            duration_s = sum_in_order(durations)
        super().step(start_s, out, stats, durations, failed, duration_s)
        end_s = start_s + duration_s
        scheduled = self._scheduled_s
        if out.num_prefill_tokens:
            for item in out.scheduled:
                if not item.is_decode and item.request_id not in scheduled:
                    scheduled[item.request_id] = start_s
        self.events.step(self.replica_id, start_s, end_s - start_s, out, stats, failed is None)
        for req in self._ended:
            self.events.request(self.replica_id, req, scheduled.pop(req.request_id, None),
                                end_s if req.finish_s is None else req.finish_s)
        self._ended = []

    def elastic(self, now_s: float, action: ElasticAction, pause_s: float) -> None:
        super().elastic(now_s, action, pause_s)
        self.events.elastic(self.replica_id, now_s, action, pause_s)
