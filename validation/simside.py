"""The simulator side of a validation: `sim.runner.simulate` plus a per-step log.

The simulator advances predictable stretches of decode steps as one event (a "decode run");
the GPU engine executes every step. To compare them step by step, the recorder here expands
each run into its steps (same rows, context growing by one token per row per step) and keeps
what the cost model needs to price a step, which the summary timeline does not.
"""

from __future__ import annotations

import numpy as np

from sim.core.cost_model import step_extents
from sim.core.step import OutOfMemory, SchedulerOutput, SchedulerStats
from sim.recording.metrics import ReplicaRecorder
from sim.runner import RunResult, RunSpec, simulate
from traces import Trace
from validation.step_table import StepTable, chunk_pairs, format_chunks, parse_chunks

# (start_s, prefill, decode, context, seqs, rows, pairs, duration, preempted, used, usable, lent,
#  longest query, longest sequence)
_ROW_FIELDS = 14


class StepLogRecorder(ReplicaRecorder):
    """A `ReplicaRecorder` that also logs every step's composition, runs expanded."""

    def __init__(self, replica_id: int, block_size: int) -> None:
        super().__init__(replica_id, block_size)
        self.step_rows: list[tuple] = []
        self.step_chunks: list[str] = []

    def step(self, start_s: float, out: SchedulerOutput, stats: SchedulerStats,
             durations: list[float], failed: OutOfMemory | None = None,
             duration_s: float | None = None) -> None:
        super().step(start_s, out, stats, durations, failed, duration_s)
        chunks = format_chunks(list(out.prefill_chunks))
        pairs = chunk_pairs(list(out.prefill_chunks))
        seqs, decode = len(out.scheduled), out.num_decode_tokens
        starts = start_s + np.concatenate(([0.0], np.cumsum(durations[:-1])))
        max_query, max_seq = step_extents(out)
        for i in range(out.num_steps):
            first = i == 0  # preemptions are recorded on the first step of a run
            self.step_rows.append((
                float(starts[i]), out.num_prefill_tokens, decode,
                out.decode_context_tokens + i * decode, seqs, out.num_sampled_rows, pairs,
                float(durations[i]), len(out.preempted_ids) if first else 0,
                stats.num_used_blocks, stats.num_usable_blocks, stats.num_lent_blocks,
                max_query, max_seq + i,  # a decode run's rows grow by one token per step
            ))
            self.step_chunks.append(chunks)

    def table(self) -> StepTable:
        rows = np.array(self.step_rows, dtype=np.float64).reshape(-1, _ROW_FIELDS)
        ints = rows[:, 1:6].astype(np.int64).T
        extra = {"start_s": rows[:, 0], "num_preempted": rows[:, 8],
                 "kv_blocks_used": rows[:, 9], "kv_blocks_usable": rows[:, 10],
                 "reserve_lent_blocks": rows[:, 11]}
        chunks = np.empty(len(rows), dtype=object)
        chunks[:] = [tuple(parse_chunks(text)) for text in self.step_chunks]
        return StepTable(ints[0], ints[1], ints[2], ints[3], ints[4], rows[:, 6], rows[:, 7],
                         True, extra, rows[:, 12].astype(np.int64), rows[:, 13].astype(np.int64),
                         chunks)


def simulate_logged(spec: RunSpec, trace: Trace) -> tuple[RunResult, StepLogRecorder]:
    """`sim.runner.simulate` for one replica, with a `StepLogRecorder` on the replica."""
    if spec.num_replicas != 1:
        raise ValueError("validation compares one engine: num_replicas must be 1")
    result = simulate(spec, trace, recorder=StepLogRecorder)
    recorder = result.recorders[0]
    assert isinstance(recorder, StepLogRecorder)
    return result, recorder
