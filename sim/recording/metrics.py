"""What a run records (per request, per step, per elastic action) and the summary users read.

The recorder is executor-neutral: the simulator and the GPU engine both feed it scheduler
outputs and step durations, so their summaries are computed by the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sim.core.request import RequestState, RequestStatus
from sim.core.step import ElasticAction, ElasticActionKind, SchedulerOutput

PERCENTILES = (50, 90, 99)
TIMELINE_COLUMNS = (
    "start_s", "duration_s", "num_steps", "prefill_tokens", "decode_tokens", "num_seqs",
    "kv_blocks_used", "kv_blocks_usable", "reserve_lent_blocks", "num_preempted", "oom",
)


@dataclass
class ReplicaRecorder:
    replica_id: int
    block_size: int
    requests: list[RequestState] = field(default_factory=list)
    timeline: list[tuple] = field(default_factory=list)
    itl_durations: list[np.ndarray] = field(default_factory=list)
    itl_weights: list[int] = field(default_factory=list)
    elastic_events: list[tuple[float, str, float, int, int]] = field(default_factory=list)

    def step(self, start_s: float, out: SchedulerOutput, durations: np.ndarray) -> None:
        self.timeline.append((
            start_s, float(durations.sum()), out.num_steps, out.num_prefill_tokens,
            out.num_decode_tokens, len(out.scheduled), out.num_used_blocks,
            out.num_usable_blocks, out.num_lent_blocks, len(out.preempted_ids),
            int(out.oom is not None),
        ))
        if out.num_decode_tokens:
            self.itl_durations.append(durations)
            self.itl_weights.append(out.num_decode_tokens)

    def elastic(self, now_s: float, action: ElasticAction, pause_s: float) -> None:
        self.elastic_events.append((now_s, action.kind.value, pause_s,
                                    len(action.preempted_ids), action.migrated_bytes))


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    result: dict[str, float | None] = {
        f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES))
    }
    result["mean"] = float(values.mean())
    return result


def weighted_percentiles(values: np.ndarray, weights: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    order = np.argsort(values)
    values, weights = values[order], weights[order]
    cumulative = np.cumsum(weights) / weights.sum()
    result: dict[str, float | None] = {
        f"p{p}": float(values[min(np.searchsorted(cumulative, p / 100.0), values.size - 1)])
        for p in PERCENTILES
    }
    result["mean"] = float(np.average(values, weights=weights))
    return result


def request_table(requests: Sequence[RequestState]) -> dict[str, np.ndarray]:
    """Column arrays over requests, NaN where a time does not exist (never finished)."""
    def col(getter, dtype=float):
        return np.array([getter(r) for r in requests], dtype=dtype)

    nan = float("nan")
    return {
        "request_id": col(lambda r: r.request_id, np.int64),
        "arrival_s": col(lambda r: r.arrival_s),
        "first_token_s": col(lambda r: nan if r.first_token_s is None else r.first_token_s),
        "finish_s": col(lambda r: nan if r.finish_s is None else r.finish_s),
        "prompt_tokens": col(lambda r: r.num_prompt_tokens, np.int64),
        "output_tokens": col(lambda r: r.num_output_tokens, np.int64),
        "cached_tokens": col(lambda r: r.num_cached_tokens, np.int64),
        "preemptions": col(lambda r: r.num_preemptions, np.int64),
        "recomputed_tokens": col(lambda r: r.num_recomputed_tokens, np.int64),
        "status": np.array([r.status.value for r in requests]),
    }


def summarize(recorders: Sequence[ReplicaRecorder], slo: Slo = Slo()) -> dict:
    requests = [r for rec in recorders for r in rec.requests]
    table = request_table(requests)
    done = table["status"] == RequestStatus.FINISHED.value
    ttft = (table["first_token_s"] - table["arrival_s"])[done]
    e2e = (table["finish_s"] - table["arrival_s"])[done]
    outputs = table["output_tokens"][done]
    multi = outputs > 1
    tpot = ((table["finish_s"] - table["first_token_s"])[done][multi] / (outputs[multi] - 1))
    span_s = _makespan(table, done)
    good = np.ones(done.sum(), dtype=bool)
    if slo.ttft_s is not None:
        good &= ttft <= slo.ttft_s
    if slo.tpot_s is not None:
        tpot_all = np.zeros(done.sum())
        tpot_all[multi] = tpot
        good &= tpot_all <= slo.tpot_s
    summary = {
        "num_requests": len(requests),
        "num_finished": int(done.sum()),
        "num_rejected": int((table["status"] == RequestStatus.REJECTED.value).sum()),
        "num_failed_oom": int((table["status"] == RequestStatus.FAILED_OOM.value).sum()),
        "ttft_s": percentiles(ttft), "tpot_s": percentiles(tpot), "e2e_s": percentiles(e2e),
        "itl_s": _itl(recorders),
        "makespan_s": span_s,
        "throughput_tok_s": float(outputs.sum() / span_s) if span_s else 0.0,
        "throughput_req_s": float(done.sum() / span_s) if span_s else 0.0,
        "goodput_req_s": float(good.sum() / span_s) if span_s else 0.0,
        "num_preemptions": int(table["preemptions"].sum()),
        "num_recomputed_tokens": int(table["recomputed_tokens"].sum()),
        "num_cached_tokens": int(table["cached_tokens"].sum()),
    }
    summary.update(_timeline_stats(recorders))
    summary.update(_elastic_stats(recorders))
    return summary


def _makespan(table: dict[str, np.ndarray], done: np.ndarray) -> float:
    if not done.any():
        return 0.0
    return float(np.nanmax(table["finish_s"][done]) - np.nanmin(table["arrival_s"]))


def _itl(recorders: Sequence[ReplicaRecorder]) -> dict[str, float | None]:
    durations = [d for rec in recorders for d in rec.itl_durations]
    if not durations:
        return weighted_percentiles(np.array([]), np.array([]))
    weights = [np.full(d.size, w) for rec in recorders
               for d, w in zip(rec.itl_durations, rec.itl_weights)]
    return weighted_percentiles(np.concatenate(durations), np.concatenate(weights))


def timeline_array(rec: ReplicaRecorder) -> np.ndarray:
    return np.array(rec.timeline, dtype=np.float64).reshape(-1, len(TIMELINE_COLUMNS))


def _timeline_stats(recorders: Sequence[ReplicaRecorder]) -> dict:
    rows = [timeline_array(rec) for rec in recorders]
    tl = np.concatenate(rows) if rows else np.zeros((0, len(TIMELINE_COLUMNS)))
    col = {name: tl[:, i] for i, name in enumerate(TIMELINE_COLUMNS)}
    busy_s = float(col["duration_s"].sum())
    block_size = recorders[0].block_size if recorders else 16

    def time_share(mask: np.ndarray) -> float:
        return float(col["duration_s"][mask].sum() / busy_s) if busy_s else 0.0

    usable = np.maximum(col["kv_blocks_usable"], 1)
    util = float((col["kv_blocks_used"] / usable * col["duration_s"]).sum() / busy_s) if busy_s else 0.0
    lent = col["reserve_lent_blocks"]
    return {
        "num_engine_steps": int(col["num_steps"].sum()),
        "busy_s": busy_s,
        "decode_only_time_share": time_share((col["prefill_tokens"] == 0) & (col["decode_tokens"] > 0)),
        "kv_utilization_mean": util,
        "reserve_lent_time_share": time_share(lent > 0),
        "reserve_lent_tokens_max": int(lent.max() * block_size) if lent.size else 0,
        "reserve_lent_tokens_mean": float((lent * col["duration_s"]).sum() / busy_s * block_size)
        if busy_s else 0.0,
        "num_oom": int(col["oom"].sum()),
    }


def _elastic_stats(recorders: Sequence[ReplicaRecorder]) -> dict:
    events = [e for rec in recorders for e in rec.elastic_events]

    def of(kind: ElasticActionKind) -> list[tuple]:
        return [e for e in events if e[1] == kind.value]

    attach, detach = of(ElasticActionKind.ATTACH), of(ElasticActionKind.DETACH)
    return {
        "num_attach": len(attach), "attach_time_s": float(sum(e[2] for e in attach)),
        "num_detach": len(detach), "detach_time_s": float(sum(e[2] for e in detach)),
        "num_drain_victims": int(sum(e[3] for e in events)),
        "migrated_bytes": int(sum(e[4] for e in events)),
    }
