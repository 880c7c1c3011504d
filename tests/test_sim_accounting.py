"""Nothing dropped unsaid, overload said, idle gaps skipped, rows streamed: the simulator's
accounting under odd inputs, on the real SimPy model (no mocks)."""

from __future__ import annotations

import csv
import time

import numpy as np
import pytest

from sim.core.catalog import get_gpu, get_model
from sim.core.engine_config import EngineConfig
from sim.core.request import RejectReason, RequestState, RequestStatus
from sim.recording.distribution import WeightedSample, merged_percentiles, weighted_percentiles
from sim.recording.metrics import ReplicaRecorder, request_table, summarize, timeline_array
from sim.recording.overload import QueueSamples
from sim.recording.sinks import REQUEST_COLUMNS, RequestCsv, TimelineCsv
from sim.runner import RunSpec, simulate
from traces import LengthDist, Trace, load_trace, synthetic

LLAMA_8B, H200 = get_model("llama-3.1-8b"), get_gpu("h200")


def engine(**changes) -> EngineConfig:
    return EngineConfig(model=LLAMA_8B, gpu=H200, **changes)


def hand_trace(arrival_s, prompt_tokens, output_tokens) -> Trace:
    return Trace(arrival_s=np.asarray(arrival_s, dtype=np.float64),
                 prompt_tokens=np.asarray(prompt_tokens, dtype=np.int64),
                 output_tokens=np.asarray(output_tokens, dtype=np.int64), source="hand-built")


# ------------------------------------------------------------------------------ rejection
def test_requests_over_max_model_len_are_rejected_counted_and_listed():
    # max_model_len 1,000: 900 + 100 fits exactly, 901 + 100 and 2,000 + 1 do not
    trace = hand_trace([0.0, 0.1, 0.2, 0.3], [900, 901, 2000, 50], [100, 100, 1, 10])
    result = simulate(RunSpec(engine(max_model_len=1000)), trace)
    s = result.summary
    assert (s["num_requests"], s["num_finished"], s["num_rejected"]) == (4, 2, 2)
    assert s["num_rejected_by_reason"] == {"exceeds_max_model_len": 2, "exceeds_kv_pool": 0}
    table = request_table(result.recorders[0].requests)
    assert table["reject_reason"].tolist() == ["", "exceeds_max_model_len",
                                               "exceeds_max_model_len", ""]
    assert table["status"].tolist() == ["finished", "rejected", "rejected", "finished"]


def test_a_mooncake_slice_with_long_prompts_accounts_for_every_request():
    trace = load_trace("mooncake-conv").head(200)
    limit = 16_384
    result = simulate(RunSpec(engine(max_model_len=limit, enable_prefix_caching=False)), trace)
    s = result.summary
    too_long = int(((trace.prompt_tokens + trace.output_tokens) > limit).sum())
    assert too_long > 20, "the slice should hold long prompts"
    assert s["num_rejected_by_reason"]["exceeds_max_model_len"] == too_long
    assert s["num_finished"] + s["num_rejected"] + s["num_failed_oom"] == len(trace)


def test_the_recorder_counts_kv_pool_rejections_by_reason():
    rec = ReplicaRecorder(0, 16)
    req = RequestState(7, 1.0, 100, 10)
    req.status, req.reject_reason = RequestStatus.REJECTED, RejectReason.EXCEEDS_KV_POOL
    rec.arrival(1.0, req, 0)
    s = summarize([rec])
    assert s["num_rejected_by_reason"] == {"exceeds_max_model_len": 0, "exceeds_kv_pool": 1}
    assert s["num_requests"] == 1 and s["num_finished"] == 0 and s["ttft_s"]["p50"] is None


# ---------------------------------------------------------------------------- overload
def conv_like(num_requests: int, rate_per_s: float) -> Trace:
    conv = load_trace("azure-conv")
    return synthetic(num_requests, rate_per_s, seed=1,
                     prompt=LengthDist.empirical(conv, "prompt_tokens"),
                     output=LengthDist.empirical(conv, "output_tokens"))


def test_an_underloaded_trace_is_not_overloaded():
    s = simulate(RunSpec(engine(max_num_seqs=256)), conv_like(600, 2.0)).summary
    assert s["overloaded"] is False
    assert s["queue_at_last_arrival"] < 10 and abs(s["queue_growth_req_s"]) < 0.05


def test_an_overloaded_trace_is_said_overloaded_with_its_queue_growth():
    # 400 req/s of conv-like requests: far beyond one H200 running 64 at a time
    s = simulate(RunSpec(engine(max_num_seqs=64)), conv_like(1200, 400.0)).summary
    assert s["overloaded"] is True
    assert s["queue_at_last_arrival"] > 600  # over half the trace still waits at its end
    # the queue grows at the arrival rate less what the engine serves, ~400 - 60 req/s
    assert 200 < s["queue_growth_req_s"] < 400


