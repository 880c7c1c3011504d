"""The per-operator cost model: roofline regimes, chunked attention, TP and calibration files."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from sim.core.calibration import load_efficiency
from sim.core.catalog import get_gpu, get_model
from sim.core.cost_model import CostModel, Efficiency, efficiency_dict, slower
from sim.core.step import ScheduledRequest, SchedulerOutput

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
        num_sampled_rows=num_rows,
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


def test_a_query_tokens_share_is_per_kv_head_and_layer_beside_its_pairs():
    """Efficiency.attention_query_s: a 2,048-token chunk over 6,144 cached keys at 0.4 of the
    H200's 989.4 TFLOP/s and 5 ns per query token, KV head and layer:
        pairs  2,048 x (6,144 + 1,024) = 14,680,064 x 4 x 32 heads x 128 x 32 layers
               = 7.697e12 FLOPs / (989.4e12 x 0.4) = 19.449 ms
        tokens 2,048 x 8 KV heads x 32 layers x 5 ns = 2.621 ms
    TP=2 holds half the heads, so half of both; `slower` doubles the time."""
    eff = Efficiency(attention_compute=0.4, attention_query_s=5e-9)
    chunk = ((2048, 6144),)
    cost = CostModel(LLAMA_8B, H200, efficiency=eff)
    pairs_s = 2048 * (6144 + 1024) * 4 * 32 * 128 * 32 / (989.4e12 * 0.4)
    assert pairs_s == pytest.approx(19.449e-3, rel=1e-4)
    assert cost.prefill_attention_s(chunk) == pytest.approx(pairs_s + 2.621e-3, rel=1e-4)
    assert cost.attention_query_token_s == pytest.approx(8 * 32 * 5e-9, rel=1e-12)
    tp2 = CostModel(LLAMA_8B, H200, tp=2, efficiency=eff)
    assert tp2.prefill_attention_s(chunk) == pytest.approx(cost.prefill_attention_s(chunk) / 2,
                                                           rel=1e-12)
    twice = CostModel(LLAMA_8B, H200, efficiency=slower(eff, 2.0))
    assert twice.prefill_attention_s(chunk) == pytest.approx(2 * cost.prefill_attention_s(chunk),
                                                             rel=1e-12)


def test_decode_rows_beside_a_chunk_run_at_their_own_rate_where_one_is_fitted():
    """Efficiency.mixed_decode_compute: 10,000 keys of decode rows beside a chunk cost a
    128-row tile's FLOPs per KV head: 10,000 x 8 x 4 x 128 x 128 x 32 layers = 1.678e11 FLOPs,
    at 0.2 of 989.4 TFLOP/s 0.848 ms; unset, at attention_compute (0.4: half that)."""
    own = CostModel(LLAMA_8B, H200, efficiency=Efficiency(attention_compute=0.4,
                                                          mixed_decode_compute=0.2))
    assert own.mixed_decode_attention_s(10_000) == pytest.approx(0.848e-3, rel=1e-3)
    unset = CostModel(LLAMA_8B, H200, efficiency=Efficiency(attention_compute=0.4))
    assert unset.mixed_decode_attention_s(10_000) == pytest.approx(0.848e-3 / 2, rel=1e-3)
    with pytest.raises(ValueError, match="mixed_decode_compute"):
        Efficiency(mixed_decode_compute=1.5)


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


def test_decode_rows_beside_a_chunk_cost_a_tile_of_flops_per_key():
    # Llama-3.1-8B: 8 KV heads, head_dim 128, 32 layers. Beside a chunk, a decode row runs in
    # one of the launch's 128-row tiles: per key and KV head QK^T and PV over 128 rows, 2 x 2 x
    # 128 x 128 FLOPs in each of 32 layers, at attention_compute of the peak.
    eff = Efficiency(attention_compute=0.25)
    cost = CostModel(LLAMA_8B, H200, efficiency=eff)
    flops = 10_000 * 8 * (4 * 128 * 128) * 32
    assert cost.mixed_decode_attention_s(10_000) == pytest.approx(
        flops / (H200.peak_bf16_flops * 0.25), rel=1e-12)
    # a decode-only step reads the same keys instead: 10k keys x 128 KiB of K/V per token
    assert cost.decode_attention_s(10_000) == pytest.approx(
        10_000 * 32 * 8 * 128 * 2 * 2 / (H200.memory_bandwidth_bytes_s * eff.kv_memory), rel=1e-12)
    mixed = output(num_prefill=512, prefill_chunks=((512, 0),), num_decode=4,
                   decode_context=10_000, num_rows=5, num_seqs=5)
    alone = output(num_prefill=512, prefill_chunks=((512, 0),), num_rows=1, num_seqs=1)
    assert cost.step(mixed).attention_s - cost.step(alone).attention_s == pytest.approx(
        cost.mixed_decode_attention_s(10_000), rel=1e-9)


def test_decode_rows_apart_from_a_chunk_cost_their_reads_and_two_launches_per_layer():
    # From mixed_split_min_keys on (32,768 for Llama-3.1-8B at the default 128 MiB), a mixed
    # step's decode rows run on a launch of their own: each key read once (128 KiB of K/V per
    # token) at kv_memory, and two more launches per layer (their attention and its merge),
    # priced as split_launch_s each; the chunk's launch keeps its FLOPs.
    eff = Efficiency(attention_compute=0.25, kv_memory=0.8, split_launch_s=1e-3,
                     attention_program=None)
    cost = CostModel(LLAMA_8B, H200, efficiency=eff, mixed_split_min_keys=32_768)
    chunk_flops = 4 * 512 * (0 + 512 / 2) * 32 * 128 * 32  # 4 c (p + c/2) heads hd layers
    chunk_s = chunk_flops / (H200.peak_bf16_flops * 0.25)
    def mixed(keys):
        return output(num_prefill=512, prefill_chunks=((512, 0),), num_decode=4,
                      decode_context=keys, num_rows=5, num_seqs=5)
    apart = cost.step(mixed(40_000))
    assert apart.attention_s == pytest.approx(
        chunk_s + 40_000 * 32 * 8 * 128 * 2 * 2 / (H200.memory_bandwidth_bytes_s * 0.8),
        rel=1e-12)
    tile_s = 30_000 * 8 * (4 * 128 * 128) * 32 / (H200.peak_bf16_flops * 0.25)
    one_launch = cost.step(mixed(30_000))  # under the key count: the tiles, one launch
    assert one_launch.attention_s == pytest.approx(chunk_s + tile_s, rel=1e-12)
    assert apart.launch_s - one_launch.launch_s == pytest.approx(2e-3, rel=1e-12)
    never = CostModel(LLAMA_8B, H200, efficiency=eff)  # 0: always one launch
    assert never.step(mixed(40_000)).attention_s == pytest.approx(
        chunk_s + tile_s * 40_000 / 30_000, rel=1e-12)


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
        cost.prefill_attention_s(chunks) + cost.mixed_decode_attention_s(45_000), rel=1e-12)
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
    from sim.core.cost_model import slower

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
    from sim.core.cost_model import host_slower

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


# ------------------------------------------------------------ piecewise CUDA graph token sizes
def test_piecewise_capture_sizes_follow_the_grid_up_to_the_step_budget():
    from sim.core.cost_model import piecewise_capture_sizes

    sizes = piecewise_capture_sizes(8192)
    # 16..256 by 16 (16 sizes), 320..1024 by 64 (12), 1280..8192 by 256 (28)
    assert len(sizes) == 16 + 12 + 28 == 56
    assert sizes[:3] == (16, 32, 48) and sizes[-1] == 8192
    assert {256, 320, 1024, 1280, 1536, 7936}.issubset(sizes)
    assert not {272, 288, 1088, 1152, 8448}.intersection(sizes)
    assert list(sizes) == sorted(set(sizes))
    assert piecewise_capture_sizes(100) == (16, 32, 48, 64, 80, 96, 100)
    assert piecewise_capture_sizes(96) == (16, 32, 48, 64, 80, 96)  # no size twice
    assert piecewise_capture_sizes(1) == (1,) and piecewise_capture_sizes(16) == (16,)
    # past 8192 the steps are 512 tokens; the budget itself closes the list
    assert piecewise_capture_sizes(10_000)[-5:] == (8192, 8704, 9216, 9728, 10_000)
    with pytest.raises(ValueError, match="max_tokens >= 1"):
        piecewise_capture_sizes(0)


# Llama-3.1-8B's linear layers without lm_head: 32 layers of q and o (4096 x 4096), k and v
# (4096 x 1024) and the MLP (3 x 4096 x 14336); 2 FLOPs per weight per token.
LLAMA_8B_LAYER_FLOPS_PER_TOKEN = 2 * 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
H200_LINEAR_FLOPS_S = 989.4e12 * 0.73  # peak bf16 x the default linear_compute efficiency


def test_a_prefill_step_computes_its_linear_layers_at_the_next_token_size():
    sizes = (256, 320, 384)
    padded = CostModel(LLAMA_8B, H200, token_graph_sizes=sizes)
    exact = CostModel(LLAMA_8B, H200)
    step = output(num_prefill=300, prefill_chunks=((300, 1000),), num_rows=1)
    got, plain = padded.step(step), exact.step(step)
    # 300 and 320 tokens are compute-bound (320 x 14 GFLOP in 6.2 ms > 14 GB of weights in 4.1 ms)
    assert got.linear_s == pytest.approx(320 * LLAMA_8B_LAYER_FLOPS_PER_TOKEN / H200_LINEAR_FLOPS_S,
                                         rel=1e-12)
    assert plain.linear_s == pytest.approx(300 * LLAMA_8B_LAYER_FLOPS_PER_TOKEN / H200_LINEAR_FLOPS_S,
                                           rel=1e-12)
    # attention on the real tokens, one sampled row, the same launch and overhead
    assert (got.attention_s, got.logits_s, got.overhead_s, got.launch_s) == (
        plain.attention_s, plain.logits_s, plain.overhead_s, plain.launch_s)
    # a mixed step pads its prefill and decode tokens together: 250 + 50 -> 320
    mixed = output(num_prefill=250, prefill_chunks=((250, 0),), num_decode=50,
                   decode_context=50 * 2000, num_rows=51, num_seqs=51)
    assert padded.step(mixed).linear_s == got.linear_s
    assert padded.step(mixed).logits_s == exact.step(mixed).logits_s  # 51 rows sample
    # beyond the largest size: unpadded
    long = output(num_prefill=400, prefill_chunks=((400, 0),), num_rows=1)
    assert padded.step(long) == exact.step(long)


def test_a_padded_prefill_step_all_reduces_the_padded_tokens_under_tp():
    padded = CostModel(LLAMA_8B, H200, tp=2, token_graph_sizes=(320,))
    step = padded.step(output(num_prefill=300, prefill_chunks=((300, 0),), num_rows=1))
    # 2 all-reduces x 32 layers, ring 2 (2-1)/2 = 1 x 320 tokens x 4096 x 2 B over
    # 450 GB/s x 0.8, plus 8 us each
    per_call_s = 320 * 4096 * 2 / (450e9 * 0.8) + 8e-6
    assert step.allreduce_s == pytest.approx(2 * 32 * per_call_s, rel=1e-12)


def test_decode_steps_in_a_decode_graph_ignore_the_token_sizes():
    for graphs, rows_list in (((), (3, 20, 40)), (GRAPHS, (3, 20))):
        padded = CostModel(LLAMA_8B, H200, efficiency=NO_PER_SEQ, graph_sizes=graphs,
                           token_graph_sizes=(16, 32, 48, 64))
        plain = CostModel(LLAMA_8B, H200, efficiency=NO_PER_SEQ, graph_sizes=graphs)
        for rows in rows_list:
            step = output(num_decode=rows, decode_context=rows * 500, num_rows=rows,
                          num_seqs=rows)
            assert padded.step(step) == plain.step(step)
            np.testing.assert_array_equal(padded.decode_run_s(rows, rows * 500, 4),
                                          plain.decode_run_s(rows, rows * 500, 4))


def test_a_decode_step_beyond_every_decode_graph_runs_the_piecewise_graphs():
    """The engine's runner tries the decode graphs, then the piecewise ones (ModelRunner.
    execute): 40 decode rows beyond graphs of up to 32 run the 48-token pieces, with the
    piecewise launch time; without piecewise graphs they run fully eager, unpadded."""
    eff = replace(NO_PER_SEQ, eager_launch_s=0.05, piecewise_launch_s=0.004)
    pieces = CostModel(LLAMA_8B, H200, efficiency=eff, graph_sizes=GRAPHS,
                       token_graph_sizes=(16, 32, 48, 64))
    eager = CostModel(LLAMA_8B, H200, efficiency=eff, graph_sizes=GRAPHS)
    step = output(num_decode=40, decode_context=40 * 500, num_rows=40, num_seqs=40)
    got, plain = pieces.step(step), eager.step(step)
    assert got.linear_s == pieces.linear_s(48) and plain.linear_s == eager.linear_s(40)
    assert got.logits_s == plain.logits_s == pieces.logits_s(40)  # the real rows sample
    assert (got.launch_s, plain.launch_s) == (0.004, 0.05)
    for cost in (pieces, eager):  # a decode run prices its first step as `step` does
        assert cost.decode_run_s(40, 40 * 500, 1)[0] == pytest.approx(cost.step(step).total_s,
                                                                      rel=1e-12)


def test_eager_steps_of_many_steps_match_one_at_a_time():
    from sim.core.cost_model import piecewise_capture_sizes

    eff = Efficiency(eager_launch_s=0.02, piecewise_launch_s=0.003)
    padded = CostModel(LLAMA_8B, H200, efficiency=eff,
                       token_graph_sizes=piecewise_capture_sizes(8192))
    tokens = np.array([1, 15, 16, 17, 300, 320, 321, 1025, 8191, 8192, 9000])
    many, piecewise = padded.eager_step_array(tokens)
    one = [padded.eager_step(int(n)) for n in tokens]
    assert list(many) == [n for n, _ in one] == [padded.prefill_tokens(int(n)) for n in tokens]
    assert list(many) == [16, 16, 16, 32, 320, 320, 384, 1280, 8192, 8192, 9000]
    assert list(piecewise) == [launch == 0.003 for _, launch in one] == [True] * 10 + [False]
    plain = CostModel(LLAMA_8B, H200, efficiency=eff)
    plain_many, plain_piecewise = plain.eager_step_array(tokens)
    assert list(plain_many) == list(tokens) and not plain_piecewise.any()
    assert [plain.eager_step(int(n)) for n in tokens] == [(int(n), 0.02) for n in tokens]


def test_a_capped_engine_prices_steps_past_its_largest_piecewise_graph_as_eager():
    """Piecewise graphs captured up to 512 tokens only (vLLM's default cap): a 300-token
    prefill runs the 320-token pieces with the piecewise launch time, a 2,000-token one runs
    fully eager with the eager launch time; where piecewise_launch_s is unset (a calibration
    from before it), both take eager_launch_s."""
    from sim.core.cost_model import piecewise_capture_sizes

    eff = replace(NO_PER_SEQ, eager_launch_s=0.02, piecewise_launch_s=0.003)
    capped = CostModel(LLAMA_8B, H200, efficiency=eff,
                       token_graph_sizes=piecewise_capture_sizes(512))
    short = output(num_prefill=300, prefill_chunks=((300, 0),), num_rows=1)
    long = output(num_prefill=2000, prefill_chunks=((2000, 0),), num_rows=1)
    assert capped.step(short).launch_s == 0.003
    assert capped.step(short).linear_s == capped.linear_s(320)
    assert capped.step(long).launch_s == 0.02
    assert capped.step(long).linear_s == capped.linear_s(2000)
    old = CostModel(LLAMA_8B, H200, efficiency=replace(eff, piecewise_launch_s=None),
                    token_graph_sizes=piecewise_capture_sizes(512))
    assert old.step(short).launch_s == old.step(long).launch_s == 0.02


# ------------------------------------------------------------------ attention key splits
QWEN_05B = get_model("qwen2.5-0.5b")  # 2 KV heads, 7 query heads each: 18 tokens per tile


def rows(*rows_: tuple[int, int]) -> tuple[ScheduledRequest, ...]:
    """ScheduledRequests of (cached tokens, new tokens) rows."""
    return tuple(ScheduledRequest(i, done, new, (), new == 1, True)
                 for i, (done, new) in enumerate(rows_))


def step_of(*rows_: tuple[int, int]) -> SchedulerOutput:
    scheduled = rows(*rows_)
    prefills = tuple((n, c) for c, n in rows_ if n > 1)
    decodes = [(c, n) for c, n in rows_ if n == 1]
    return SchedulerOutput(
        step_id=1, scheduled=scheduled, num_steps=1,
        num_prefill_tokens=sum(n for n, _ in prefills), num_decode_tokens=len(decodes),
        prefill_chunks=prefills, decode_context_tokens=sum(c + 1 for c, _ in decodes),
        preempted_ids=(), elastic=None, oom=None, num_sampled_rows=len(scheduled))


@pytest.mark.parametrize("rows_, splits", [
    # 512 new on an 8,192 prefix: 512 // 18 + 1 = 29 tiles x 2 KV heads = 58 programs < 132
    (((8192, 512),), True),
    # 2,048 new: 113 + 1 tiles x 2 = 228 programs fill the 132 SMs
    (((0, 2048),), False),
    # 200 new, no prefix: 12 tiles, but 200 keys are too few to split (> 256 needed)
    (((0, 200),), False),
    # 1,024 new beside 6 decodes of 2k keys: (1,030 // 18 + 7) x 2 = 128 programs < 132
    (((0, 1024), *[(2047, 1)] * 6), True),
])
def test_a_step_whose_attention_splits_its_keys_launches_longer(rows_, splits):
    eff = Efficiency(eager_launch_s=3e-3, split_launch_s=1.2e-3)
    cost = CostModel(QWEN_05B, H200, efficiency=eff)
    step = cost.step(step_of(*rows_))
    assert step.launch_s == pytest.approx(4.2e-3 if splits else 3e-3)
    # the same step without the term, or on a GPU of unknown SM count: the eager launch only
    plain = CostModel(QWEN_05B, H200, efficiency=Efficiency(eager_launch_s=3e-3))
    assert plain.step(step_of(*rows_)).launch_s == pytest.approx(3e-3)
    unknown = CostModel(QWEN_05B, replace(H200, num_sms=0), efficiency=eff)
    assert unknown.step(step_of(*rows_)).launch_s == pytest.approx(3e-3)


def test_decode_only_steps_never_pay_the_split_launch():
    eff = Efficiency(eager_launch_s=3e-3, split_launch_s=1.2e-3)
    step = CostModel(QWEN_05B, H200, efficiency=eff).step(step_of(*[(4000, 1)] * 4))
    assert step.launch_s == 0.0


def test_the_split_rule_is_the_kernels():
    """sim.core.cost_model.attention_num_splits against gpu_backend's choose_num_splits (the CPU
    stands in for a GPU of 4 SMs there) over prefill and mixed shapes of two GQA groups."""
    import torch

    from gpu_backend.kernels.attention import choose_num_splits, prefill_config
    from sim.core.cost_model import attention_num_splits, attention_num_splits_array

    cpu, sms = torch.device("cpu"), 4
    cases = []
    for kv_heads, heads, head_dim in ((2, 14, 64), (8, 32, 128), (1, 8, 128)):
        group = heads // kv_heads
        block_q = prefill_config(head_dim).block_m // group
        for tokens, seqs, max_query, max_seq in ((16, 1, 16, 16), (300, 1, 300, 300),
                                                 (40, 2, 20, 5000), (8, 1, 8, 9000),
                                                 (64, 3, 40, 257), (64, 3, 40, 256),
                                                 (500, 20, 480, 600)):
            tiles = seqs if max_query <= block_q else tokens // block_q + seqs
            count = choose_num_splits(tiles * kv_heads, max_seq, cpu)
            shape = (tokens, seqs, max_query, max_seq, kv_heads, group)
            assert attention_num_splits(*shape, sms) == count, shape
            cases.append((*shape, count))
    assert {c[-1] > 1 for c in cases} == {True, False}  # both outcomes exercised
    assert len({c[-1] for c in cases}) > 2  # and several split counts
    for kv_heads, group in {(c[4], c[5]) for c in cases}:
        mine = [c for c in cases if (c[4], c[5]) == (kv_heads, group)]
        arrays = [np.array([c[i] for c in mine]) for i in range(4)]
        counts = [c[-1] for c in mine]
        np.testing.assert_array_equal(
            attention_num_splits_array(*arrays, kv_heads, group, sms), counts)


def test_launch_serial_fraction_adds_its_share_of_the_shorter_of_device_and_launch():
    """A 300-token Qwen2.5-0.5B prefill: device d and launch l from the model; the step is
    max(d, l) + f * min(d, l) + overhead, so f = 0 is the old max and f = 1 the sum."""
    step = step_of((0, 300))
    base = Efficiency(eager_launch_s=3e-3, step_overhead_s=1e-3, per_seq_overhead_s=0.0)
    plain = CostModel(QWEN_05B, H200, efficiency=base).step(step)
    device, launch = plain.device_s, plain.launch_s
    assert launch == 3e-3 and 0 < device < launch  # launch-bound: the overlap is the device
    assert plain.total_s == pytest.approx(launch + 1e-3)
    for f in (0.25, 1.0):
        cost = CostModel(QWEN_05B, H200, efficiency=replace(base, launch_serial_fraction=f))
        assert cost.step(step).total_s == pytest.approx(launch + f * device + 1e-3)
    # decode-only graph steps launch nothing: unchanged
    decode = step_of(*[(999, 1)] * 8)
    assert CostModel(QWEN_05B, H200, efficiency=replace(base, launch_serial_fraction=1.0)).step(
        decode).total_s == pytest.approx(CostModel(QWEN_05B, H200, efficiency=base).step(
            decode).total_s)
    with pytest.raises(ValueError, match="launch_serial_fraction"):
        Efficiency(launch_serial_fraction=1.5)


def test_a_chunk_beside_a_long_decode_row_lasts_its_longest_program():
    """Llama-3.1-8B: a 2,048-token chunk beside 15 rows of 8,000 keys and one of 30,000. The
    launch gives the long row one program per KV head (2,048 / 32 + 16 = 80 tiles x 8 heads
    fill the 132 SMs: no split), which works through its 30,001 keys at attention_program of
    one SM: 32 layers x 30,001 keys x (4 x 128 rows x 128 dims) FLOPs at 0.3 x 989.4 / 132
    TFLOP/s = 28.0 ms, longer than the step's total attention work."""
    step = step_of((0, 2048), *[(8000, 1)] * 15, (30000, 1))
    plain = CostModel(LLAMA_8B, H200, efficiency=Efficiency()).step(step)
    with_term = CostModel(LLAMA_8B, H200, efficiency=Efficiency(attention_program=0.3)).step(step)
    longest = 32 * 30001 * 4 * 128 * 128 / (0.3 * 989.4e12 / 132)
    assert longest == pytest.approx(28.0e-3, rel=1e-3)
    assert plain.attention_s < longest
    assert with_term.attention_s == pytest.approx(longest)
    assert with_term.linear_s == plain.linear_s  # only the attention changes
    # a long prefill's tiles outweigh its longest one; a decode-only step splits by its plan
    for other in (step_of((0, 16384)), step_of(*[(8000, 1)] * 15, (30000, 1))):
        assert (CostModel(LLAMA_8B, H200, efficiency=Efficiency(attention_program=0.3))
                .step(other).attention_s == pytest.approx(
                    CostModel(LLAMA_8B, H200, efficiency=Efficiency()).step(other).attention_s))


