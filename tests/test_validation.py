"""Validation math without a GPU: relative errors, gains, targets, step tables, divergence."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from validation.compare import (
    RunPair,
    check_targets,
    compare_metrics,
    gains,
    metric_values,
    relative_error,
)
from validation.divergence import find_divergence, first_difference
from validation.runs import trace_slice
from validation.step_table import StepTable, chunk_pairs, parse_chunks, read_steps_csv


def summary(ttft_p50: float, throughput: float, kv: int, preemptions: int = 0) -> dict:
    return {"ttft_s": {"p50": ttft_p50, "p99": 2 * ttft_p50}, "tpot_s": {"p50": 0.01, "p99": 0.02},
            "e2e_s": {"p50": 1.0}, "throughput_tok_s": throughput, "kv_capacity_tokens": kv,
            "kv_capacity_lent_tokens": kv, "num_preemptions": preemptions, "num_attach": 0,
            "attach_time_s": 0.0, "num_detach": 0, "detach_time_s": 0.0}


# ------------------------------------------------------------------ errors, gains, targets
def test_relative_error_signs_zeros_and_missing():
    assert relative_error(110.0, 100.0) == pytest.approx(0.10)
    assert relative_error(90.0, 100.0) == pytest.approx(-0.10)
    assert relative_error(0.0, 0.0) == 0.0
    assert relative_error(3.0, 0.0) is None  # no relative error against a zero measurement
    assert relative_error(None, 1.0) is None and relative_error(1.0, None) is None


def test_median_steepness_is_wide_between_two_groups_of_requests():
    from validation.compare import median_steepness

    even = np.linspace(1.0, 3.0, 201)  # p45 1.9, p50 2.0, p55 2.1
    assert median_steepness(even) == pytest.approx(0.2 / 2.0)
    # half the requests wait behind a long step (10 -> 20): the median sits on the jump
    two_groups = np.r_[np.full(100, 10.0), np.full(100, 20.0)]
    assert median_steepness(two_groups) == pytest.approx(10.0 / 15.0)
    assert median_steepness(np.array([np.nan, 5.0])) is None  # one finite value
    assert median_steepness(np.zeros(4)) is None


def test_compare_metrics_on_hand_made_summaries():
    predicted = metric_values(summary(0.2, 1100.0, 1000))
    measured = metric_values(summary(0.25, 1000.0, 1010), measured_kv_tokens=980.0)
    rows = compare_metrics(predicted, measured)
    assert rows["ttft_p50_s"]["relative_error"] == pytest.approx(-0.2)
    assert rows["ttft_p99_s"]["relative_error"] == pytest.approx(-0.2)
    assert rows["throughput_tok_s"]["relative_error"] == pytest.approx(0.1)
    assert rows["kv_capacity_tokens"]["measured"] == 980.0  # the measured blocks win
    assert rows["kv_capacity_tokens"]["difference"] == pytest.approx(20.0)


def test_cached_tokens_are_compared_and_a_summary_without_them_stays_missing():
    predicted = metric_values({**summary(0.2, 1100.0, 1000), "num_cached_tokens": 4096})
    measured = metric_values({**summary(0.2, 1000.0, 1000), "num_cached_tokens": 5120})
    row = compare_metrics(predicted, measured)["num_cached_tokens"]
    assert (row["predicted"], row["measured"], row["difference"]) == (4096.0, 5120.0, -1024.0)
    assert row["relative_error"] == pytest.approx(-0.2)
    old = compare_metrics(predicted, metric_values(summary(0.2, 1000.0, 1000)))
    assert old["num_cached_tokens"]["measured"] is None  # not 0: it was never recorded
    assert old["num_cached_tokens"]["relative_error"] is None


def test_gains_of_elastic_over_static_same_and_smaller_chunk():
    def pair(policy, chunk, p_thr, m_thr, p_ttft, m_ttft):
        return RunPair(policy, chunk, metric_values(summary(p_ttft, p_thr, 1000)),
                       metric_values(summary(m_ttft, m_thr, 1000)))

    runs = [pair("static", 2048, 1000, 1000, 0.30, 0.30),
            pair("static", 8192, 900, 950, 0.20, 0.25),
            pair("elastic", 8192, 1080, 1045, 0.22, 0.24)]
    rows = {(g["run"], g["baseline"]): g["metrics"] for g in gains(runs)}
    assert set(rows) == {("elastic/chunk=8192", "static/chunk=8192"),
                         ("elastic/chunk=8192", "static/chunk=2048")}
    same = rows[("elastic/chunk=8192", "static/chunk=8192")]["throughput_tok_s"]
    assert same["predicted_gain"] == pytest.approx(0.2)
    assert same["measured_gain"] == pytest.approx(0.1)
    assert same["gain_error"] == pytest.approx(0.1)
    assert same["same_direction"] is True
    ttft = rows[("elastic/chunk=8192", "static/chunk=8192")]["ttft_p50_s"]
    assert ttft["predicted_gain"] == pytest.approx(0.1)
    assert ttft["measured_gain"] == pytest.approx(-0.04)
    assert ttft["same_direction"] is False  # predicted worse, measured better: wrong decision
    smaller = rows[("elastic/chunk=8192", "static/chunk=2048")]["throughput_tok_s"]
    assert smaller["predicted_gain"] == pytest.approx(0.08)
    assert smaller["measured_gain"] == pytest.approx(0.045)


def test_targets_use_median_or_max_and_fail_without_values():
    def run(ttft_err, kv_err):
        rows = {m: {"relative_error": 0.0} for m in
                ("ttft_p50_s", "tpot_p50_s", "throughput_tok_s", "ttft_p99_s")}
        rows["ttft_p50_s"] = {"relative_error": ttft_err}
        rows["kv_capacity_tokens"] = {"relative_error": kv_err}
        return rows

    results = {t["metric"]: t for t in check_targets([run(0.01, 0.0), run(-0.04, 0.0),
                                                      run(0.30, 0.03)])}
    assert results["ttft_p50_s"]["value"] == pytest.approx(0.04)  # median of 1%, 4%, 30%
    assert results["ttft_p50_s"]["passed"]
    assert results["kv_capacity_tokens"]["value"] == pytest.approx(0.03)  # max
    assert not results["kv_capacity_tokens"]["passed"]
    missing = {t["metric"]: t for t in check_targets([run(None, None)])}
    assert not missing["ttft_p50_s"]["passed"]


def test_reserve_share_target_is_in_points_not_relative():
    # 0.7% measured, 1.5% predicted: 114% off relatively, but 0.8 points: within 2 points
    close = {"reserve_share": {"relative_error": 1.14, "difference": 0.008}}
    far = {"reserve_share": {"relative_error": 0.2, "difference": -0.03}}  # 15% vs 12%
    result = {t["metric"]: t for t in check_targets([close])}["reserve_share"]
    assert result["measure"] == "points" and result["value"] == pytest.approx(0.008)
    assert result["passed"]
    result = {t["metric"]: t for t in check_targets([close, far])}["reserve_share"]
    assert result["value"] == pytest.approx(0.03) and not result["passed"]  # max over runs


# --------------------------------------------------------------------------- step tables
def test_chunk_parsing_and_pairs():
    assert parse_chunks("512:0;512:512") == [(512, 0), (512, 512)]
    assert parse_chunks("[[3, 4]]") == [(3, 4)]
    assert parse_chunks("") == []
    assert chunk_pairs([(2, 0), (4, 10)]) == pytest.approx(2 * 1 + 4 * 12)


def test_reads_gpu_backend_steps_csv_without_chunk_details(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("step_id,start_s,num_prefill_tokens,num_decode_tokens,decode_context_tokens,"
                    "num_seqs,measured_s,graph,lent_blocks,mapped_elastic_bytes,oom\n"
                    "1,0.0,100,0,0,1,0.01,0,0,0,0\n2,0.01,0,1,101,1,0.005,1,7,0,0\n")
    table = read_steps_csv(path)
    assert len(table) == 2 and not table.chunks_exact
    assert table.prefill_pairs[0] == pytest.approx(100 * 50)  # one chunk, no prefix assumed
    assert list(table.num_sampled_rows) == [1, 1]
    assert list(table.start_s) == [0.0, 0.01]
    assert table.extra["lent_blocks"][1] == 7


def test_trace_slice_from_gpu_summary_infers_head_and_checks_count():
    ts = trace_slice({"trace": "/gpu/box/traces/data/AzureLLMInferenceTrace_conv.csv",
                      "num_trace_requests": 25})
    assert ts.limit == 25
    assert len(ts.load()) == 25  # the GPU machine's path maps to the bundled file
    with pytest.raises(ValueError, match="replayed 26"):
        trace_slice({"trace": "azure-conv", "window_s": [0, 1e9], "num_trace_requests": 26,
                     "limit": 25}).load()
    with pytest.raises(ValueError, match="does not record its trace"):
        trace_slice({})


# ----------------------------------------------------------------------------- divergence
def steps(rows: list[tuple[int, int, int, int]], starts: list[float],
          durations: list[float]) -> StepTable:
    a = np.array(rows, dtype=np.int64).T
    return StepTable(a[0], a[1], a[3], a[2], a[1], np.zeros(len(rows)),
                     np.array(durations), extra={"start_s": np.array(starts)})


def test_divergence_at_known_step_explained_by_an_arrival():
    # (prefill, decode, seqs, context); step 2 admits request 1 in the GPU run only, because
    # its steps ran slower and request 1 (arriving at 0.25 s) was there when step 2 began.
    sim = steps([(100, 0, 1, 0), (0, 1, 1, 101), (0, 1, 1, 102)], [0.0, 0.1, 0.2],
                [0.1, 0.1, 0.1])
    gpu = steps([(100, 0, 1, 0), (0, 1, 1, 101), (50, 1, 2, 102)], [0.0, 0.13, 0.26],
                [0.13, 0.13, 0.2])
    arrivals = np.array([0.0, 0.25])
    assert first_difference(sim, gpu) == 2
    d = find_divergence(sim, gpu, arrivals)
    assert d.diverged and d.step_index == 2 and d.num_matching_steps == 2
    assert d.cause == "arrival_timing"
    assert "request(s) 1" in d.explanation and "simulated run" in d.explanation
    assert d.aligned_step_error["median_abs"] == pytest.approx(1 - 0.1 / 0.13)


def test_no_divergence_and_length_divergence():
    a = steps([(100, 0, 1, 0), (0, 1, 1, 101)], [0.0, 0.1], [0.1, 0.1])
    assert not find_divergence(a, a, np.array([0.0])).diverged
    shorter = a.take(slice(0, 1))
    d = find_divergence(shorter, a, np.array([0.0]))
    assert d.diverged and d.step_index == 1 and d.cause == "length"


def test_step_classes_split_time_and_error_by_kind_of_step():
    """Two small decode steps, one of 40 sequences, a prefill-only step and two mixed steps
    (chunks of 256 and 2048 tokens): each lands in its class with its own sums and errors."""
    from validation.steps import step_classes

    # (prefill tokens, decode tokens, measured s, predicted s)
    rows = [(0, 2, 0.010, 0.009), (0, 8, 0.012, 0.012), (0, 40, 0.020, 0.015),
            (1000, 0, 0.100, 0.110), (256, 30, 0.030, 0.015), (2048, 30, 0.060, 0.057)]
    pre, dec, meas, pred = (np.array(c, dtype=float) for c in zip(*rows))
    table = StepTable(pre.astype(np.int64), dec.astype(np.int64), (dec * 1000).astype(np.int64),
                      dec.astype(np.int64) + (pre > 0), dec.astype(np.int64) + (pre > 0),
                      np.zeros(len(rows)), meas)
    got = {c["class"]: c for c in step_classes(pred, table)}
    assert list(got) == ["decode, 1-8 sequences", "decode, 33+ sequences", "prefill only",
                         "mixed, chunk <= 512 tokens", "mixed, chunk > 512 tokens"]
    small = got["decode, 1-8 sequences"]
    assert small["count"] == 2
    assert small["measured_s"] == pytest.approx(0.022)
    assert small["predicted_s"] == pytest.approx(0.021)
    assert small["sum_error"] == pytest.approx(0.021 / 0.022 - 1)
    assert small["median_error"] == pytest.approx((-0.1 + 0.0) / 2)
    assert got["decode, 33+ sequences"]["sum_error"] == pytest.approx(-0.25)
    assert got["mixed, chunk <= 512 tokens"]["median_error"] == pytest.approx(-0.5)
    assert got["prefill only"]["median_measured_s"] == pytest.approx(0.1)


def test_large_chunks_over_a_long_cached_prefix_are_a_class_of_their_own():
    """A chunk of 2,048 over 8,192 cached keys or more is apart from the shorter prefixes'
    (the attention's price per key drifts with the prefix); a table that does not know its
    chunks' prefixes keeps them in one class."""
    from dataclasses import replace as swap

    from validation.steps import step_classes

    chunks = [((2048, 0),), ((2048, 4096),), ((2048, 8192),), ((1024, 0), (1024, 20000))]
    n = len(chunks)
    pre, dec = np.full(n, 2048), np.full(n, 16)
    recorded = np.empty(n, dtype=object)
    recorded[:] = chunks
    table = StepTable(pre, dec, dec * 1000, dec + 1, dec + 1, np.zeros(n),
                      np.array([0.08, 0.09, 0.10, 0.12]), prefill_chunks=recorded)
    predicted = np.array([0.08, 0.09, 0.11, 0.13])
    got = {c["class"]: c for c in step_classes(predicted, table)}
    assert list(got) == ["mixed, chunk > 512 tokens", "mixed, chunk > 512 tokens, 8,192+ keys "
                         "cached"]
    assert got["mixed, chunk > 512 tokens"]["count"] == 2
    assert got["mixed, chunk > 512 tokens"]["sum_error"] == pytest.approx(0.0)
    assert got["mixed, chunk > 512 tokens, 8,192+ keys cached"]["sum_error"] == pytest.approx(
        0.24 / 0.22 - 1)
    unknown = {c["class"] for c in step_classes(predicted, swap(table, chunks_exact=False))}
    assert unknown == {"mixed, chunk > 512 tokens"}
    # decode rows run apart: the same split
    apart = {c["class"]: c["count"] for c in step_classes(predicted, table, np.ones(n, bool))}
    assert apart == {"mixed, decode rows apart": 2, "mixed, decode rows apart, 8,192+ keys "
                     "cached": 2}


def test_tpot_attribution_retimes_only_the_steps_inside_each_window():
    """Four 1 s steps; request 0's decode window holds steps 1-3 (3 tokens after its first),
    request 1's steps 2-3; an unfinished request counts for nothing. With step 1 (the only
    step of 40 sequences) at 2 s: request 0's TPOT 4/3 s, request 1's 1 s, median 7/6 s."""
    from validation.attribution import tpot_attribution

    steps_ = steps([(0, 2, 2, 100), (0, 40, 40, 4000), (0, 2, 2, 100), (0, 2, 2, 100)],
                   [0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0])
    requests = {"status": np.array(["finished", "finished", "running"]),
                "output_tokens": np.array([4, 3, 5]),
                "first_token_s": np.array([1.0, 2.0, 1.0]),
                "finish_s": np.array([4.0, 4.0, 4.0])}
    got = tpot_attribution(steps_, requests, np.array([1.0, 2.0, 1.0, 1.0]))
    assert got["num_requests"] == 2
    assert got["measured_p50_s"] == pytest.approx(1.0)
    assert got["all_steps_error"] == pytest.approx(1 / 6)
    assert got["by_class"]["decode, 33+ sequences"] == pytest.approx(1 / 6)
    assert got["by_class"]["decode, 1-8 sequences"] == pytest.approx(0.0)
    assert tpot_attribution(steps_, None, np.ones(4)) is None


def test_ttft_attribution_carries_a_step_through_the_backlog_only():
    """Five 1 s steps: A (arrives at 0) and B (0.5) get their first tokens from the prefill
    steps 0 and 1, step 2 decodes, the engine idles until C arrives (4.5; step 3 starts at 5)
    and D (5.5) gets its first token from step 4, after a 0.5 s pause no arrival explains.
    Measured TTFTs 1, 1.5, 1.5 and 2 s. Every step at 2 s: A 2, B 3.5 (step 1 waits for step
    0), C 2.5 (step 3 starts at its own time, the idle gap absorbing the rest), D 4 (the pause
    kept): median 3 s. Step 1 alone at 2 s: B 2.5, the others as measured: median 1.75 s."""
    from validation.attribution import retimed_ends, ttft_attribution

    steps_ = steps([(100, 0, 1, 0), (100, 1, 2, 101), (0, 2, 2, 202), (100, 0, 1, 0),
                    (100, 1, 2, 101)], [0.0, 1.0, 2.0, 5.0, 6.5], [1.0] * 5)
    arrival, first = np.array([0.0, 0.5, 4.5, 5.5]), np.array([1.0, 2.0, 6.0, 7.5])
    requests = {"status": np.array(["finished"] * 4 + ["rejected"]),
                "arrival_s": np.append(arrival, 1.0),
                "first_token_s": np.append(first, np.nan)}
    measured_ends = retimed_ends(steps_, arrival, first, np.ones(5))
    assert measured_ends == pytest.approx([1.0, 2.0, 3.0, 6.0, 7.5])
    assert retimed_ends(steps_, arrival, first, np.full(5, 2.0)) == \
        pytest.approx([2.0, 4.0, 4.0, 7.0, 9.5])
    got = ttft_attribution(steps_, requests, np.full(5, 2.0))
    assert got["num_requests"] == 4
    assert got["measured_p50_s"] == pytest.approx(1.5)
    assert got["all_steps_error"] == pytest.approx(1.0)
    only_step_1 = ttft_attribution(steps_, requests, np.array([1.0, 2.0, 1.0, 1.0, 1.0]))
    assert only_step_1["all_steps_error"] == pytest.approx(1.75 / 1.5 - 1)
    assert ttft_attribution(steps_, None, np.ones(5)) is None
    no_starts = StepTable(steps_.num_prefill_tokens, steps_.num_decode_tokens,
                          steps_.decode_context_tokens, steps_.num_seqs,
                          steps_.num_sampled_rows, steps_.prefill_pairs, steps_.duration_s)
    assert ttft_attribution(no_starts, requests, np.ones(5)) is None


def padded_steps(tmp_path, rows: str):
    """(steps.csv of `rows` read back, Llama-3.1-8B and the H200): the padding tests' setup."""
    from sim.core.catalog import get_gpu, get_model

    path = tmp_path / "steps.csv"
    path.write_text("step_id,num_prefill_tokens,num_decode_tokens,decode_context_tokens,"
                    "num_seqs,num_sampled_rows,measured_s,prefill_chunks\n" + rows)
    return read_steps_csv(path), get_model("llama-3.1-8b"), get_gpu("h200")


def test_measured_steps_are_priced_as_the_engine_ran_them_padded(tmp_path):
    from sim.core.cost_model import CostModel, Efficiency
    from validation.steps import predict_step_times

    # a prefill, decodes of 20 rows (32-row graph) and 40 (eager)
    table, model, gpu = padded_steps(tmp_path, "1,300,0,0,1,1,0.02,300:0\n"
                                     "2,0,20,9000,20,20,0.007,\n3,0,40,9000,40,40,0.03,\n")
    eff = Efficiency(linear_serial_fraction=0.5, eager_launch_s=0.05)
    padded = CostModel(model, gpu, efficiency=eff, graph_sizes=(1, 8, 32))
    got = predict_step_times(padded, table)
    # each step as the model prices its SchedulerOutput-like composition (cost.step)
    from test_cost_model import output

    want = [padded.step(output(num_prefill=300, prefill_chunks=((300, 0),), num_rows=1)).total_s,
            padded.step(output(num_decode=20, decode_context=9000, num_rows=20,
                               num_seqs=20)).total_s,
            padded.step(output(num_decode=40, decode_context=9000, num_rows=40,
                               num_seqs=40)).total_s]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    exact = predict_step_times(CostModel(model, gpu, efficiency=eff), table)
    assert got[0] == exact[0] and got[1] > exact[1]  # the 20-row step pays 32 rows' weights
    assert got[2] == pytest.approx(0.05 + eff.step_overhead_s + 40 * eff.per_seq_overhead_s)


def test_graph_sizes_come_from_the_replay_summary():
    from validation.runs import engine_config

    base = {"model": "llama-3.1-8b", "gpu": "h200", "chunk": 2048, "policy": "static"}
    assert engine_config(base).cuda_graph_sizes == ()
    sized = engine_config({**base, "measured": {"graph_sizes": [8, 1, 2, 4]}})
    assert sized.cuda_graph_sizes == (1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"measured.graph_sizes is \[1, 'x'\]"):
        engine_config({**base, "measured": {"graph_sizes": [1, "x"]}})


def test_step_classes_report_the_median_phases_when_recorded(tmp_path):
    from validation.steps import step_classes

    path = tmp_path / "steps.csv"  # two decode steps and an eager prefill; device spans of a CPU
    path.write_text("step_id,num_prefill_tokens,num_decode_tokens,decode_context_tokens,"
                    "num_seqs,measured_s,build_s,enqueue_s,device_s\n"
                    "1,300,0,0,1,0.020,0.0004,0.0150,0.0190\n"
                    "2,0,4,900,4,0.006,0.0001,0.0003,nan\n"
                    "3,0,4,904,4,0.006,0.0003,0.0005,0.0055\n")
    table = read_steps_csv(path)
    rows = {r["class"]: r for r in step_classes(np.full(3, 0.01), table)}
    decode = rows["decode, 1-8 sequences"]["median_phases_s"]
    assert decode["build_s"] == pytest.approx(0.0002) and decode["enqueue_s"] == pytest.approx(0.0004)
    assert decode["device_s"] == pytest.approx(0.0055)  # the NaN (no CUDA events) left out
    assert rows["prefill only"]["median_phases_s"]["enqueue_s"] == pytest.approx(0.015)
    old = tmp_path / "old.csv"  # a replay from before the phases: none reported
    old.write_text(path.read_text().replace(",build_s,enqueue_s,device_s", "")
                   .replace(",0.0004,0.0150,0.0190", "").replace(",0.0001,0.0003,nan", "")
                   .replace(",0.0003,0.0005,0.0055", ""))
    assert all(r["median_phases_s"] is None
               for r in step_classes(np.full(3, 0.01), read_steps_csv(old)))


# ------------------------------------------------------------------ piecewise prefill graphs
def test_measured_prefill_steps_are_priced_at_their_piecewise_size(tmp_path):
    from sim.core.cost_model import CostModel, Efficiency
    from validation.steps import predict_step_times

    # a 300-token prefill, a 250 + 50 mixed step, a decode step, an empty step
    table, model, gpu = padded_steps(tmp_path, "1,300,0,0,1,1,0.02,300:0\n"
                                     "2,250,50,100000,51,51,0.03,250:700\n"
                                     "3,0,20,9000,20,20,0.007,\n4,0,0,0,0,0,0.001,\n")
    eff = Efficiency(linear_serial_fraction=0.5, eager_launch_s=0.004)
    padded = CostModel(model, gpu, efficiency=eff, graph_sizes=(1, 8, 32),
                       token_graph_sizes=(16, 256, 320))
    got = predict_step_times(padded, table)
    from test_cost_model import output

    want = [padded.step(output(num_prefill=300, prefill_chunks=((300, 0),), num_rows=1)).total_s,
            padded.step(output(num_prefill=250, prefill_chunks=((250, 700),), num_decode=50,
                               decode_context=100_000, num_rows=51, num_seqs=51)).total_s,
            padded.step(output(num_decode=20, decode_context=9000, num_rows=20,
                               num_seqs=20)).total_s,
            eff.step_overhead_s]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # the two prefill steps pay 320 tokens' linear layers instead of 300 (compute-bound: at
    # 0.73 of 989.4 TFLOP/s, and half the weight read's serial share, which fades as
    # weights^2 / compute: 2 bytes a parameter, as many bytes as FLOPs per token, at 0.71 of
    # 4.8 TB/s); the decode step is as before
    plain = predict_step_times(CostModel(model, gpu, efficiency=eff, graph_sizes=(1, 8, 32)),
                               table)
    flops_per_token = 2 * 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    weights_s = flops_per_token / (4.8e12 * 0.71)

    def linear_s(tokens: int) -> float:
        compute_s = tokens * flops_per_token / (989.4e12 * 0.73)
        return compute_s + 0.5 * weights_s ** 2 / compute_s
    extra_s = linear_s(320) - linear_s(300)
    np.testing.assert_allclose(got[:2] - plain[:2], [extra_s, extra_s], rtol=1e-9)
    assert got[2] == plain[2] and got[3] == plain[3]


def test_piecewise_sizes_come_from_the_replay_summary(tmp_path):
    from validation.runs import engine_config, load_run

    base = {"model": "llama-3.1-8b", "gpu": "h200", "chunk": 2048, "policy": "static"}
    assert engine_config(base).piecewise_graph_sizes == ()
    assert engine_config({**base, "measured": {"piecewise_sizes": None}}).piecewise_graph_sizes == ()
    sized = engine_config({**base, "measured": {"graph_sizes": [1, 2],
                                                "piecewise_sizes": [2048, 16, 320]}})
    assert sized.piecewise_graph_sizes == (16, 320, 2048) and sized.cuda_graph_sizes == (1, 2)
    for bad in ([16, "32"], [0, 16], "16,32", [True], 16):
        with pytest.raises(ValueError, match=r"summary.json: measured.piecewise_sizes is"):
            engine_config({**base, "measured": {"piecewise_sizes": bad}})
    folder = tmp_path / "static_chunk_2048"  # a replay folder names itself in the error
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(
        {**base, "measured": {"piecewise_sizes": [16, -1]}}))
    (folder / "steps.csv").write_text(STEPS_HEADER)
    with pytest.raises(ValueError, match=re.escape(f"{folder}/summary.json: "
                                                   "measured.piecewise_sizes is [16, -1]")):
        load_run(folder)


