"""Fleet sizing: the pruned search against brute force, the bounds against simulations, runs
that stop early against runs to the end, and the command line."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from sim.planning.bounds import cacheable_tokens, work_bound
from sim.planning.cases import Case, EngineOptions, SyntheticSpec, TraceSpec, build_trace
from sim.planning.fleet import FleetQuery, Objective, grid_cases, run_fleet
from sim.planning.parallel import Executor
from sim.planning.stretch import busiest, choose_stretch
from sim.planning.sustain import Sustain, run_watched
from sim.planning.sweep import fit_error
from sim.recording.metrics import Slo
from sim.runner import simulate
from traces import LengthDist, Trace

QUIET = Executor(workers=1, show_progress=False)
MAX_REPLICAS = 7
# 150 prompts of 1-4k tokens in 2.5 s on L4/A10G-class GPUs: 3 to 6 replicas are needed, and
# which TP, chunk and GPU is cheapest differs by objective.
HEAVY = TraceSpec(synthetic=SyntheticSpec(150, 60.0, LengthDist.uniform(1024, 4096),
                                          LengthDist.uniform(8, 32), seed=3))
TTFT_ONLY = Sustain(Slo(ttft_s=0.5), 0.95)
COSTS = (("l4", 0.8), ("a10g", 1.0))


def heavy_query(objective: Objective = Objective.GPUS, rule: Sustain = TTFT_ONLY) -> FleetQuery:
    return FleetQuery(model="qwen2.5-1.5b", gpus=("l4", "a10g"), tps=(1, 2),
                      chunks=(512, 2048), policies=("static",), trace=HEAVY, rule=rule,
                      gpu_costs=COSTS, objective=objective, max_replicas=MAX_REPLICAS,
                      num_runners_up=2, max_requests=None, calibration="none")


def brute_force() -> dict[Objective, list[tuple[int, int, float]]]:
    """Every configuration from 1 replica up, run to the end and judged on its summary, to
    its fewest passing replicas (and one more, which must pass too); per objective, (grid
    index, replicas, cost) ranked as the search ranks its answers."""
    cases, _ = grid_cases(heavy_query())
    trace = build_trace(HEAVY)
    fewest = []
    for index, case in enumerate(cases):
        if fit_error(case) is not None:
            continue
        for n in range(1, MAX_REPLICAS + 1):
            summary = simulate(replace(case, num_replicas=n).run_spec(), trace).summary
            if TTFT_ONLY.check(summary).ok:
                fewest.append((index, case, n, summary["ttft_s"]["p99"]))
                more = simulate(replace(case, num_replicas=n + 1).run_spec(), trace).summary
                assert TTFT_ONLY.check(more).ok  # monotone in replicas, as the search assumes
                break
    ranked = {}
    for objective in Objective:
        price = dict(COSTS) if objective is Objective.COST else {"l4": 1, "a10g": 1}
        keys = sorted((n * case.tp * price[case.gpu], n * case.tp, ttft, index, n)
                      for index, case, n, ttft in fewest)
        ranked[objective] = [(index, n, cost) for cost, _, _, index, n in keys]
    return ranked


@pytest.fixture(scope="module")
def brute() -> dict[Objective, list[tuple[int, int, float]]]:
    return brute_force()


@pytest.mark.parametrize("objective", list(Objective))
def test_pruned_search_finds_the_brute_force_answer_and_runners_up(brute, objective):
    expected = brute[objective]
    assert len(expected) >= 3  # the case has an answer and runners-up to check
    result = run_fleet(heavy_query(objective), QUIET)
    got = [(s.index, s.replicas, s.cost(s.replicas)) for s in result.ranked[:3]]
    assert got == expected[:3]
    assert result.num_runs < len(expected) * MAX_REPLICAS / 2  # the bounds pruned


def test_answers_differ_by_objective(brute):
    """Fewest GPUs and lowest $/hour pick different configurations here, so the test above
    checks both rankings, not one answer twice."""
    assert brute[Objective.GPUS][0][0] != brute[Objective.COST][0][0]


def test_parallel_rounds_give_the_serial_answer():
    query = replace(heavy_query(), gpus=("a10g",), chunks=(2048,))
    serial = run_fleet(query, QUIET)
    parallel = run_fleet(query, Executor(workers=2, show_progress=False))
    assert [(s.index, s.replicas) for s in parallel.ranked] == [
        (s.index, s.replicas) for s in serial.ranked]


# ------------------------------------------------------------------------------- bounds
@pytest.mark.parametrize("model, gpu, tp, chunk, policy, scale", [
    ("qwen2.5-1.5b", "l4", 1, 512, "static", 1.0),
    ("qwen2.5-1.5b", "a10g", 2, 2048, "elastic", 0.25),
    ("llama-3.2-1b", "h100", 1, 8192, "static", 4.0),
    ("qwen1.5-moe-a2.7b", "h200", 2, 2048, "static", 1.0),  # MoE: weights read per expert
    ("deepseek-v2-lite", "h200", 1, 4096, "static", 1.0),  # MLA: one latent per token
])
def test_work_bound_is_below_the_simulated_engine_time(model, gpu, tp, chunk, policy, scale):
    case = Case(model, gpu, tp, chunk, policy, HEAVY)
    trace = build_trace(HEAVY).scaled(scale)
    summary = simulate(case.run_spec(), trace).summary
    assert summary["num_finished"] == len(trace)
    bound_s = work_bound(case, trace, Sustain(Slo(1.0, 0.1))).seconds()
    assert 0 < bound_s <= summary["busy_s"]


def test_work_bound_holds_with_prefix_caching_on_shared_prompts():
    """Requests that share their first hash blocks can skip those tokens' prefill; the bound
    leaves out at most those (and a request sharing nothing keeps all of its tokens)."""
    rows = [(1, 2, 3), (1, 2, 4), (1, 2, 3), (9,), (1, 5)]
    trace = Trace(np.arange(5) * 0.01, np.array([1600, 1600, 1600, 500, 1100]),
                  np.array([20] * 5), block_hashes=rows, hash_block_tokens=512)
    assert cacheable_tokens(trace, 16, 512).tolist() == [1536, 1024, 1536, 0, 512]
    case = Case("qwen2.5-0.5b", "h100", 1, 512, "static", HEAVY,
                options=EngineOptions(enable_prefix_caching=True))
    summary = simulate(case.run_spec(), trace).summary
    assert summary["num_cached_tokens"] > 0
    assert work_bound(case, trace, Sustain(Slo(1.0, 0.1))).seconds() <= summary["busy_s"]


def test_fewer_replicas_than_the_bound_fail_in_simulation():
    trace = build_trace(HEAVY)
    cases, _ = grid_cases(heavy_query())
    checked = 0
    for case in (c for c in cases if fit_error(c) is None):
        bound = work_bound(case, trace, TTFT_ONLY).min_replicas(TTFT_ONLY.min_attainment)
        assert bound >= 2  # the bound prunes something here
        below = simulate(replace(case, num_replicas=bound - 1).run_spec(), trace).summary
        assert not TTFT_ONLY.check(below).ok
        checked += 1
    assert checked >= 4


def test_rates_above_the_bounds_ceiling_fail_in_simulation():
    case = Case("qwen2.5-1.5b", "l4", 1, 2048, "static", HEAVY)
    trace = build_trace(HEAVY)
    ceiling = work_bound(case, trace, TTFT_ONLY).max_rate_scale(trace, TTFT_ONLY)
    assert ceiling is not None and ceiling > 0
    summary = simulate(case.run_spec(), trace.scaled(ceiling * 1.01)).summary
    assert not TTFT_ONLY.check(summary).ok


def test_a_configuration_the_memory_bound_refuses_cannot_run():
    case = Case("llama-3.1-70b", "l4", 1, 2048, "static", HEAVY)
    assert "does not fit" in fit_error(case)
    with pytest.raises(ValueError, match="does not fit"):
        simulate(case.run_spec(), build_trace(HEAVY))
    result = run_fleet(replace(heavy_query(), model="llama-3.1-70b", gpus=("l4",), tps=(1,),
                               chunks=(2048,)), QUIET)
    assert result.answer is None and result.num_runs == 0


# ------------------------------------------------------------------------- early stops
def test_a_run_stopped_early_fails_when_run_to_the_end_and_a_passing_one_is_not_stopped():
    case = Case("qwen2.5-1.5b", "l4", 1, 2048, "static", HEAVY)
    trace = build_trace(HEAVY)
    for n, rule in ((1, TTFT_ONLY), (2, Sustain(Slo(0.5, 0.02), 0.9)), (6, TTFT_ONLY)):
        trial = run_watched(replace(case, num_replicas=n), trace, rule)
        full = simulate(replace(case, num_replicas=n).run_spec(), trace).summary
        assert trial.verdict.ok == rule.check(full).ok
        if trial.verdict.ok:
            assert not trial.stopped_early and trial.summary["num_finished"] == len(trace)
    stopped = run_watched(case, trace, TTFT_ONLY)
    assert stopped.stopped_early and "stopped after" in stopped.verdict.text


def test_an_overloaded_run_never_meets_the_targets():
    summary = {"overloaded": True, "queue_at_last_arrival": 120, "queue_growth_req_s": 3.5,
               "ttft_s": {"p99": 0.1}, "tpot_s": {"p99": 0.01}, "goodput_req_s": 1.0,
               "makespan_s": 10.0, "num_requests": 10}
    verdict = Sustain(Slo(1.0, 0.1)).check(summary)
    assert not verdict.ok and "120 requests waiting" in verdict.text and "+3.50" in verdict.text


# ----------------------------------------------------------------------------- stretch
def test_busiest_stretch_is_the_densest_run_of_work():
    arrival = np.array([0.0, 10, 20, 21, 22, 23, 40, 50])
    work = np.ones(8)
    assert busiest(work, arrival, 4) == 2  # 20-23 s: four requests in 3 s
    work[7] = 100.0
    assert busiest(work, arrival, 2) == 6  # 40-50 s holds the heavy request


def test_a_long_trace_is_searched_on_a_stretch_the_output_names():
    case = Case("qwen2.5-1.5b", "l4", 1, 2048, "static", HEAVY)
    spec, stretch = choose_stretch(HEAVY, case, 40)
    assert stretch is not None and stretch.num_requests == 40 and len(build_trace(spec)) == 40
    assert f"busiest 40 of {len(build_trace(HEAVY))}" in stretch.note()
    assert choose_stretch(HEAVY, case, 1000) == (HEAVY, None)


# ------------------------------------------------------------------------ command line
def test_fleet_command_answers_in_gpus_with_runners_up(capsys):
    from sim.planning.cli import main

    args = ["plan", "fleet", "--trace", "azure-conv", "--limit", "150", "--rate-scale", "40",
            "--model", "qwen2.5-1.5b", "--gpu", "a10g", "--tp", "1,2", "--chunk", "2048",
            "--policy", "static", "--slo-ttft", "0.5", "--max-replicas", "7", "--workers", "1",
            "--no-progress", "--calibration", "none", "--runners-up", "1", "--json"]
    assert main(args) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["answer"]["line"].startswith(f"{out['answer']['replicas']} replicas x TP")
    assert len(out["runners_up"]) == 1


@pytest.mark.parametrize("extra, says", [
    (["--gpu-cost", "l4=cheap"], "--gpu-cost 'l4=cheap': give GPU=DOLLARS_PER_GPU_HOUR"),
    (["--gpu-cost", "l4=1", "--gpu", "l4,a10g"], "--gpu-cost has no price for a10g"),
    (["--slo-ttft", "0"], "--slo-ttft/--slo-ttft-p99: give a number above 0"),
])
def test_fleet_command_refuses_bad_prices_and_targets(capsys, extra, says):
    from sim.planning.cli import main

    assert main(["plan", "fleet", "--trace", "azure-conv", "--model", "qwen2.5-1.5b",
                 *extra]) == 2
    assert says in capsys.readouterr().err
