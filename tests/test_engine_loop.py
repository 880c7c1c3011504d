"""The engine loop on CPU with a fake runner: arrival semantics of the virtual clock, the
real-OOM path, elastic attach/detach bookkeeping and the block-table safety check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_engine_helpers import (
    FakeRunner,
    FakeTimer,
    prefill_of_request_one,
    toy_config,
    toy_core,
)

from gpu_backend.engine.engine import STEP_COLUMNS
from gpu_backend.engine.inputs import BlockTableError
from gpu_backend.engine.replay import engine_summary, replay
from gpu_backend.engine.setup import assemble_engine, plain_store
from sim.core.elastic import Policy
from sim.core.request import RequestStatus
from traces import Request


def make_engine(policy=Policy.STATIC, runner=None, timer=None, num_kv_blocks=48):
    core = toy_core(toy_config(policy), num_kv_blocks)
    store = plain_store(core, "cpu", torch.float32)
    engine = assemble_engine(core, None, store, torch.device("cpu"), None)
    engine.runner = runner or FakeRunner()
    if timer is not None:
        engine.timer = timer
    return engine


def test_arrival_at_a_step_end_is_seen_by_the_next_step():
    timer = FakeTimer()
    engine = make_engine(runner=FakeRunner(timer, step_s=1.0), timer=timer)
    requests = [Request(0, 0.0, 8, 3), Request(1, 1.0, 8, 1), Request(2, 1.5, 8, 1),
                Request(3, 100.0, 8, 1)]
    end_s = replay(engine, requests, wait=False)
    first = {r.request_id: r.first_token_s for r in engine.recorder.requests}
    # steps of 1 s from t=0: request 1 arrives exactly when step 1 ends -> runs in step 2
    assert first == {0: 1.0, 1: 2.0, 2: 3.0, 3: 101.0}
    assert end_s == 101.0
    starts = [row[0] for row in engine.recorder.timeline]
    assert starts[-1] == 100.0  # the idle gap was skipped, not simulated


def test_real_oom_fails_the_step_and_the_run_goes_on():
    engine = make_engine(runner=FakeRunner(fail_when=prefill_of_request_one))
    requests = [Request(0, 0.0, 40, 4), Request(1, 5.0, 40, 4), Request(2, 10.0, 20, 4)]
    replay(engine, requests, wait=False)
    status = {r.request_id: r.status for r in engine.recorder.requests}
    assert status == {0: RequestStatus.FINISHED, 1: RequestStatus.FAILED_OOM,
                      2: RequestStatus.FINISHED}
    assert engine.num_real_oom == 1
    summary = engine_summary(engine, {})
    assert summary["num_oom"] == 1 and summary["num_failed_oom"] == 1
    assert summary["measured"]["num_real_oom"] == 1
    # the failed step is recorded as run without tokens (the scheduler's output stays as it
    # was scheduled; the executor reports the failure instead of rewriting it)
    (failed,) = [row for row in engine.steps if row[STEP_COLUMNS.index("oom")]]
    assert failed[STEP_COLUMNS.index("num_prefill_tokens")] == 0
    assert failed[STEP_COLUMNS.index("num_seqs")] == 0
    (timeline_row,) = [row for row in engine.recorder.timeline if row[-1]]
    assert timeline_row[3] == timeline_row[4] == timeline_row[5] == 0  # no tokens, no seqs
    pool = engine.scheduler.pool
    pool.check_invariants()
    assert pool.num_used_blocks == 0
    assert 1 not in engine.mirror.tables and 1 not in engine.mirror.tokens


def test_elastic_lends_during_decode_and_detaches_before_prefill():
    engine = make_engine(Policy.ELASTIC)
    requests = [Request(i, 0.0, 24, 30) for i in range(4)] + [Request(9, 3.0, 40, 5)]
    timer = FakeTimer()
    engine.runner = FakeRunner(timer, step_s=0.1)
    engine.timer = timer
    replay(engine, requests, wait=False)
    summary = engine_summary(engine, {})
    assert summary["num_finished"] == 5
    assert summary["num_attach"] >= 1 and summary["num_detach"] >= 1
    lent = [row[8] for row in engine.recorder.timeline]
    assert max(lent) > 0
    assert engine.elastic.mapped_bytes == 0 or engine.elastic.store.attached


def test_overcommit_maps_handles_as_elastic_blocks_are_used():
    timer = FakeTimer()
    engine = make_engine(Policy.OVERCOMMIT, FakeRunner(timer), timer, num_kv_blocks=8)
    assert engine.elastic.mapped_bytes == 0
    requests = [Request(i, float(i), 10, 20) for i in range(6)]  # small steps: no OOM
    replay(engine, requests, wait=False)
    assert all(r.status is RequestStatus.FINISHED for r in engine.recorder.requests)
    assert engine.elastic.mapped_bytes > 0  # base holds 8 blocks: elastic blocks were needed
    used_top = max(max(b.slot_mapping) for b in engine.runner.batches) // 16
    assert used_top < engine.elastic.num_mapped_device_blocks


def test_a_table_into_unmapped_blocks_is_refused():
    engine = make_engine(Policy.ELASTIC)
    with pytest.raises(BlockTableError, match="mapped"):
        engine._check_mapped(np.array([[engine.elastic.num_mapped_device_blocks]]))


class CompilingRunner(FakeRunner):
    """Its first step 'compiles' (takes 30 s); the engine must time a re-run instead."""

    def __init__(self, timer):
        super().__init__(timer, step_s=1.0)
        self.pending_compile = True

    def execute(self, batch):
        if self.pending_compile:
            self.timer.t += 29.0
        return super().execute(batch)

    def compiled_since_last_call(self) -> bool:
        compiled, self.pending_compile = self.pending_compile, False
        return compiled


def test_a_step_that_compiles_kernels_is_timed_on_a_rerun():
    timer = FakeTimer()
    runner = CompilingRunner(timer)
    engine = make_engine(runner=runner, timer=timer)
    replay(engine, [Request(0, 0.0, 8, 2)], wait=False)
    assert [row[1] for row in engine.recorder.timeline] == [1.0, 1.0]
    assert len(runner.batches) == 3  # the first step ran twice
    assert engine.recorder.requests[0].status is RequestStatus.FINISHED


def test_host_probe_runs_between_steps_on_the_virtual_clock_only():
    from gpu_backend.engine.hostprobe import PROBE_ITERATIONS, HostProbe, summarize
    from gpu_backend.engine.replay import replay

    engine = make_engine()
    probe = HostProbe(every_s=0.0)  # every step
    replay(engine, [Request(0, 0.0, 20, 4), Request(1, 0.0, 12, 3)], wait=False, host_probe=probe)
    assert len(probe.samples) == len(engine.steps) and min(probe.samples) > 0
    assert probe.summary()["count"] == len(engine.steps)
    rare = HostProbe(every_s=3600.0)
    rare.maybe(), rare.maybe()
    assert len(rare.samples) == 1  # at most once per interval
    with pytest.raises(ValueError, match="virtual clock only"):
        replay(make_engine(), [Request(0, 0.0, 20, 4)], wait=True, host_probe=HostProbe())
    stats = summarize([0.010, 0.007, 0.008, 0.030, 0.009])
    assert stats["median_s"] == 0.009 and stats["iterations"] == PROBE_ITERATIONS
    assert summarize([])["median_s"] is None
