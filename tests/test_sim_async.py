"""The simulator under async scheduling, on hand-worked cases: a step is scheduled as the one
before it starts, and its overhead loses the host gap (`Efficiency.host_gap_s`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import simpy

from sim.core.catalog import get_gpu, get_model
from sim.core.cost_model import CostArgs, CostModel, Efficiency, step_total_array, step_total_s
from sim.core.elastic import Policy, VmmCostModel
from sim.core.engine_config import EngineConfig, build_core
from sim.core.step import SchedulerOutput
from sim.engine import Replica
from sim.fleet import Fleet
from sim.recording.metrics import timeline_array
from sim.runner import RunSpec, simulate
from traces import Trace

# one second of overhead per step, far above any device time here; launches cost nothing;
# nothing hidden by async scheduling unless a test says so
SLOW_STEPS = Efficiency(step_overhead_s=1.0, per_seq_overhead_s=0.0, eager_launch_s=0.0,
                        host_gap_s=0.0)


def config(asynchronous: bool) -> EngineConfig:
    return EngineConfig(model=get_model("llama-3.1-8b"), gpu=get_gpu("h200"),
                        async_scheduling=asynchronous)


def trace(arrival_s, prompt_tokens, output_tokens) -> Trace:
    return Trace(arrival_s=np.asarray(arrival_s, dtype=np.float64),
                 prompt_tokens=np.asarray(prompt_tokens, dtype=np.int64),
                 output_tokens=np.asarray(output_tokens, dtype=np.int64), source="hand-built")


def requests(asynchronous: bool, t: Trace, efficiency: Efficiency = SLOW_STEPS):
    result = simulate(RunSpec(config(asynchronous), efficiency=efficiency), t)
    return {r.request_id: r for r in result.recorders[0].requests}


class SingleStepReplica(Replica):
    _decode_run_limit = None  # type: ignore[assignment]


def step_starts(t: Trace, efficiency: Efficiency) -> list[float]:
    """Every step's start, each step scheduled alone (async scheduling)."""
    env = simpy.Environment()
    fleet = Fleet(env, t.requests(), "round-robin")
    engine = config(True)
    replica = SingleStepReplica(env, 0, build_core(engine), CostModel.for_engine(engine,
                                                                                  efficiency),
                                fleet)
    fleet.replicas.append(replica)
    env.process(fleet.arrivals(env))
    env.process(replica.run(env))
    env.run()
    return timeline_array(replica.recorder)[:, 0].tolist()


def test_step_total_on_hand_worked_numbers():
    # device 3, launch 2, a quarter of the shorter serial, overhead 1.5
    assert step_total_s(3.0, 2.0, 0.25, 1.5) == 3.0 + 0.5 + 1.5
    # launched ahead: the launches overlap the step before, so no serial share; the overhead
    # less the hidden host time
    assert step_total_s(3.0, 2.0, 0.25, 1.5, hidden_s=0.5) == 3.0 + 1.0
    assert step_total_s(3.0, 2.0, 0.25, 1.5, hidden_s=2.0) == 3.0  # never below the longer
    device = np.array([3.0, 3.0, 1.0])
    launch = np.array([2.0, 2.0, 0.0])
    overheads = (np.array([1.0, 1.5, 0.1]), 0.5)  # added in order
    assert step_total_array(device, launch, 0.25, *overheads).tolist() == [5.0, 5.5, 1.6]
    assert step_total_array(device, launch, 0.25, *overheads,
                            hidden_s=0.75).tolist() == [3.75, 4.25, 1.0]


def test_async_scheduling_takes_the_host_gap_off_every_step():
    eff = Efficiency(step_overhead_s=2e-3, per_seq_overhead_s=0.0, host_gap_s=5e-4)
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h200")
    sync = CostModel(model, gpu, efficiency=eff)
    ahead = CostModel(model, gpu, efficiency=eff, host_hidden=True)
    out = SchedulerOutput(step_id=1, scheduled=(), num_steps=1, num_prefill_tokens=0,
                          num_decode_tokens=8, prefill_chunks=(), decode_context_tokens=8_000,
                          preempted_ids=(), elastic=None, oom=None, num_sampled_rows=8)
    assert sync.step(out).total_s - ahead.step(out).total_s == pytest.approx(5e-4, abs=1e-12)
    assert (sync.decode_run_s(8, 8_000, 3) - ahead.decode_run_s(8, 8_000, 3)) == \
        pytest.approx([5e-4] * 3, abs=1e-12)


