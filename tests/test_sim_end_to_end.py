"""End-to-end SimPy runs: conservation, causality, hand-computed latencies, policies, replicas.

Every test runs the real simulator (`sim.runner.simulate`, or the same `Fleet`/`Replica`
pieces wired by hand) on short slices of the bundled traces or on small hand-built traces,
so the whole file takes a few seconds.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from core_helpers import make_scheduler, request

from sim.core.catalog import get_gpu, get_model
from sim.core.cost_model import CostModel
from sim.core.elastic import Policy
from sim.core.engine_config import EngineConfig, build_core
from sim.core.request import RequestStatus
from sim.engine import Replica
from sim.fleet import Fleet
from sim.recording.metrics import TIMELINE_COLUMNS, ReplicaRecorder, timeline_array
from sim.runner import RunSpec, simulate
from traces import Trace, load_trace

SLICE_REQUESTS = 300
LLAMA_8B = get_model("llama-3.1-8b")
H200 = get_gpu("h200")


def engine(policy: Policy = Policy.STATIC, **changes) -> EngineConfig:
    return EngineConfig(model=LLAMA_8B, gpu=H200, policy=policy, **changes)


def hand_trace(arrival_s, prompt_tokens, output_tokens) -> Trace:
    return Trace(
        arrival_s=np.asarray(arrival_s, dtype=np.float64),
        prompt_tokens=np.asarray(prompt_tokens, dtype=np.int64),
        output_tokens=np.asarray(output_tokens, dtype=np.int64),
        source="hand-built",
    )


@pytest.fixture(scope="module")
def slices() -> dict[str, Trace]:
    names = ("azure-conv", "azure-code", "mooncake-conv")
    return {name: load_trace(name).head(SLICE_REQUESTS) for name in names}


def all_requests(recorders: list[ReplicaRecorder]):
    return [r for rec in recorders for r in rec.requests]


# ------------------------------------------------------------------ conservation, causality
@pytest.mark.parametrize("trace_name", ["azure-conv", "azure-code", "mooncake-conv"])
@pytest.mark.parametrize("policy", list(Policy))
def test_bundled_slice_conserves_requests_and_time_moves_forward(slices, trace_name, policy):
    trace = slices[trace_name]
    result = simulate(RunSpec(engine(policy)), trace)
    check_conservation_and_causality(result, len(trace))


def check_conservation_and_causality(result, num_requests: int) -> None:
    s = result.summary
    assert s["num_requests"] == num_requests
    assert s["num_finished"] + s["num_rejected"] + s["num_failed_oom"] == s["num_requests"]
    assert s["num_finished"] > 0
    for req in all_requests(result.recorders):
        if req.status is RequestStatus.FINISHED:
            assert req.arrival_s <= req.first_token_s <= req.finish_s
            assert req.num_output_tokens == req.max_output_tokens
        else:
            assert req.status in (RequestStatus.REJECTED, RequestStatus.FAILED_OOM)
            assert req.finish_s is None
    for rec in result.recorders:
        tl = timeline_array(rec)
        start_s = tl[:, TIMELINE_COLUMNS.index("start_s")]
        end_s = start_s + tl[:, TIMELINE_COLUMNS.index("duration_s")]
        assert np.all(np.diff(start_s) >= 0)
        assert np.all(end_s[:-1] <= start_s[1:] + 1e-9), "engine steps overlap"
        used = tl[:, TIMELINE_COLUMNS.index("kv_blocks_used")]
        assert np.all(used <= tl[:, TIMELINE_COLUMNS.index("kv_blocks_usable")])
    assert s["num_engine_steps"] >= max(r.max_output_tokens for r in all_requests(result.recorders)
                                        if r.status is RequestStatus.FINISHED)


@pytest.mark.parametrize("policy", list(Policy))
def test_mooncake_prefix_cache_slice_conserves_requests(slices, policy):
    # Prefix caching is slow per step today (see the report), so a shorter slice.
    trace = slices["mooncake-conv"].head(100)
    result = simulate(RunSpec(engine(policy, enable_prefix_caching=True)), trace)
    check_conservation_and_causality(result, len(trace))
    assert result.summary["num_cached_tokens"] > 0
    # counted once per request, at its first admission, so never more than its prompt
    for req in result.recorders[0].requests:
        assert req.num_cached_tokens <= req.num_prompt_tokens


def test_admission_counts_prefix_hits_taken_out_of_the_free_pool():
    sched = make_scheduler(12, enable_prefix_caching=True, hash_block_tokens=32, block_size=16,
                           max_num_batched_tokens=1000)
    sched.add_request(request(0, prompt=64, output=1, hashes=(1, 2)))  # 4 blocks, then cached
    sched.add_request(request(1, prompt=32, output=100))  # keeps 2 blocks busy
    sched.update(sched.schedule(), 1.0)
    # 6 free + 4 cached-free blocks; the new request hits the 4 cached and needs 7 more.
    sched.add_request(request(2, prompt=161, output=1, hashes=(1, 2, 3, 4, 5, 6)))
    out = sched.schedule()
    assert [s.request_id for s in out.scheduled] == [1]  # it must wait, not crash


def test_mooncake_rejects_only_prompts_longer_than_max_model_len(slices):
    trace = slices["mooncake-conv"]
    result = simulate(RunSpec(engine()), trace)
    max_len = result.core.scheduler.config.max_model_len
    too_long = (trace.prompt_tokens + trace.output_tokens) > max_len
    assert result.summary["num_rejected"] == int(too_long.sum())


# --------------------------------------------------------------- hand-computed latencies
# Synchronous steps, each priced in full (tests/test_sim_async.py works the async ones).
def test_single_request_ttft_is_the_predicted_chunked_prefill_time():
    chunk = 2048
    arrival_s = 1.5
    result = simulate(RunSpec(engine(max_num_batched_tokens=chunk, async_scheduling=False)),
                      hand_trace([arrival_s], [3000], [4]))
    cost = CostModel(LLAMA_8B, H200)
    eff = cost.eff
    # The scheduler must cut 3000 prompt tokens into 2048 + 952; only the second samples.
    first = (cost.linear_s(2048) + cost.prefill_attention_s(((2048, 0),)) + cost.logits_s(0)
             + eff.step_overhead_s + eff.per_seq_overhead_s)
    second = (cost.linear_s(952) + cost.prefill_attention_s(((952, 2048),)) + cost.logits_s(1)
              + eff.step_overhead_s + eff.per_seq_overhead_s)
    (req,) = all_requests(result.recorders)
    assert req.first_token_s - req.arrival_s == pytest.approx(first + second, rel=1e-12)
    assert result.summary["ttft_s"]["p50"] == pytest.approx(first + second, rel=1e-12)
    timeline = timeline_array(result.recorders[0])
    prefill = timeline[:, TIMELINE_COLUMNS.index("prefill_tokens")]
    assert prefill[:2].tolist() == [2048, 952]
    assert timeline[0, TIMELINE_COLUMNS.index("start_s")] == arrival_s


def test_decode_only_batch_tpot_is_the_predicted_decode_step():
    num_reqs, prompt, output = 8, 100, 50
    result = simulate(RunSpec(engine(async_scheduling=False)),
                      hand_trace([0.0] * num_reqs, [prompt] * num_reqs, [output] * num_reqs))
    cost = CostModel(LLAMA_8B, H200)
    eff = cost.eff
    # One prefill step of 8 x 100 tokens samples every first token ...
    prefill = (cost.linear_s(num_reqs * prompt)
               + cost.prefill_attention_s(((prompt, 0),) * num_reqs)
               + cost.logits_s(num_reqs) + eff.step_overhead_s + eff.per_seq_overhead_s * num_reqs)
    # ... then 49 decode steps of 8 rows whose contexts start at 101 tokens and grow by one.
    decode_s = [cost.linear_s(num_reqs) + cost.decode_attention_s(num_reqs * (prompt + k))
                + cost.logits_s(num_reqs) + eff.step_overhead_s
                + eff.per_seq_overhead_s * num_reqs for k in range(1, output)]
    expected_tpot_s = sum(decode_s) / (output - 1)
    np.testing.assert_allclose(cost.decode_run_s(num_reqs, num_reqs * (prompt + 1), output - 1),
                               decode_s, rtol=1e-12)
    for req in all_requests(result.recorders):
        assert req.first_token_s == pytest.approx(prefill, rel=1e-12)
        tpot_s = (req.finish_s - req.first_token_s) / (output - 1)
        assert tpot_s == pytest.approx(expected_tpot_s, rel=1e-9)
    assert result.summary["tpot_s"]["p50"] == pytest.approx(expected_tpot_s, rel=1e-9)
    assert result.summary["num_engine_steps"] == output


# ---------------------------------------------------------------------------- policies
def long_prompt_burst() -> tuple[EngineConfig, Trace]:
    """Llama-3.1-8B on an A100-40GB: 60 prompts of 8000 tokens, 2000 outputs each, every
    50 ms. KV fills past the base pool while later prompts still need their prefill."""
    config = EngineConfig(model=LLAMA_8B, gpu=get_gpu("a100-40gb"), max_num_batched_tokens=8192,
                          max_model_len=16384)
    n = 60
    trace = hand_trace(np.arange(n) * 0.05, [8000] * n, [2000] * n)
    return config, trace


def test_elastic_lends_capacity_without_oom_and_overcommit_reports_oom():
    config, trace = long_prompt_burst()
    runs = {p: simulate(RunSpec(config.with_(policy=p)), trace).summary for p in Policy}
    static, elastic, over = runs[Policy.STATIC], runs[Policy.ELASTIC], runs[Policy.OVERCOMMIT]
    assert elastic["kv_capacity_tokens"] == static["kv_capacity_tokens"]
    assert elastic["kv_capacity_lent_tokens"] > static["kv_capacity_lent_tokens"]
    assert elastic["reserve_lent_tokens_max"] > 0 and elastic["num_attach"] > 0
    for summary in (static, elastic):
        assert summary["num_oom"] == 0 and summary["num_failed_oom"] == 0
        assert summary["num_finished"] == len(trace)
    assert elastic["num_preemptions"] <= static["num_preemptions"]
    assert over["num_oom"] > 0 and over["num_failed_oom"] > 0
    assert over["num_finished"] + over["num_failed_oom"] + over["num_rejected"] == len(trace)


@pytest.mark.parametrize("trace_name", ["azure-conv", "azure-code"])
def test_elastic_never_ooms_and_lends_at_least_static_capacity(slices, trace_name):
    trace = slices[trace_name]
    static = simulate(RunSpec(engine(Policy.STATIC)), trace).summary
    elastic = simulate(RunSpec(engine(Policy.ELASTIC)), trace).summary
    assert elastic["kv_capacity_lent_tokens"] >= static["kv_capacity_lent_tokens"]
    assert elastic["num_oom"] == 0 and elastic["num_failed_oom"] == 0
    assert elastic["num_finished"] == static["num_finished"] == len(trace)


# ------------------------------------------------------------------ decode-run fast-forward
class SingleStepReplica(Replica):
    """A replica whose scheduler is never offered a decode run: every step is scheduled."""

    _decode_run_limit = None  # type: ignore[assignment]


def run_fleet(spec: RunSpec, trace: Trace, replica_cls: type[Replica]) -> list[ReplicaRecorder]:
    """The wiring of `sim.runner.simulate`, with the replica class as a parameter."""
    env = simpy.Environment()
    fleet = Fleet(env, trace.requests(), spec.router)
    cost = CostModel.for_engine(spec.engine)
    replicas = [replica_cls(env, replica_id, build_core(spec.engine), cost, fleet)
                for replica_id in range(spec.num_replicas)]
    fleet.replicas.extend(replicas)
    env.process(fleet.arrivals(env))
    for replica in replicas:
        env.process(replica.run(env))
    env.run()  # ends when no event is left: every replica idle, every request arrived
    return [r.recorder for r in replicas]


@pytest.mark.parametrize("policy,asynchronous", [(Policy.STATIC, False), (Policy.ELASTIC, False),
                                                 (Policy.STATIC, True), (Policy.ELASTIC, True)])
def test_decode_runs_give_the_same_times_as_single_steps(slices, policy, asynchronous):
    trace = slices["azure-code"].head(150)
    spec = RunSpec(engine(policy, max_num_seqs=64, async_scheduling=asynchronous))
    fast = run_fleet(spec, trace, Replica)
    slow = run_fleet(spec, trace, SingleStepReplica)
    fast_tl, slow_tl = timeline_array(fast[0]), timeline_array(slow[0])
    steps = TIMELINE_COLUMNS.index("num_steps")
    assert fast_tl[:, steps].max() > 1, "no decode run happened; the test would prove nothing"
    assert slow_tl[:, steps].max() == 1
    assert fast_tl[:, steps].sum() == slow_tl[:, steps].sum()
    for f, s in zip(all_requests(fast), all_requests(slow)):
        assert (f.request_id, f.status, f.num_preemptions) == (s.request_id, s.status,
                                                                s.num_preemptions)
        assert f.first_token_s == pytest.approx(s.first_token_s, rel=1e-9, abs=1e-9)
        assert f.finish_s == pytest.approx(s.finish_s, rel=1e-9, abs=1e-9)
    # a run takes its blocks up front; its KV use must still count as step by step (to the
    # run's mean step: its steps differ by a token of KV read per sequence per step)
    for recorders in (fast, slow):
        recorders[0].flush()
    kv_use = [r[0].totals.summary(16)["kv_utilization_mean"] for r in (fast, slow)]
    assert kv_use[0] == pytest.approx(kv_use[1], rel=1e-4)


def test_simulate_matches_the_hand_wired_fleet(slices):
    trace = slices["azure-conv"].head(100)
    spec = RunSpec(engine())
    via_runner = simulate(spec, trace)
    by_hand = run_fleet(spec, trace, Replica)
    assert [r.finish_s for r in all_requests(via_runner.recorders)] == \
        [r.finish_s for r in all_requests(by_hand)]


# ------------------------------------------------------------------ determinism, replicas
def test_two_runs_give_identical_summaries(slices):
    spec = RunSpec(engine(Policy.ELASTIC))
    first = simulate(spec, slices["azure-conv"]).summary
    second = simulate(spec, slices["azure-conv"]).summary
    first.pop("sim_wall_s"), second.pop("sim_wall_s")
    assert first == second


def test_round_robin_splits_requests_evenly(slices):
    trace = slices["azure-conv"].head(200)
    result = simulate(RunSpec(engine(), num_replicas=2, router="round-robin"), trace)
    counts = [len(rec.requests) for rec in result.recorders]
    assert counts == [100, 100]
    ids = [[r.request_id for r in rec.requests] for rec in result.recorders]
    assert ids[0] == list(range(0, 200, 2)) and ids[1] == list(range(1, 200, 2))
    assert result.summary["num_finished"] == 200
    assert result.summary["num_replicas"] == 2


@pytest.mark.parametrize("policy", [Policy.STATIC, Policy.ELASTIC])
def test_a_round_robin_replica_runs_as_its_share_of_the_trace_alone(slices, policy):
    """Replicas share nothing, so each must give the times and the steps it gives alone on
    its share; a decode run cut at other replicas' arrivals would record more steps."""
    trace = slices["azure-conv"].head(240)
    fleet = simulate(RunSpec(engine(policy), num_replicas=3, router="round-robin"), trace)
    steps = TIMELINE_COLUMNS.index("num_steps")
    for replica_id, recorder in enumerate(fleet.recorders):
        alone = simulate(RunSpec(engine(policy)), trace.select(np.arange(replica_id, 240, 3)))
        rows, alone_rows = timeline_array(recorder), timeline_array(alone.recorders[0])
        assert rows[:, steps].max() > 1, "no decode run happened; the test would prove nothing"
        assert len(rows) == len(alone_rows)
        assert rows[:, steps].sum() == alone_rows[:, steps].sum()
        for mine, own in zip(recorder.requests, alone.recorders[0].requests):
            assert mine.first_token_s == pytest.approx(own.first_token_s, rel=1e-9, abs=1e-9)
            assert mine.finish_s == pytest.approx(own.finish_s, rel=1e-9, abs=1e-9)


def test_least_tokens_routes_away_from_the_loaded_replica():
    # Request 0 is long; requests 1 and 2 arrive while it is still running.
    trace = hand_trace([0.0, 0.001, 0.002, 0.003], [10_000, 50, 50, 50], [1000, 10, 10, 10])
    least = simulate(RunSpec(engine(), num_replicas=2, router="least-tokens"), trace)
    ids = [[r.request_id for r in rec.requests] for rec in least.recorders]
    assert ids == [[0], [1, 2, 3]]
    robin = simulate(RunSpec(engine(), num_replicas=2, router="round-robin"), trace)
    assert [[r.request_id for r in rec.requests] for rec in robin.recorders] == [[0, 2], [1, 3]]
    assert least.summary["num_finished"] == robin.summary["num_finished"] == 4


def test_unknown_router_is_rejected():
    with pytest.raises(ValueError, match="unknown router"):
        simulate(RunSpec(engine(), num_replicas=2, router="random"),
                 hand_trace([0.0], [10], [2]))
