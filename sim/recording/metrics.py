"""What a run records (per request, per step, per elastic action) and the summary users read.

The recorder is executor-neutral: the simulator and the GPU engine both feed it arrivals,
scheduler outputs with their stats and step durations, and the requests that ended, so their
summaries are computed by the same code. It holds memory bounded by the run's length only
where percentiles need it (8 bytes per finished request per latency, see
`sim.recording.distribution`); rows go to sinks (`sim.recording.sinks`) in blocks, and every
other figure is a running total. Nothing is dropped unsaid: every request that arrived ends
counted as finished, rejected (by reason) or failed.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.core.request import RejectReason, RequestState, RequestStatus
from sim.core.step import (
    ElasticAction,
    ElasticActionKind,
    OutOfMemory,
    SchedulerOutput,
    SchedulerStats,
)
from sim.recording.distribution import (
    PERCENTILES,
    FloatColumn,
    WeightedSample,
    merged_percentiles,
    percentiles,
    weighted_percentiles,
)
from sim.recording.overload import QueueSamples, fleet_trend
from sim.recording.sinks import (
    REQUEST_COLUMNS,
    TIMELINE_COLUMNS,
    RequestSink,
    TimelineMemory,
    TimelineSink,
    request_row,
)
from sim.recording.timeline import TimelineTotals

__all__ = ["PERCENTILES", "REQUEST_COLUMNS", "TIMELINE_COLUMNS", "ReplicaRecorder", "Slo",
           "percentiles", "weighted_percentiles", "request_table", "summarize", "timeline_array"]

TIMELINE_BLOCK_ROWS = 1 << 16
REQUEST_BLOCK_ROWS = 1 << 12


class ReplicaRecorder:
    """Records one replica. Without sinks it keeps every request's state (`requests`, in
    arrival order) and the timeline in memory; with them it streams both."""

    def __init__(self, replica_id: int, block_size: int, *,
                 request_sink: RequestSink | None = None,
                 timeline_sink: TimelineSink | None = None) -> None:
        self.replica_id, self.block_size = replica_id, block_size
        self.requests: list[RequestState] = []
        self.request_sink = request_sink
        self.timeline_sink: TimelineSink = timeline_sink or TimelineMemory()
        # per elastic action kind: [count, seconds]; victims and bytes over all of them
        self.elastic_totals = {kind: [0, 0.0] for kind in ElasticActionKind}
        self.num_drain_victims = self.migrated_bytes = 0
        self.queue = QueueSamples()
        self.itl = WeightedSample()
        self.totals = TimelineTotals()
        self.ttft_s, self.tpot_s, self.e2e_s = FloatColumn(), FloatColumn(), FloatColumn()
        self.num_arrived = self.num_finished = self.num_failed_oom = 0
        self.num_rejected = dict.fromkeys(RejectReason, 0)
        self.num_output_tokens = self.num_preemptions = 0
        self.num_recomputed_tokens = self.num_cached_tokens = 0
        self.first_arrival_s: float | None = None
        self.last_finish_s: float | None = None
        # the largest step run (sim.core.calibration.coverage.StepExtent's fields)
        self.max_step_tokens = self.max_sequence_keys = self.max_decode_keys = 0
        self._rows: list[tuple] = []
        self._steps: list[tuple] = []

    # ------------------------------------------------------------- requests
    def arrival(self, now_s: float, req: RequestState, num_waiting: int) -> None:
        """A request reached the scheduler, which found `num_waiting` requests waiting (and
        may have rejected it already)."""
        self.num_arrived += 1
        if self.first_arrival_s is None:
            self.first_arrival_s = req.arrival_s
        self.queue.add(now_s, num_waiting)
        if self.request_sink is None:
            self.requests.append(req)
        if req.status is RequestStatus.REJECTED:
            self.done(req)

    def done(self, req: RequestState) -> None:
        """A request ended: finished, rejected or failed."""
        self.num_preemptions += req.num_preemptions
        self.num_recomputed_tokens += req.num_recomputed_tokens
        self.num_cached_tokens += req.num_cached_tokens
        # the keys of its last step (a finished request: its prompt and all but its last token)
        if req.num_computed_tokens > self.max_sequence_keys:
            self.max_sequence_keys = req.num_computed_tokens
        status = req.status
        if status is RequestStatus.FINISHED:
            self._finished(req)
        elif status is RequestStatus.REJECTED:
            assert req.reject_reason is not None, "a rejected request carries its reason"
            self.num_rejected[req.reject_reason] += 1
        elif status is RequestStatus.FAILED_OOM:
            self.num_failed_oom += 1
        else:
            raise ValueError(f"request {req.request_id} has not ended: {status.value}")
        if self.request_sink is not None:
            self._rows.append(request_row(req))
            if len(self._rows) >= REQUEST_BLOCK_ROWS:
                self.request_sink.write(self._rows)
                self._rows = []

    def _finished(self, req: RequestState) -> None:
        assert req.first_token_s is not None and req.finish_s is not None
        self.num_finished += 1
        self.ttft_s.append(req.first_token_s - req.arrival_s)
        self.e2e_s.append(req.finish_s - req.arrival_s)
        outputs = req.num_output_tokens
        self.tpot_s.append((req.finish_s - req.first_token_s) / (outputs - 1) if outputs > 1
                           else float("nan"))
        self.num_output_tokens += outputs
        if self.last_finish_s is None or req.finish_s > self.last_finish_s:
            self.last_finish_s = req.finish_s

    # ---------------------------------------------------------------- steps
    def step(self, start_s: float, out: SchedulerOutput, stats: SchedulerStats,
             durations: list[float], failed: OutOfMemory | None = None,
             duration_s: float | None = None) -> None:
        """A step (or decode run, one duration per step) ran from `start_s`. `failed`: the
        executor hit an out-of-memory the scheduler did not predict; nothing ran.
        `duration_s`: the durations' sum (added in order), when the executor has it already."""
        if duration_s is None:
            duration_s = sum_in_order(durations)
        oom = out.oom is not None or failed is not None
        ran = failed is None
        self._steps.append((
            start_s, duration_s, out.num_steps, out.num_prefill_tokens if ran else 0,
            out.num_decode_tokens if ran else 0, len(out.scheduled) if ran else 0,
            stats.num_used_blocks, stats.num_usable_blocks, stats.num_lent_blocks,
            len(out.preempted_ids), int(oom),
        ))
        if ran and out.scheduled:
            self._extent(out)
        if ran and out.num_decode_tokens:
            self.itl.add(durations, out.num_decode_tokens)
        if ran and stats.run_block_wait_steps:
            # blocks a decode run took before their first use, at the run's mean step: its
            # steps differ only by their KV reads, which grow by a token per sequence a step
            self.totals.kv_used_share_s -= (stats.run_block_wait_steps * duration_s
                                            / out.num_steps / max(stats.num_usable_blocks, 1))
        if len(self._steps) >= TIMELINE_BLOCK_ROWS:
            self._flush_steps()

    def _extent(self, out: SchedulerOutput) -> None:
        """The step's tokens, its prefill chunks' keys (prefix and chunk) and, decode-only,
        the keys it reads (a decode run: at its last step), into the largest so far, from the
        step's totals: no walk over its rows, which cost the simulator a fifth of its time. A
        decode row's keys grow to its request's last step, which `done` counts."""
        tokens = out.num_prefill_tokens + out.num_decode_tokens
        if tokens > self.max_step_tokens:
            self.max_step_tokens = tokens
        for new, prefix in out.prefill_chunks:
            if new + prefix > self.max_sequence_keys:
                self.max_sequence_keys = new + prefix
        if not out.num_prefill_tokens:
            keys = out.decode_context_tokens + out.num_decode_tokens * (out.num_steps - 1)
            if keys > self.max_decode_keys:
                self.max_decode_keys = keys

    def elastic(self, now_s: float, action: ElasticAction, pause_s: float) -> None:
        """An elastic action paused the engine for `pause_s` from `now_s` (the time is for
        recorders that log events; this one keeps totals)."""
        totals = self.elastic_totals[action.kind]
        totals[0] += 1
        totals[1] += pause_s
        self.num_drain_victims += len(action.preempted_ids)
        self.migrated_bytes += action.migrated_bytes

    def _flush_steps(self) -> None:
        if self._steps:
            # fromiter over the flattened rows: a third cheaper than np.array on the tuples
            rows = np.fromiter(itertools.chain.from_iterable(self._steps), dtype=np.float64,
                               count=len(self._steps) * len(TIMELINE_COLUMNS)
                               ).reshape(-1, len(TIMELINE_COLUMNS))
            self._steps = []
            self.totals.add(rows)
            self.timeline_sink.write(self.replica_id, rows)

    def flush(self) -> None:
        """Hand every pending row to the sinks (the summary and readers call it)."""
        self._flush_steps()
        if self._rows and self.request_sink is not None:
            self.request_sink.write(self._rows)
            self._rows = []

    @property
    def timeline(self) -> np.ndarray:
        return timeline_array(self)


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None


