"""Async scheduling on the CPU: step N+1 scheduled and launched before step N is collected.

The tiny model must give every request the tokens the synchronous engine gives it (decode
rows read their input ids from the step in flight, through the eager, decode-graph and
piecewise paths, across preemption and migration); the fake runner's device queue checks the
clock: a request arriving during a step waits one step more, and a step lasts the device's
time when the host's work fits behind it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_engine_helpers import (
    TINY,
    FakeRunner,
    FakeTimer,
    TickTimer,
    prefill_of_request_one,
    tiny_cpu_model,
    toy_config,
    toy_core,
)
from test_engine_smoke import MIGRATION, REQUESTS, CpuDecodeGraphs

from gpu_backend.engine.engine import STEP_COLUMNS, InFlight
from gpu_backend.engine.memory import kv_caches_of
from gpu_backend.engine.piecewise import PiecewiseGraphs
from gpu_backend.engine.replay import engine_summary, replay
from gpu_backend.engine.setup import assemble_engine, plain_store
from sim.core.elastic import DrainStrategy, Policy
from sim.core.request import RequestStatus
from sim.core.step import ElasticAction, ElasticActionKind
from traces import Request


@pytest.fixture(scope="module")
def model():
    yield from tiny_cpu_model()


def run(model, policy=Policy.STATIC, *, asynchronous: bool, num_kv_blocks=48,
        requests=REQUESTS, drain=DrainStrategy.PREEMPT, graphs=False, piecewise=False,
        **config_changes):
    """`requests` replayed on the tiny CPU model; `config_changes`: toy_config's others."""
    config = toy_config(policy, drain, async_scheduling=asynchronous, **config_changes)
    core = toy_core(config, num_kv_blocks)
    store = plain_store(core, "cpu", torch.float32)
    caches = kv_caches_of(store, TINY.num_layers)
    decode_graphs = pieces = None
    if graphs:
        decode_graphs = CpuDecodeGraphs(model, caches, 8, 256, 16, torch.device("cpu"))
        decode_graphs.capture()
    if piecewise:
        pieces = PiecewiseGraphs(model, caches, 64, torch.device("cpu"), sizes=(16, 32, 64))
        pieces.capture()
    engine = assemble_engine(core, model, store, torch.device("cpu"), decode_graphs, seed=3,
                             piecewise=pieces)
    engine.mirror.keep_outputs = True
    # each call moves time on: a step reads the timer once synchronously, twice async
    engine.timer = TickTimer(0.5 if asynchronous else 1.0)
    replay(engine, requests, wait=False)
    return engine


@pytest.mark.parametrize("kind", ["eager", "graphs", "piecewise"])
def test_async_steps_give_every_request_the_synchronous_tokens(model, kind):
    reference = run(model, asynchronous=False, num_kv_blocks=400).mirror.outputs
    engine = run(model, asynchronous=True, num_kv_blocks=400, graphs=kind == "graphs",
                 piecewise=kind == "piecewise")
    assert engine.mirror.outputs == reference
    runner = engine.runner
    if kind == "graphs":
        assert runner.num_graph_steps > 10
    if kind == "piecewise":
        assert runner.num_piecewise_steps >= len(REQUESTS)
    assert not engine.has_unfinished() and engine.scheduler.pool.num_used_blocks == 0


def test_async_steps_keep_tokens_through_preemption_and_migration(model):
    reference = run(model, asynchronous=False, num_kv_blocks=400).mirror.outputs
    tight = run(model, asynchronous=True, num_kv_blocks=12, graphs=True)
    assert sum(r.num_preemptions for r in tight.recorder.requests) > 0
    assert tight.mirror.outputs == reference
    moved_reference = run(model, asynchronous=False, num_kv_blocks=400,
                          requests=MIGRATION).mirror.outputs
    migrated = run(model, Policy.ELASTIC, asynchronous=True, num_kv_blocks=30,
                   requests=MIGRATION, drain=DrainStrategy.MIGRATE, graphs=True)
    summary = engine_summary(migrated, {})
    assert summary["migrated_bytes"] > 0 and summary["num_attach"] > 0
    assert migrated.mirror.outputs == moved_reference
    migrated.scheduler.pool.check_invariants()