STEPS_HEADER = ("step_id,num_prefill_tokens,num_decode_tokens,decode_context_tokens,num_seqs,"
                "measured_s\n1,300,0,0,1,0.02\n")


def _replay(folder, piecewise_sizes):
    from validation.runs import load_run

    folder.mkdir(parents=True)
    measured = {} if piecewise_sizes == "absent" else {"piecewise_sizes": piecewise_sizes}
    (folder / "summary.json").write_text(json.dumps(
        {"model": "llama-3.1-8b", "chunk": 2048, "measured": measured}))
    (folder / "steps.csv").write_text(STEPS_HEADER)
    return load_run(folder)


def test_a_calibration_is_refused_for_replays_run_the_other_way(tmp_path):
    from validation.runs import check_calibration_graphs

    eager = _replay(tmp_path / "eager", None)
    old = _replay(tmp_path / "old", "absent")  # replays older than the option: eager
    piecewise = _replay(tmp_path / "piecewise", [16, 32, 2048])
    profiled = tmp_path / "piecewise.json"
    profiled.write_text(json.dumps({"efficiency": {}, "piecewise_sizes": [16, 32, 8192]}))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"efficiency": {}}))
    off = tmp_path / "off.json"
    off.write_text(json.dumps({"efficiency": {}, "piecewise_sizes": None}))
    # the same way (the sizes may differ with the chunk), or no calibration: accepted
    check_calibration_graphs(profiled, [piecewise])
    check_calibration_graphs(plain, [eager, old])
    check_calibration_graphs(off, [eager, old])
    check_calibration_graphs(None, [eager, piecewise])
    with pytest.raises(ValueError, match=re.escape(
            f"{profiled} was profiled with piecewise CUDA graphs but the replay in "
            f"{tmp_path / 'eager'} ran without them; re-profile without --piecewise-graphs")):
        check_calibration_graphs(profiled, [piecewise, eager])
    with pytest.raises(ValueError, match=re.escape(
            f"{plain} was profiled without piecewise CUDA graphs but the replay in "
            f"{tmp_path / 'piecewise'} ran with them; re-profile with --piecewise-graphs")):
        check_calibration_graphs(plain, [old, piecewise])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"efficiency": {}, "piecewise_sizes": "on"}))
    with pytest.raises(ValueError, match=re.escape(f"{bad}: piecewise_sizes is 'on'")):
        check_calibration_graphs(bad, [eager])