def test_queue_trend_rule_on_hand_made_samples():
    growing = QueueSamples()
    for i in range(100):  # one arrival a second, the queue one longer each time after t=50
        growing.add(float(i), max(0, i - 50))
    trend = growing.trend()
    assert trend.growth_req_s == pytest.approx(1.0)
    assert trend.overloaded and trend.queue_at_last_arrival == 49
    steady = QueueSamples()
    for i in range(100):
        steady.add(float(i), i % 3)  # bounded noise
    assert not steady.trend().overloaded


def test_queue_samples_stay_bounded_and_even():
    samples = QueueSamples()
    for i in range(100_000):
        samples.add(float(i), 0)
    assert len(samples.times_s) <= 4097 and samples.every > 1
    assert np.all(np.diff(samples.times_s) == samples.every)


# ------------------------------------------------------------------------ idle gaps
def test_a_1e12_second_gap_finishes_in_well_under_a_second():
    trace = hand_trace([0.0, 1e12], [500, 500], [20, 20])
    calls = []
    start_s = time.perf_counter()
    result = simulate(RunSpec(engine()), trace, progress=lambda now, done: calls.append(now))
    assert time.perf_counter() - start_s < 1.0
    s = result.summary
    assert s["num_finished"] == 2 and s["overloaded"] is False
    first, second = result.recorders[0].requests
    # the same request on an idle engine: the same latency, 1e12 s later, to the precision of
    # a float near 1e12 (a step of 2**-13 s, 0.12 ms)
    assert second.first_token_s - second.arrival_s == pytest.approx(
        first.first_token_s - first.arrival_s, abs=2 * 2.0**-13)
    assert len(calls) < 10  # progress is not reported across the idle gap


def test_a_trace_slowed_a_billionfold_finishes_quickly():
    trace = load_trace("azure-conv").head(50).scaled(1e-9)
    start_s = time.perf_counter()
    s = simulate(RunSpec(engine()), trace).summary
    assert time.perf_counter() - start_s < 2.0
    assert s["num_finished"] == 50


def test_an_empty_trace_ends_at_once():
    s = simulate(RunSpec(engine()), hand_trace([], [], [])).summary
    assert s["num_requests"] == 0 and s["makespan_s"] == 0.0 and s["overloaded"] is False


# ------------------------------------------------------------------------- streaming
def test_streamed_rows_match_the_in_memory_run(tmp_path):
    trace = load_trace("azure-code").head(120)
    kept = simulate(RunSpec(engine()), trace)
    requests_csv, timeline_csv = tmp_path / "requests.csv", tmp_path / "timeline.csv"
    sinks = {}

    def streaming(replica_id: int, block_size: int) -> ReplicaRecorder:
        sinks["requests"], sinks["timeline"] = RequestCsv(requests_csv), TimelineCsv(timeline_csv)
        return ReplicaRecorder(replica_id, block_size, request_sink=sinks["requests"],
                               timeline_sink=sinks["timeline"])

    streamed = simulate(RunSpec(engine()), trace, recorder=streaming)
    for sink in sinks.values():
        sink.close()
    strip = ("sim_wall_s",)
    assert {k: v for k, v in streamed.summary.items() if k not in strip} == \
        {k: v for k, v in kept.summary.items() if k not in strip}
    assert streamed.recorders[0].requests == []  # nothing held per request
    with requests_csv.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(REQUEST_COLUMNS) and len(rows) == len(trace)
    finish = {int(r["request_id"]): float(r["finish_s"]) for r in rows}
    assert finish == {r.request_id: r.finish_s for r in kept.recorders[0].requests}
    streamed_tl = np.loadtxt(timeline_csv, delimiter=",", skiprows=1)
    np.testing.assert_allclose(streamed_tl[:, 1:], timeline_array(kept.recorders[0]), rtol=1e-8)
    with pytest.raises(ValueError, match="sink"):
        timeline_array(streamed.recorders[0])


def test_itl_past_the_exact_store_is_within_its_stated_accuracy():
    rng = np.random.default_rng(3)
    values = rng.lognormal(-5.0, 0.8, 50_000)
    weights = rng.integers(1, 64, 50_000).astype(np.float64)
    sketch = WeightedSample(capacity=1_000)  # past it: the log histogram
    for start in range(0, values.size, 25):
        sketch.add(values[start:start + 25].tolist(), float(weights[start]))
    sketch_weights = np.repeat(weights[::25], 25)
    exact = weighted_percentiles(values, sketch_weights)
    folded = merged_percentiles([sketch])
    assert not sketch.is_exact
    for name in ("p50", "p90", "p99"):
        assert folded[name] == pytest.approx(exact[name], rel=1.5e-3)
    assert folded["mean"] == pytest.approx(exact["mean"], rel=1e-12)