def fake_engine(runner, timer, policy=Policy.STATIC):
    core = toy_core(toy_config(policy, async_scheduling=True), 48)
    engine = assemble_engine(core, None, plain_store(core, "cpu", torch.float32),
                             torch.device("cpu"), None)
    engine.runner, engine.timer = runner, timer
    return engine


def test_a_request_arriving_during_a_step_is_scheduled_one_step_later():
    """Steps of 1 s from t=0. Step 2 is scheduled while step 1 runs, so request 1, arriving
    as step 1 ends, runs in step 3 (the synchronous engine runs it in step 2: 2.0 s) and
    request 2 (1.5 s) in step 4; an idle engine schedules an arrival at once."""
    timer = FakeTimer()
    engine = fake_engine(FakeRunner(timer, step_s=1.0), timer)
    requests = [Request(0, 0.0, 8, 3), Request(1, 1.0, 8, 1), Request(2, 1.5, 8, 1),
                Request(3, 100.0, 8, 1)]
    end_s = replay(engine, requests, wait=False)
    first = {r.request_id: r.first_token_s for r in engine.recorder.requests}
    finish = {r.request_id: r.finish_s for r in engine.recorder.requests}
    assert first == {0: 1.0, 1: 3.0, 2: 4.0, 3: 101.0}
    assert finish == {0: 3.0, 1: 3.0, 2: 4.0, 3: 101.0}
    assert end_s == 101.0
    starts = [row[STEP_COLUMNS.index("start_s")] for row in engine.steps]
    assert starts == [0.0, 1.0, 2.0, 3.0, 100.0]
    assert [row[STEP_COLUMNS.index("measured_s")] for row in engine.steps] == [1.0] * 5


def test_host_work_hides_behind_the_step_in_flight():
    """0.4 s of host work to launch a step of 1 s on the device: synchronously each step
    takes 1.4 s; async, every step after the first takes the device's 1 s."""
    requests = [Request(0, 0.0, 8, 6)]
    timer = FakeTimer()
    engine = fake_engine(FakeRunner(timer, step_s=1.0, host_s=0.4), timer)
    replay(engine, requests, wait=False)
    measured = [row[STEP_COLUMNS.index("measured_s")] for row in engine.steps]
    assert measured == pytest.approx([1.4] + [1.0] * 5)
    (req,) = engine.recorder.requests
    assert req.first_token_s == pytest.approx(1.4)
    assert req.finish_s == pytest.approx(6.4)


def test_a_real_oom_in_a_launched_step_fails_it_and_the_step_in_flight_finishes():
    timer = FakeTimer()
    engine = fake_engine(FakeRunner(timer, fail_when=prefill_of_request_one), timer)
    requests = [Request(0, 0.0, 40, 2), Request(1, 1.0, 40, 4), Request(2, 10.0, 20, 4)]
    replay(engine, requests, wait=False)
    status = {r.request_id: r.status for r in engine.recorder.requests}
    assert status == {0: RequestStatus.FINISHED, 1: RequestStatus.FAILED_OOM,
                      2: RequestStatus.FINISHED}
    assert engine.num_real_oom == 1
    # request 0 finished in step 2, collected after step 3 (request 1's prompt) failed
    finish = {r.request_id: r.finish_s for r in engine.recorder.requests}
    assert finish[0] == 2.0
    assert 1 not in engine.mirror.tokens
    engine.scheduler.pool.check_invariants()
    assert engine.scheduler.pool.num_used_blocks == 0