def test_replays_pool_into_one_fit_when_their_token_sizes_nest():
    from sim.core.cost_model import piecewise_capture_sizes
    from validation.calibrate import pooled_token_sizes

    small, large = piecewise_capture_sizes(2048), piecewise_capture_sizes(8192)
    # 2048 is on the capture grid: its sizes are the first 32 of 8192's (16 + 12 + 4)
    assert small == large[:32] and pooled_token_sizes([small, large, small]) == large
    assert pooled_token_sizes([(), ()]) == () and pooled_token_sizes([]) == ()
    # 1000 is not: its steps of 961..1000 tokens ran at 1000, 8192's sizes would say 1024
    assert pooled_token_sizes([piecewise_capture_sizes(1000), large]) is None
    assert pooled_token_sizes([(), small]) is None  # an eager replay beside a piecewise one


def test_one_fit_takes_runs_of_one_engine_and_names_what_differs():
    """A fit prices every step with one cost model: runs whose engines differ in anything it
    prices by (here the attention backend, which prices prefill attention; or async
    scheduling) are refused with the field and both values named, and runs of one engine
    give that engine's pricing with their pooled piecewise sizes."""
    from sim.core.catalog import get_gpu, get_model
    from sim.core.cost_model import CostArgs
    from sim.core.engine_config import EngineConfig
    from validation.calibrate import fit_pricing

    base = EngineConfig(model=get_model("llama-3.1-8b"), gpu=get_gpu("h200"))
    assert fit_pricing([base, base]) == (CostArgs.for_engine(base), ())
    with pytest.raises(ValueError, match=r"attention_backend: auto, triton"):
        fit_pricing([base, base.with_(attention_backend="auto")])
    with pytest.raises(ValueError, match=r"host_hidden: False, True"):
        fit_pricing([base.with_(async_scheduling=False), base])
    with pytest.raises(ValueError, match=r"gpu: h100-80gb, h200-141gb"):
        fit_pricing([base, base.with_(gpu=get_gpu("h100"))])


