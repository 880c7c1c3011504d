"""The per-operator cost model: roofline regimes, chunked attention, TP and calibration files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.core.catalog import get_gpu, get_model
from sim.core.step import ScheduledRequest, SchedulerOutput
from sim.cost_model import CostModel, Efficiency, efficiency_dict, load_efficiency

LLAMA_8B = get_model("llama-3.1-8b")
H200 = get_gpu("h200")


@pytest.fixture
def cost() -> CostModel:
    return CostModel(LLAMA_8B, H200)


def output(num_prefill: int = 0, prefill_chunks=(), num_decode: int = 0,
           decode_context: int = 0, num_rows: int = 0, num_seqs: int = 1) -> SchedulerOutput:
    items = tuple(ScheduledRequest(i, 0, 1, (), False, False) for i in range(num_seqs))
    return SchedulerOutput(
        step_id=1, scheduled=items, num_steps=1, num_prefill_tokens=num_prefill,
        num_decode_tokens=num_decode, prefill_chunks=tuple(prefill_chunks),
        decode_context_tokens=decode_context, preempted_ids=(), elastic=None, oom=None,
        activation_bytes=0, activation_available_bytes=0, num_used_blocks=0,
        num_usable_blocks=1, num_lent_blocks=0, num_sampled_rows=num_rows,
    )


# -------------------------------------------------------------------------------- linear
def test_linear_is_flat_per_token_when_compute_bound(cost):
    per_token_s = [cost.linear_s(n) / n for n in (512, 1024, 4096, 16384)]
    assert max(per_token_s) == pytest.approx(min(per_token_s), rel=1e-12)
    # DESIGN.md: 0.58-0.64 us per token per layer for Llama-3.1-8B on an H200.
    per_layer_us = per_token_s[0] / LLAMA_8B.num_layers * 1e6
    assert 0.55 <= per_layer_us <= 0.65


def test_linear_is_weight_bound_for_small_steps(cost):
    # Below the ridge every step streams the same weights once: the time does not change.
    assert cost.linear_s(1) == cost.linear_s(64) == cost.linear_s(128)
    assert cost.linear_s(64) / 64 > 2 * cost.linear_s(4096) / 4096
    # The ridge sits at a couple hundred tokens (DESIGN.md: memory-bound below ~256).
    ridge = next(n for n in range(1, 2048) if cost.linear_s(n + 1) > cost.linear_s(n))
    assert 128 <= ridge <= 300
    # Layer weights of 8B minus the lm_head, read at 0.71 x 4.8 TB/s.
    layer_weight_bytes = (LLAMA_8B.linear_flops_per_token() / 2
                          - LLAMA_8B.hidden_size * LLAMA_8B.vocab_size) * 2
    assert cost.linear_s(1) == pytest.approx(layer_weight_bytes / (0.71 * 4.8e12), rel=1e-9)


# ----------------------------------------------------------------------------- attention
def test_prefill_attention_is_proportional_to_causal_pairs(cost):
    unit = cost.prefill_attention_s(((1, 0),)) / 0.5  # c * (p + c / 2) = 0.5 for c=1, p=0
    for chunk, prefix in ((1000, 0), (2048, 4096), (952, 2048), (8192, 16384)):
        pairs = chunk * (prefix + chunk / 2)
        assert cost.prefill_attention_s(((chunk, prefix),)) == pytest.approx(pairs * unit,
                                                                             rel=1e-12)


@pytest.mark.parametrize("chunk", [512, 2048, 8192, 32768])
def test_chunking_a_prompt_costs_the_same_attention_as_one_pass(cost, chunk):
    prompt = 32768
    chunks = tuple((min(chunk, prompt - start), start) for start in range(0, prompt, chunk))
    assert sum(c for c, _ in chunks) == prompt
    one_pass = cost.prefill_attention_s(((prompt, 0),))
    assert cost.prefill_attention_s(chunks) == pytest.approx(one_pass, rel=1e-12)
    chunked_sum = sum(cost.prefill_attention_s((c,)) for c in chunks)
    assert chunked_sum == pytest.approx(one_pass, rel=1e-12)


def test_decode_attention_reads_kv_bytes(cost):
    kv_bytes = LLAMA_8B.kv_bytes_per_token() * 10_000
    assert cost.decode_attention_s(10_000) == pytest.approx(kv_bytes / (0.71 * 4.8e12), rel=1e-12)
    assert cost.decode_attention_s(0) == 0.0


# -------------------------------------------------------------------------- TP, logits
def test_allreduce_is_zero_at_tp1_and_positive_above(cost):
    assert cost.allreduce_s(4096) == 0.0
    tp2, tp4 = CostModel(LLAMA_8B, H200, tp=2), CostModel(LLAMA_8B, H200, tp=4)
    assert 0 < tp2.allreduce_s(1) < tp2.allreduce_s(4096)
    # Ring all-reduce moves 2 (tp - 1) / tp of the bytes: more at TP 4 than at TP 2.
    assert tp4.allreduce_s(4096) > tp2.allreduce_s(4096)
    # Two all-reduces per layer, each at least its latency.
    assert tp2.allreduce_s(1) > 2 * LLAMA_8B.num_layers * tp2.eff.allreduce_latency_s


def test_tensor_parallel_splits_linear_and_attention_time(cost):
    tp2 = CostModel(LLAMA_8B, H200, tp=2)
    assert tp2.linear_s(8192) == pytest.approx(cost.linear_s(8192) / 2, rel=1e-12)
    assert tp2.prefill_attention_s(((4096, 0),)) == pytest.approx(
        cost.prefill_attention_s(((4096, 0),)) / 2, rel=1e-12)
    assert tp2.decode_attention_s(5000) == pytest.approx(cost.decode_attention_s(5000) / 2,
                                                         rel=1e-12)


def test_logits_only_for_sampled_rows(cost):
    assert cost.logits_s(0) == 0.0
    assert cost.logits_s(1) == cost.logits_s(8) > 0  # lm_head weight read dominates
    assert cost.logits_s(8192) > cost.logits_s(8)  # compute-bound for many rows


# -------------------------------------------------------------------------------- steps
def test_step_is_the_sum_of_its_operators(cost):
    chunks = ((2000, 0), (96, 1000))
    out = output(num_prefill=2096, prefill_chunks=chunks, num_decode=30, decode_context=45_000,
                 num_rows=31, num_seqs=32)
    step = cost.step(out)
    assert step.linear_s == cost.linear_s(2126)
    assert step.attention_s == pytest.approx(
        cost.prefill_attention_s(chunks) + cost.decode_attention_s(45_000), rel=1e-12)
    assert step.logits_s == cost.logits_s(31)
    assert step.overhead_s == pytest.approx(cost.eff.step_overhead_s
                                            + 32 * cost.eff.per_seq_overhead_s, rel=1e-12)
    assert step.total_s == pytest.approx(step.linear_s + step.attention_s + step.allreduce_s
                                         + step.logits_s + step.overhead_s, rel=1e-12)


def test_prefill_step_is_compute_bound_and_decode_step_memory_bound(cost):
    prefill = cost.step(output(num_prefill=8192, prefill_chunks=((8192, 0),), num_rows=1))
    decode = cost.step(output(num_decode=64, decode_context=64 * 1000, num_rows=64, num_seqs=64))
    assert prefill.linear_s == pytest.approx(8192 * cost.linear_s(4096) / 4096, rel=1e-12)
    assert decode.linear_s == cost.linear_s(1)  # weight-bound
    assert prefill.total_s > 10 * decode.total_s


def test_decode_run_equals_consecutive_single_steps(cost):
    batch, context, num_steps = 16, 16 * 700, 40
    run = cost.decode_run_s(batch, context, num_steps)
    singles = [cost.step(output(num_decode=batch, decode_context=context + batch * k,
                                num_rows=batch, num_seqs=batch)).total_s
               for k in range(num_steps)]
    np.testing.assert_allclose(run, singles, rtol=1e-12)
    assert np.all(np.diff(run) > 0)  # contexts grow, so each step reads more KV


def test_migration_reads_and_writes_each_byte(cost):
    assert cost.migration_s(0) == 0.0
    assert cost.migration_s(1 << 30) == pytest.approx(2 * (1 << 30) / (0.71 * 4.8e12), rel=1e-12)


# --------------------------------------------------------------------------- calibration
def test_calibration_json_replaces_the_given_efficiencies(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"efficiency": {"linear_compute": 0.6, "step_overhead_s": 2e-3},
                                "activation": {"bytes_per_token": 1.0, "fixed_bytes": 0}}))
    eff = load_efficiency(path)
    assert eff.linear_compute == 0.6 and eff.step_overhead_s == 2e-3
    assert eff.memory == Efficiency().memory  # keys not given keep their defaults
    calibrated = CostModel(LLAMA_8B, H200, efficiency=eff)
    default = CostModel(LLAMA_8B, H200)
    assert calibrated.linear_s(8192) == pytest.approx(default.linear_s(8192) * 0.73 / 0.6)
    assert load_efficiency(_write(tmp_path, {"efficiency": efficiency_dict(eff)})) == eff


def _write(tmp_path, data) -> str:
    path = tmp_path / "round_trip.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_calibration_json_with_unknown_keys_is_an_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"efficiency": {"linear_compute": 0.6, "linaer_compute": 0.5}}))
    with pytest.raises(ValueError, match=r"unknown efficiency keys \['linaer_compute'\]") as info:
        load_efficiency(path)
    assert "bad.json" in str(info.value) and "linear_compute" in str(info.value)


@pytest.mark.parametrize("text, message", [
    ("{not json", "cannot read calibration JSON"),
    ('{"activation": {}}', 'no "efficiency" object'),
    ('{"efficiency": [0.5]}', 'no "efficiency" object'),
    ('{"efficiency": {"memory": 1.5}}', "memory=1.5 is out of range"),
    ('{"efficiency": {"step_overhead_s": -1}}', "step_overhead_s=-1 is out of range"),
])
def test_bad_calibration_files_name_the_problem(tmp_path, text, message):
    path = tmp_path / "calibration.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_efficiency(path)


def test_missing_calibration_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read calibration JSON"):
        load_efficiency(tmp_path / "absent.json")


@pytest.mark.parametrize("tp", [1, 2])
def test_slower_stretches_every_step_by_the_factor(tp):
    """A what-if 'every step 5% longer' must be exactly that for prefill, decode and mixed
    steps, eager or not, with and without tensor parallelism; factors below 1 are refused."""
    from sim.cost_model import slower

    eff = Efficiency(eager_launch_s=0.02, linear_serial_fraction=0.4, per_seq_overhead_s=5e-6)
    base = CostModel(get_model("llama-3.1-8b"), get_gpu("h200"), tp, eff)
    stretched = CostModel(get_model("llama-3.1-8b"), get_gpu("h200"), tp, slower(eff, 1.05))
    steps = [output(num_prefill=16, prefill_chunks=((16, 0),)),
             output(num_prefill=8192, prefill_chunks=((8192, 4096),)),
             output(num_decode=64, decode_context=64 * 3000),
             output(num_prefill=512, prefill_chunks=((512, 0),), num_decode=32,
                    decode_context=32 * 1000)]
    for out in steps:
        assert stretched.step(out).total_s == pytest.approx(1.05 * base.step(out).total_s,
                                                            rel=1e-12)
    with pytest.raises(ValueError, match="factor >= 1"):
        slower(eff, 0.99)


# ------------------------------------------------------------------- decode CUDA graph sizes
GRAPHS = (1, 2, 4, 8, 16, 32)
# skinny GEMMs grow with their rows (as fitted on the H200), so padding costs time
NO_PER_SEQ = Efficiency(per_seq_overhead_s=0.0, eager_launch_s=0.05, linear_serial_fraction=0.5)


def test_a_decode_batch_is_priced_at_its_graph_size_with_its_own_context():
    padded = CostModel(LLAMA_8B, H200, efficiency=NO_PER_SEQ, graph_sizes=GRAPHS)
    exact = CostModel(LLAMA_8B, H200, efficiency=NO_PER_SEQ)
    # 20 rows run the 32-row graph: the 32-row step's weights and logits, 20 rows' keys
    step20 = padded.step(output(num_decode=20, decode_context=20_000, num_rows=20, num_seqs=20))
    step32 = exact.step(output(num_decode=32, decode_context=20_000, num_rows=32, num_seqs=32))
    assert step20.total_s == pytest.approx(step32.total_s, rel=1e-12)
    assert step20.launch_s == 0.0
    # a size that has its graph costs as before; the padding only ever adds
    same = padded.step(output(num_decode=16, decode_context=9_000, num_rows=16, num_seqs=16))
    assert same.total_s == exact.step(output(num_decode=16, decode_context=9_000, num_rows=16,
                                             num_seqs=16)).total_s
    assert step20.total_s > exact.step(output(num_decode=20, decode_context=20_000,
                                              num_rows=20, num_seqs=20)).total_s


def test_a_decode_batch_beyond_every_graph_runs_eagerly():
    padded = CostModel(LLAMA_8B, H200, efficiency=NO_PER_SEQ, graph_sizes=GRAPHS)
    step = padded.step(output(num_decode=40, decode_context=4_000, num_rows=40, num_seqs=40))
    assert step.launch_s == 0.05 and step.total_s == pytest.approx(0.05 + NO_PER_SEQ.step_overhead_s)


def test_padded_decode_run_equals_its_single_steps():
    padded = CostModel(LLAMA_8B, H200, efficiency=NO_PER_SEQ, graph_sizes=GRAPHS)
    for batch in (20, 40):  # a graph, and eager beyond the largest
        run = padded.decode_run_s(batch, 10_000, 3)
        singles = [padded.step(output(num_decode=batch, decode_context=10_000 + k * batch,
                                      num_rows=batch, num_seqs=batch)).total_s for k in range(3)]
        np.testing.assert_allclose(run, singles, rtol=1e-12)


def test_decode_rows_of_many_steps_match_one_at_a_time():
    padded = CostModel(LLAMA_8B, H200, graph_sizes=GRAPHS)
    rows = np.array([1, 3, 16, 17, 32, 33, 200])
    many, eager = padded.decode_rows_array(rows)
    assert [(int(r), bool(e)) for r, e in zip(many, eager)] == [padded.decode_rows(int(n))
                                                                 for n in rows]
    assert list(many) == [1, 4, 16, 32, 32, 33, 200] and list(eager) == [False] * 5 + [True] * 2
    plain, none = CostModel(LLAMA_8B, H200).decode_rows_array(rows)
    assert list(plain) == list(rows) and not none.any()


def test_host_slower_scales_only_the_host_terms():
    from sim.cost_model import host_slower

    eff = Efficiency(eager_launch_s=0.02, per_seq_overhead_s=5e-6, step_overhead_s=1e-3)
    base = CostModel(LLAMA_8B, H200, efficiency=eff)
    slow = CostModel(LLAMA_8B, H200, efficiency=host_slower(eff, 2.0))
    # a launch-bound eager step: its launch and the serial overhead double, nothing else
    eager = output(num_prefill=64, prefill_chunks=((64, 0),), num_rows=1, num_seqs=4)
    b, s = base.step(eager), slow.step(eager)
    assert b.device_s < b.launch_s and s.total_s == pytest.approx(2 * b.total_s, rel=1e-12)
    # a decode graph step: the device time stays, the overhead doubles
    decode = output(num_decode=32, decode_context=32_000, num_rows=32, num_seqs=32)
    b, s = base.step(decode), slow.step(decode)
    assert s.device_s == b.device_s and s.overhead_s == pytest.approx(2 * b.overhead_s)
    with pytest.raises(ValueError, match="positive factor"):
        host_slower(eff, 0.0)