def elastic_actions(engine) -> list[tuple[int, str, bool]]:
    """Wraps the engine's elastic executor: (step id, kind, waited) of every action run."""
    actions, apply = [], engine.elastic.apply

    def recorded(out, wait=True):
        actions.append((out.step_id, out.elastic.kind.value, wait))
        return apply(out, wait)

    engine.elastic.apply = recorded
    return actions


@pytest.mark.parametrize("arrival_s, waits", [(50.0, True), (5.0, False)])
def test_a_detach_waits_for_the_step_in_flight_only_if_it_touches_the_reserve(arrival_s, waits):
    """Steps of 1 s on the device and 0.4 s of host work to launch each. Three requests on 12
    base blocks: the two long ones outgrow the base into the reserve (lent from step 3) once
    the short one has finished, and a prompt arriving at `arrival_s` makes the engine take the
    reserve back. Arriving at 50 s, the step before the detach held elastic blocks, so the
    detach waits for it and the step after is exposed (1.4 s, as after every attach); at 5 s
    no elastic block was in use, the reserve is unmapped behind the step in flight, and the
    step after hides its host work (1.0 s)."""
    timer = FakeTimer()
    runner = FakeRunner(timer, step_s=1.0, host_s=0.4)
    core = toy_core(toy_config(Policy.ELASTIC, async_scheduling=True), 12)
    engine = assemble_engine(core, None, plain_store(core, "cpu", torch.float32),
                             torch.device("cpu"), None)
    engine.runner, engine.timer = runner, timer
    actions = elastic_actions(engine)
    requests = [Request(0, 0.0, 40, 12), Request(1, 0.0, 40, 60), Request(2, 0.0, 40, 60),
                Request(9, arrival_s, 16, 5)]
    replay(engine, requests, wait=False)
    summary = engine_summary(engine, {})
    assert summary["num_finished"] == 4
    assert summary["measured"]["num_detach_behind_step"] == (0 if waits else 1)
    measured = {row[0]: row[STEP_COLUMNS.index("measured_s")] for row in engine.steps}
    detaches = [(step, wait) for step, kind, wait in actions if kind == "detach"]
    attaches = [step for step, kind, _ in actions if kind == "attach"]
    assert len(detaches) == 1 and len(attaches) == 2
    ((detach_step, waited),) = detaches
    assert waited is waits
    assert measured[detach_step] == pytest.approx(1.4 if waits else 1.0)
    assert all(measured[step] == pytest.approx(1.4) for step in attaches)
    # the step in flight at the detach held an elastic block exactly when it waited
    first_elastic = engine.elastic.block_id_offset + engine.elastic.num_core_base_blocks
    before = runner.batches[[row[0] for row in engine.steps].index(detach_step) - 1]
    assert (int(before.block_tables.max()) >= first_elastic) is waits


def test_the_engine_waits_for_a_step_in_flight_whose_tables_hold_elastic_blocks():
    """Whatever the core's flag says, the engine never unmaps under a launched table that
    points into the reserve."""
    timer = FakeTimer()
    engine = fake_engine(FakeRunner(timer), timer, Policy.ELASTIC)
    detach = ElasticAction(ElasticActionKind.DETACH, 1, 0.0, needs_idle_device=False)
    assert engine._needs_idle_device(detach)  # nothing in flight: the plain path
    first_elastic = engine.elastic.block_id_offset + engine.elastic.num_core_base_blocks
    for top, waits in ((first_elastic - 1, False), (first_elastic, True)):
        tables = np.array([[1, top]], dtype=np.int32)
        batch = SimpleNamespace(block_tables=tables)
        engine._in_flight = InFlight(None, None, object(), batch, False, None, 0.0, (0.0,) * 3)
        assert engine._needs_idle_device(detach) is waits
        assert engine._needs_idle_device(detach._replace(needs_idle_device=True))
    engine._in_flight = None