def test_steps_csv_extents_and_their_concatenation(tmp_path):
    """The longest query and sequence of each step, from the GPU engine's columns (chunks and
    the longest decode row), survive a split and a concatenation; a table without them makes
    the concatenation's unknown rather than misaligned."""
    from validation.calibrate import concat, split_tail

    path = tmp_path / "steps.csv"
    path.write_text("step_id,num_prefill_tokens,num_decode_tokens,decode_context_tokens,"
                    "num_seqs,measured_s,max_decode_context,prefill_chunks\n"
                    "1,300,0,0,1,0.01,0,300:0\n"
                    "2,0,3,3000,3,0.002,1500,\n"
                    "3,512,2,700,3,0.02,400,512:8192\n"
                    "4,96,1,2000,3,0.01,2000,64:0;32:100\n")
    table = read_steps_csv(path)
    assert table.max_query_len.tolist() == [300, 1, 512, 64]
    assert table.max_seq_len.tolist() == [300, 1500, 8704, 2000]
    head, tail = split_tail(table, 0.5)
    joined = concat([head, tail])
    assert joined.max_query_len.tolist() == [300, 1, 512, 64]
    assert joined.max_seq_len.tolist() == [300, 1500, 8704, 2000]
    unknown = concat([head, StepTable(**{**vars(tail), "max_seq_len": None})])
    assert unknown.max_seq_len is None and len(unknown) == 4