def sum_in_order(values: list[float]) -> float:
    """The values added one after another, left to right, as a run's steps follow each
    other (the same on every Python: the built-in sum compensates from 3.12 on)."""
    total = 0.0
    for value in values:
        total += value
    return total


def request_table(requests: Sequence[RequestState]) -> dict[str, np.ndarray]:
    """Column arrays over requests, NaN where a time does not exist (never finished)."""
    rows = [request_row(r) for r in requests]
    columns = list(zip(*rows)) if rows else [()] * len(REQUEST_COLUMNS)
    kinds = (np.int64, float, float, float, np.int64, np.int64, np.int64, np.int64, np.int64,
             str, str)
    return {name: np.array(col, dtype=kind)
            for name, col, kind in zip(REQUEST_COLUMNS, columns, kinds)}


def timeline_array(rec: ReplicaRecorder) -> np.ndarray:
    """The replica's timeline rows (TIMELINE_COLUMNS), when they were kept in memory."""
    rec.flush()
    if not isinstance(rec.timeline_sink, TimelineMemory):
        raise ValueError(f"replica {rec.replica_id}'s timeline went to its sink "
                         f"({type(rec.timeline_sink).__name__}); read it from there")
    return rec.timeline_sink.array()


def summarize(recorders: Sequence[ReplicaRecorder], slo: Slo = Slo()) -> dict:
    for rec in recorders:
        rec.flush()
    ttft = _column(recorders, "ttft_s")
    tpot_all = _column(recorders, "tpot_s")
    e2e = _column(recorders, "e2e_s")
    num_finished = sum(r.num_finished for r in recorders)
    single = np.isnan(tpot_all)
    span_s = _makespan(recorders)
    good = np.ones(num_finished, dtype=bool)
    if slo.ttft_s is not None:
        good &= ttft <= slo.ttft_s
    if slo.tpot_s is not None:
        good &= np.where(single, 0.0, tpot_all) <= slo.tpot_s
    rejected = {reason.value: sum(r.num_rejected[reason] for r in recorders)
                for reason in RejectReason}
    outputs = sum(r.num_output_tokens for r in recorders)
    summary = {
        "num_requests": sum(r.num_arrived for r in recorders),
        "num_finished": num_finished,
        "num_rejected": sum(rejected.values()),
        "num_rejected_by_reason": rejected,
        "num_failed_oom": sum(r.num_failed_oom for r in recorders),
        "ttft_s": percentiles(ttft), "tpot_s": percentiles(tpot_all[~single]),
        "e2e_s": percentiles(e2e), "itl_s": merged_percentiles([r.itl for r in recorders]),
        "makespan_s": span_s,
        "throughput_tok_s": float(outputs / span_s) if span_s else 0.0,
        "throughput_req_s": float(num_finished / span_s) if span_s else 0.0,
        "goodput_req_s": float(good.sum() / span_s) if span_s else 0.0,
        "num_preemptions": sum(r.num_preemptions for r in recorders),
        "num_recomputed_tokens": sum(r.num_recomputed_tokens for r in recorders),
        "num_cached_tokens": sum(r.num_cached_tokens for r in recorders),
    }
    summary.update(fleet_trend([r.queue.trend() for r in recorders]))
    block_size = recorders[0].block_size if recorders else 16
    summary.update(TimelineTotals.merged([r.totals for r in recorders]).summary(block_size))
    summary.update(_elastic_stats(recorders))
    summary["step_extent"] = {  # sim.core.calibration.coverage.StepExtent
        "tokens": max((r.max_step_tokens for r in recorders), default=0),
        "sequence_keys": max((r.max_sequence_keys for r in recorders), default=0),
        "decode_keys": max((r.max_decode_keys for r in recorders), default=0)}
    return summary


def _column(recorders: Sequence[ReplicaRecorder], name: str) -> np.ndarray:
    arrays = [getattr(r, name).array() for r in recorders]
    return np.concatenate(arrays) if arrays else np.zeros(0)


def _makespan(recorders: Sequence[ReplicaRecorder]) -> float:
    finishes = [r.last_finish_s for r in recorders if r.last_finish_s is not None]
    arrivals = [r.first_arrival_s for r in recorders if r.first_arrival_s is not None]
    if not finishes:
        return 0.0
    return float(max(finishes) - min(arrivals))


def _elastic_stats(recorders: Sequence[ReplicaRecorder]) -> dict:
    def total(kind: ElasticActionKind, index: int) -> float:
        return sum(rec.elastic_totals[kind][index] for rec in recorders)

    attach, detach = ElasticActionKind.ATTACH, ElasticActionKind.DETACH
    return {
        "num_attach": int(total(attach, 0)), "attach_time_s": float(total(attach, 1)),
        "num_detach": int(total(detach, 0)), "detach_time_s": float(total(detach, 1)),
        "num_drain_victims": sum(rec.num_drain_victims for rec in recorders),
        "migrated_bytes": sum(rec.migrated_bytes for rec in recorders),
    }