def test_an_elastic_action_keeps_step_rows_apart_in_time():
    timer = FakeTimer()
    engine = fake_engine(FakeRunner(timer, step_s=0.1), timer, Policy.ELASTIC)
    requests = [Request(i, 0.0, 24, 30) for i in range(4)] + [Request(9, 3.0, 40, 5)]
    replay(engine, requests, wait=False)
    summary = engine_summary(engine, {})
    assert summary["num_finished"] == 5
    assert summary["num_attach"] >= 1 and summary["num_detach"] >= 1
    # a step recorded after an elastic pause starts after it: rows never overlap in time
    starts = [row[STEP_COLUMNS.index("start_s")] for row in engine.steps]
    ends = [s + row[STEP_COLUMNS.index("measured_s")] for s, row in zip(starts, engine.steps)]
    assert all(b >= a - 1e-12 for a, b in zip(ends, starts[1:]))


class CompilingRunner(FakeRunner):
    """The launch of its third step 'compiles' for 100 s of host time."""

    def __init__(self, timer):
        super().__init__(timer, step_s=1.0)
        self.num_launches = 0
        self.compiling = False

    def launch(self, batch, after=None):
        self.num_launches += 1
        self.compiling = self.num_launches == 3
        if self.compiling:
            self.timer.t += 100.0
        return super().launch(batch, after)

    def compiled_since_last_call(self) -> bool:
        compiled, self.compiling = self.compiling, False
        return compiled


def test_a_compile_stalls_no_step_and_the_compiling_step_runs_again():
    """The compile happens while step 2 runs: step 3 is launched again (its input ids read
    from step 2's on the host), and neither step carries the 100 s."""
    timer = FakeTimer()
    runner = CompilingRunner(timer)
    engine = fake_engine(runner, timer)
    replay(engine, [Request(0, 0.0, 8, 5)], wait=False)
    measured = [row[STEP_COLUMNS.index("measured_s")] for row in engine.steps]
    assert len(measured) == 5 and max(measured) <= 1.0
    assert runner.num_launches == 6  # the third step twice
    (req,) = engine.recorder.requests
    assert req.status is RequestStatus.FINISHED and req.finish_s <= 5.0
    # step 3's second launch reads its input id from step 2's ids on the host: the same
    # token as the first launch's device-side feed gave
    third, again = runner.batches[2], runner.batches[3]
    assert third.input_ids.tolist() == again.input_ids.tolist()


def test_a_slow_launch_overlaps_the_step_in_flight_which_is_stamped_when_it_ended():
    """Prompt steps take 1.5 s of host to launch (an eager step's Python loop); decode steps
    launch at once; every step runs 1 s on the device. Request 1 (arriving at 2.6 s) is
    scheduled into step 4 at 3.5 s; its launch ends at 5.0 s, while step 3 (request 0's
    decode) ended on the device at 4.5 s: step 3 is collected at 5.0 s but its token is
    stamped 4.5 s, and step 4 runs from 5.0 s to 6.0 s (1.5 s after step 3's end)."""
    def prompt(batch):
        return batch.max_query_len > 1

    timer = FakeTimer()
    runner = FakeRunner(timer, step_s=1.0, host_s=1.5, slow_launch=prompt)
    engine = fake_engine(runner, timer)
    replay(engine, [Request(0, 0.0, 8, 6), Request(1, 2.6, 8, 2)], wait=False)
    measured = [row[STEP_COLUMNS.index("measured_s")] for row in engine.steps]
    starts = [row[STEP_COLUMNS.index("start_s")] for row in engine.steps]
    assert measured == [2.5, 1.0, 1.0, 1.5, 1.0, 1.0]
    assert starts == [0.0, 2.5, 3.5, 4.5, 6.0, 7.0]
    first = {r.request_id: r.first_token_s for r in engine.recorder.requests}
    finish = {r.request_id: r.finish_s for r in engine.recorder.requests}
    assert first == {0: 2.5, 1: 6.0}
    assert finish == {0: 8.0, 1: 7.0}