def test_a_decode_step_hides_its_own_gap_and_a_prefill_step_the_host_gap():
    eff = Efficiency(step_overhead_s=2e-3, per_seq_overhead_s=0.0, host_gap_s=5e-4,
                     decode_host_gap_s=8e-4)
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h200")
    sync = CostModel(model, gpu, efficiency=eff)
    ahead = CostModel(model, gpu, efficiency=eff, host_hidden=True)
    decode = SchedulerOutput(step_id=1, scheduled=(), num_steps=1, num_prefill_tokens=0,
                             num_decode_tokens=8, prefill_chunks=(),
                             decode_context_tokens=8_000, preempted_ids=(), elastic=None,
                             oom=None, num_sampled_rows=8)
    prefill = SchedulerOutput(step_id=2, scheduled=(), num_steps=1, num_prefill_tokens=512,
                              num_decode_tokens=0, prefill_chunks=((512, 0),),
                              decode_context_tokens=0, preempted_ids=(), elastic=None,
                              oom=None, num_sampled_rows=1)
    assert sync.step(decode).total_s - ahead.step(decode).total_s == pytest.approx(8e-4, abs=1e-12)
    assert (sync.decode_run_s(8, 8_000, 3) - ahead.decode_run_s(8, 8_000, 3)) == \
        pytest.approx([8e-4] * 3, abs=1e-12)
    # a prefill step's launches overlap the step before too, so compare its overhead only
    assert ahead.step(prefill).hidden_s == 5e-4 and sync.step(prefill).hidden_s == 0.0


def test_a_lone_request_decodes_faster_by_the_decode_gap():
    """As below, with the decode steps' own gap: each decode step launched behind another
    hides 0.75 s of its 1 s overhead, the prompt's step (on an idle replica) none."""
    t = trace([0.0], [100], [10])
    hidden = replace(SLOW_STEPS, host_gap_s=1.0, decode_host_gap_s=0.75)
    (ahead,) = requests(True, t, hidden).values()
    (sync,) = requests(False, t, hidden).values()
    assert ahead.first_token_s == pytest.approx(sync.first_token_s, abs=1e-12)
    assert (sync.finish_s - sync.first_token_s) - (ahead.finish_s - ahead.first_token_s) == \
        pytest.approx(9 * 0.75, abs=1e-9)


def test_a_lone_request_decodes_faster_by_the_host_gap():
    """Each step's 1 s of overhead is all host gap: hidden under async scheduling behind the
    step before, so not in the first step, which starts on an idle replica."""
    t = trace([0.0], [100], [10])
    hidden = replace(SLOW_STEPS, host_gap_s=1.0)
    (ahead,) = requests(True, t, hidden).values()
    (sync,) = requests(False, t, hidden).values()
    assert 1.0 < ahead.first_token_s == pytest.approx(sync.first_token_s, abs=1e-12)
    assert (sync.finish_s - sync.first_token_s) - (ahead.finish_s - ahead.first_token_s) == \
        pytest.approx(9.0, abs=1e-9)


def test_a_step_after_an_elastic_pause_hides_no_host_work():
    """Elastic: the reserve is lent before the decodes (an attach), which waits for the
    prompt's step to drain, so the first decode step has nothing to hide behind: of nine
    decode steps, eight lose the 1 s host gap."""
    t = trace([0.0], [100], [10])
    hidden = replace(SLOW_STEPS, host_gap_s=1.0)
    runs = []
    for asynchronous in (False, True):
        engine = replace(config(asynchronous), policy=Policy.ELASTIC)
        result = simulate(RunSpec(engine, efficiency=hidden), t)
        assert result.summary["num_attach"] == 1
        (req,) = result.recorders[0].requests
        runs.append(req.finish_s - req.first_token_s)
    assert runs[0] - runs[1] == pytest.approx(8.0, abs=1e-9)


def test_a_detach_behind_a_step_off_the_reserve_waits_for_no_drain():
    """Each step's 1 s of overhead is all host gap. A prompt arriving during the decodes takes
    the reserve back; the decode in flight holds no elastic block (its KV fits the base), so
    the engine unmaps behind it and the prompt's step hides its host gap: it takes its device
    time only, well under a second, and starts as the step before ends; that decode ran the
    detach's time longer (the unmap holds the device back). The step after the attach waited
    for the device (1 s or more), as did the first step."""
    t = trace([0.0, 5.5], [100, 100], [3000, 5])
    hidden = replace(SLOW_STEPS, host_gap_s=1.0)
    engine = replace(config(True), policy=Policy.ELASTIC)
    result = simulate(RunSpec(engine, efficiency=hidden), t)
    assert result.summary["num_detach"] == 1 and result.summary["num_attach"] == 2
    rows = timeline_array(result.recorders[0])
    start, duration, prefill, lent = rows[:, 0], rows[:, 1], rows[:, 3], rows[:, 8]
    (second_prompt,) = np.flatnonzero((prefill > 0) & (start > 5.0))
    assert lent[second_prompt - 1] > 0 and lent[second_prompt] == 0  # the detach between
    assert duration[second_prompt] < 0.1
    assert start[second_prompt] == pytest.approx(start[second_prompt - 1]
                                                 + duration[second_prompt - 1], abs=1e-12)
    # the decode in flight ran the detach's time longer than with a detach that costs nothing
    detach_s = result.summary["detach_time_s"]
    assert 0 < detach_s < 0.01
    measured = VmmCostModel(reclaim=engine.reclaim).measured  # what the run priced
    free = replace(measured, detach_handle_s=0.0, detach_gib_s=0.0)
    costless = timeline_array(simulate(RunSpec(engine, efficiency=hidden, vmm_costs=free),
                                       t).recorders[0])
    assert costless[second_prompt, 0] == pytest.approx(start[second_prompt] - detach_s, abs=1e-9)
    assert duration[second_prompt - 1] - costless[second_prompt - 1, 1] == pytest.approx(
        detach_s, abs=1e-9)
    after_attach = np.flatnonzero((lent[1:] > 0) & (lent[:-1] == 0)) + 1
    assert len(after_attach) == 2 and (duration[after_attach] >= 1.0).all()
    assert duration[0] >= 1.0
    waiting = simulate(RunSpec(replace(engine, detach_behind_step=False), efficiency=hidden), t)
    rows = timeline_array(waiting.recorders[0])
    (second_prompt,) = np.flatnonzero((rows[:, 3] > 0) & (rows[:, 0] > 5.0))
    assert rows[second_prompt, 1] >= 1.0  # the step after a detach that waited: exposed


