"""benchmarks/engine_bench.py on the CPU: the excess chunk penalty it reports against the
target (TTFT added by chunking, less the decode rows' work at the roofline)."""

from __future__ import annotations

import pytest
from bench_helpers import load_benchmark

from sim.core.catalog import get_model

eb = load_benchmark("engine_bench")


def row(prompt, chunk, decodes, ttft_s):
    return {"prompt": prompt, "chunk": chunk, "num_decodes": decodes, "ttft_s": ttft_s}


def test_the_excess_penalty_takes_off_the_decode_rows_work_in_the_extra_steps():
    spec = get_model("llama-3.1-8b")  # 131,072 KV bytes a token; 16.06 GFLOP a token
    bandwidth, matmul = 4.0e12, 8.0e14
    # one decode row of 1,024 keys per step: 1,024 x 131,072 B / 4e12 B/s = 33.554 us of KV,
    # plus its token's matmuls: linear_flops_per_token / 8e14 FLOP/s
    per_decode_s = 1024 * 131072 / 4.0e12 + spec.linear_flops_per_token() / 8.0e14
    rows = [row(16384, 2048, 0, 0.525), row(16384, 16384, 0, 0.500),
            row(16384, 2048, 64, 0.600), row(16384, 16384, 64, 0.500)]
    out = {(r["chunk"], r["num_decodes"]): r
           for r in eb.chunk_penalties(rows, spec, bandwidth, matmul)}
    assert set(out) == {(2048, 0), (2048, 64)}  # the one-step points are the baselines
    alone = out[(2048, 0)]
    assert alone["penalty"] == pytest.approx(0.05) and alone["decode_work"] == 0
    assert alone["excess"] == pytest.approx(0.05) and alone["target_max"] == 0.02
    beside = out[(2048, 64)]
    decode_share = 7 * 64 * per_decode_s / 0.5  # seven extra steps carry the 64 rows
    assert beside["decode_work"] == pytest.approx(decode_share)
    assert beside["excess"] == pytest.approx(0.2 - decode_share)
    assert 0.04 < decode_share < 0.05  # about 4.8 of the 20 points here


def test_a_prompt_without_a_one_step_point_gets_no_penalty_and_the_smallest_whole_chunk_is_the_base():
    spec = get_model("llama-3.1-8b")
    rows = [row(32768, 8192, 0, 1.0), row(16384, 4096, 0, 0.55), row(16384, 16384, 0, 0.52),
            row(16384, 32768, 0, 0.50)]
    out = eb.chunk_penalties(rows, spec, 4e12, 8e14)
    assert [(r["prompt"], r["chunk"]) for r in out] == [(16384, 4096)]
    assert out[0]["penalty"] == pytest.approx(0.55 / 0.52 - 1)
    assert out[0]["target_max"] is None  # the target is set at chunk 2,048


def test_the_attention_penalty_is_the_attention_chunking_adds_over_the_one_step_ttft():
    """One layer's attention summed over the steps, times the layers, against the prompt in one
    step; as a share of that step's TTFT, beside the whole step's penalty."""
    spec = get_model("llama-3.1-8b")  # 32 layers
    attention = [{"prompt": 16384, "chunk": c, "num_decodes": 0, "layer_ms": ms,
                  "all_layers_s": 1e-3 * ms * 32}
                 for c, ms in ((2048, 4.8), (8192, 4.2), (16384, 4.1))]
    curve = [row(16384, 2048, 0, 0.510), row(16384, 8192, 0, 0.495),
             row(16384, 16384, 0, 0.490), row(16384, 2048, 64, 0.6)]
    out = {r["chunk"]: r for r in eb.attention_penalties(attention, curve)}
    assert set(out) == {2048, 8192}
    assert out[2048]["attention_added"] == pytest.approx(0.7e-3 * 32 / 0.490)  # 4.6%
    assert out[2048]["penalty"] == pytest.approx(0.510 / 0.490 - 1)
    assert out[8192]["attention_added"] == pytest.approx(0.1e-3 * 32 / 0.490)
    assert spec.num_layers == 32