def test_a_launch_adds_attention_program_serial_of_the_shorter_of_its_work_and_longest_program():
    """The same chunk beside rows, five of them long (the Mooncake replays' chunk-2,048 steps):
    attention_program_serial 0 prices the longer of the launch's total work and its longest
    program, 1 their sum, 0.4 the longer and 0.4 of the shorter; a step no program binds the
    term into (no attention_program, or decode only) keeps its work."""
    step = step_of((6000, 2030), *[(27000, 1)] * 5, *[(12000, 1)] * 6, *[(4000, 1)] * 7)
    work = CostModel(LLAMA_8B, H200, efficiency=Efficiency()).step(step).attention_s
    longest = 32 * 27001 * 4 * 128 * 128 / (0.3 * 989.4e12 / 132)
    for serial, expected in ((0.0, max(work, longest)), (1.0, work + longest),
                             (0.4, max(work, longest) + 0.4 * min(work, longest))):
        eff = Efficiency(attention_program=0.3, attention_program_serial=serial)
        assert CostModel(LLAMA_8B, H200, efficiency=eff).step(step).attention_s == pytest.approx(
            expected)
    decode = step_of(*[(27000, 1)] * 5, *[(12000, 1)] * 6)
    for eff, other in ((Efficiency(attention_program_serial=0.9), step),
                       (Efficiency(attention_program=0.3, attention_program_serial=0.9), decode)):
        assert CostModel(LLAMA_8B, H200, efficiency=eff).step(other).attention_s == pytest.approx(
            CostModel(LLAMA_8B, H200, efficiency=Efficiency()).step(other).attention_s)
    with pytest.raises(ValueError, match="attention_program_serial"):
        Efficiency(attention_program_serial=1.2)


def test_a_split_launchs_longest_program_works_through_its_share_of_the_keys():
    """Qwen2.5-0.5B, 512 new tokens on a 16,384-token prefix: 512 // 18 + 1 = 29 tiles x 2 KV
    heads = 58 programs < 132 SMs, so each tile's keys split min(ceil(264 / 58), ceil(16,896 /
    256), 32) = 5 ways: the longest program has a fifth of the 16,896 keys."""
    cost = CostModel(QWEN_05B, H200, efficiency=Efficiency(attention_program=0.2))
    assert cost.num_splits(512, 1, 512, 16896) == 5
    per_key = 24 * 4 * 128 * 64 / (0.2 * 989.4e12 / 132)
    assert cost.longest_program_s(16896, 5) == pytest.approx(3380 * per_key)
    assert cost.longest_program_s(16896) == pytest.approx(16896 * per_key)