def test_a_request_arriving_during_a_step_runs_one_step_later():
    """Steps of about 1 s from t=0. Request 1 arrives at 5.5 s, during step 6. Synchronously
    it is scheduled as step 6 ends and has its first token as step 7 ends (about 7 s).
    Scheduled ahead, step 7 was scheduled as step 6 started, so request 1 runs in step 8."""
    t = trace([0.0, 5.5], [100, 100], [20, 3])
    sync, ahead = requests(False, t), requests(True, t)
    assert 7.0 < sync[1].first_token_s < 7.2
    assert 8.0 < ahead[1].first_token_s < 8.2
    assert 0.99 < ahead[1].first_token_s - sync[1].first_token_s < 1.01
    assert ahead[0].finish_s == pytest.approx(sync[0].finish_s, abs=1e-9)


def test_an_arrival_as_a_step_starts_is_seen_by_the_step_scheduled_then():
    """An arrival at the very start of step 6 is seen by the schedule made then (step 7); a
    moment later it waits for step 8: the engine's schedule for step N+1 follows the
    collection of step N-1, as the replay's arrivals at or before a step's end."""
    starts = step_starts(trace([0.0], [100], [20]), SLOW_STEPS)
    assert len(starts) == 20
    boundary = starts[5]  # step 6 starts
    exact = requests(True, trace([0.0, boundary], [100, 100], [20, 3]))
    later = requests(True, trace([0.0, boundary + 1e-6], [100, 100], [20, 3]))
    assert exact[1].first_token_s == pytest.approx(starts[7], abs=0.05)  # step 7 ends
    assert later[1].first_token_s == pytest.approx(starts[8], abs=0.05)  # step 8 ends


@pytest.mark.parametrize("asynchronous", [False, True])
def test_every_request_ends_once_scheduled_ahead_or_not(asynchronous):
    t = trace(np.linspace(0.0, 2.0, 40), [300 + 50 * (i % 7) for i in range(40)],
              [5 + (i % 11) for i in range(40)])
    result = simulate(RunSpec(config(asynchronous)), t)
    assert result.summary["num_finished"] == 40
    reqs = result.recorders[0].requests
    assert all(r.arrival_s < r.first_token_s <= r.finish_s for r in reqs)


def test_a_fit_prices_an_async_engines_steps_with_the_host_gap_hidden():
    """What a fit prices with (CostArgs.for_engine, used by validation's held-out fits and
    `validation fit`) takes the engine's async flag, as the simulator's cost model does: the
    same decode step is the host gap shorter for the async engine, and no shorter for a
    profile's synchronous grid (CostArgs' default)."""
    eff = Efficiency(step_overhead_s=2e-3, per_seq_overhead_s=0.0, host_gap_s=5e-4)
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h200")
    out = SchedulerOutput(step_id=1, scheduled=(), num_steps=1, num_prefill_tokens=0,
                          num_decode_tokens=8, prefill_chunks=(), decode_context_tokens=8_000,
                          preempted_ids=(), elastic=None, oom=None, num_sampled_rows=8)
    sync_s = CostArgs.for_engine(config(False)).cost_model(eff).step(out).total_s
    async_s = CostArgs.for_engine(config(True)).cost_model(eff).step(out).total_s
    assert sync_s - async_s == pytest.approx(5e-4, abs=1e-12)
    assert CostArgs(model, gpu).cost_model(eff).step(out).total_s == pytest.approx(sync_s)
    assert CostModel.for_engine(config(True), eff).step(out).total_s == pytest.approx(async_s)
