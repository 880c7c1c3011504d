"""benchmarks/attention_options.py on the CPU: the rows it checks, the reference it checks
them against (paged_attention_ref's masking), how it ranks options and prices the chunk
penalty, and, through Triton's interpreter in a child process (it must be chosen before
triton is first imported), the prefix kernel and LSE merge that its SPLIT option is built on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench_helpers import load_benchmark

from gpu_backend.kernels.reference import paged_attention_ref

ROOT = Path(__file__).resolve().parents[1]


ao = load_benchmark("attention_options")
HEADS = ao.Heads(6, 2, 16, 16, torch.float32, "cpu")  # GQA group of 3


def test_every_row_of_a_short_chunk_is_checked():
    assert ao.check_rows(10, 256) == list(range(10))


def test_a_long_chunk_checks_both_edges_and_rows_spread_between():
    rows = ao.check_rows(16384, 256)
    assert len(rows) == 256 and rows == sorted(set(rows))
    assert rows[:64] == list(range(64)) and rows[-64:] == list(range(16320, 16384))
    gaps = [b - a for a, b in zip(rows[63:-64], rows[64:-63])]
    assert max(gaps) <= (16384 - 128) // 128 + 1


def test_chunks_cover_the_prompt_once():
    assert ao.chunk_starts(5000, 2048) == [(0, 2048), (2048, 2048), (4096, 904)]


def test_flops_count_the_keys_each_query_sees():
    # 3 new tokens over 2 cached: the queries see 3, 4 and 5 keys
    assert ao.attention_flops(3, 2, HEADS) == 4 * 16 * 6 * (3 + 4 + 5)


def _chunk(prompt_tokens: int, prefix: int):
    torch.manual_seed(0)
    prompt = ao.make_prompt(HEADS, prompt_tokens)
    return ao.Chunk(prompt, prefix, prompt_tokens - prefix)


def test_the_reference_rows_agree_with_the_kernels_reference():
    chunk = _chunk(70, 45)
    layer = chunk.prompt.layer
    expected = paged_attention_ref(chunk.q, layer.k, layer.v, chunk.table,
                                   torch.tensor([70]), torch.tensor([0, 25]), 0.25)
    assert ao.chunk_error(chunk, expected, 1 << 30, 0.25) < 1e-5


def test_the_check_catches_a_top_left_causal_mask():
    """The mistake SDPA's is_causal makes over a prefix: row r seeing keys [0, r]."""
    chunk = _chunk(70, 45)
    rows = torch.arange(chunk.length)
    top_left = ao.reference_rows(chunk.q, chunk.prompt.keys, chunk.prompt.values, rows + 1,
                                 0.25)
    assert ao.chunk_error(chunk, top_left, 1 << 30, 0.25) > 0.05


def test_decode_rows_are_checked_over_their_whole_context():
    torch.manual_seed(1)
    prompt = ao.make_prompt(HEADS, 40, [33, 33])
    layer = prompt.layer
    q = torch.randn(2, 6, 16)
    decodes = ao.Decodes(q, torch.tensor([33, 33], dtype=torch.int32),
                         torch.arange(3, dtype=torch.int32), layer.tables[:2], None, 33)
    expected = paged_attention_ref(q, layer.k, layer.v, layer.tables[:2], decodes.seq_lens,
                                   decodes.query_start_loc, 0.25)
    assert ao.decode_error(decodes, layer, expected, 0.25) < 1e-5
    assert ao.decode_error(decodes, layer, expected.flip(0), 0.25) > 0.05


def _row(section, option, chunk, ms, correct=True, prompt=16384, block_size=16):
    return {"section": section, "option": option, "prompt": prompt, "chunk": chunk, "ms": ms,
            "correct": correct, "block_size": block_size}


def test_the_chunk_penalty_divides_by_the_options_own_one_pass_and_by_sdpa():
    rows = [_row("chunked", "ours", 2048, 6.6), _row("chunked", "ours", 16384, 6.0),
            _row("chunked", "split", 2048, 3.8), _row("chunked", "split", 16384, 3.4),
            _row("chunked", "broken", 2048, 1.0, correct=False),
            _row("chunked", "broken", 16384, 3.0)]
    penalties = {p["option"]: p for p in ao.chunk_penalties(rows, 16384, 3.3)}
    assert set(penalties) == {"ours", "split"}
    assert abs(penalties["ours"]["vs_own_one_pass"] - 1.1) < 1e-9
    assert abs(penalties["ours"]["vs_sdpa_cudnn_one_pass"] - 2.0) < 1e-9
    assert abs(penalties["split"]["vs_own_one_pass"] - 3.8 / 3.4) < 1e-9


def test_a_chunks_time_splits_into_a_launch_cost_and_a_rate_over_its_pairs():
    # an 8,192-token prompt in chunks of 2,048: a chunk over p cached keys has
    # 2048 * (p + 1024.5) pairs; each timed as 0.05 ms + its pairs at 20 M pairs per ms
    chunk_ms = [0.05 + 2048 * (p + 1024.5) / 20e6 for p in (0, 2048, 4096, 6144)]
    one_ms = 8192 * 4096.5 / 25e6  # the one pass at 25 M pairs per ms
    split = ao.launch_split(8192, 2048, chunk_ms, one_ms)
    assert abs(split["launch_fixed_ms"] - 0.05) < 1e-9
    assert abs(split["pairs_per_ms"] - 20e6) < 1e-3
    assert abs(split["one_pass_pairs_per_ms"] - 25e6) < 1e-3
    assert ao.launch_split(8192, 4096, chunk_ms[:2], one_ms) == {}  # two chunks tell no line
    rows = [{**_row("chunked", "ours", 2048, sum(chunk_ms), prompt=8192), "chunk_ms": chunk_ms},
            _row("chunked", "ours", 8192, one_ms, prompt=8192)]
    (penalty,) = ao.chunk_penalties(rows, 8192, None)
    assert abs(penalty["launch_fixed_ms"] - 0.05) < 1e-9


def test_a_saved_result_that_is_not_one_is_refused_with_its_path(tmp_path):
    bad = tmp_path / "result.json"
    bad.write_text('{"rows": []}')
    with pytest.raises(SystemExit) as stop:
        ao.main(["--report", str(bad)])
    assert str(bad) in str(stop.value.code) and "attention_options_" in str(stop.value.code)


def test_the_best_options_skip_ours_wrong_rows_and_other_block_sizes():
    rows = [_row("chunked", "ours 256x128", 2048, 1.0), _row("chunked", "fast but wrong", 2048,
                                                           1.5, correct=False),
            _row("chunked", "cudnn 64-token", 2048, 2.0, block_size=64),
            _row("chunked", "split", 2048, 3.8), _row("chunked", "cudnn dense", 2048, 4.1),
            _row("chunked", "fa2", 2048, 6.9), _row("chunked", "split", 8192, 0.1)]
    assert ao.best_options(rows, 2048, 2, "ours", 16) == ["split", "cudnn dense"]


def test_only_runs_and_records_the_options_its_patterns_name(tmp_path):
    bench = ao.Bench(HEADS, ao.SMOKE, tmp_path / "out.json", {"gpu": "cpu"},
                     only=("ours", "flashinfer*"))
    ran = []

    def work(name):
        return lambda: ran.append(name) or {"ms": 1.0}
    base = {"section": "one_pass", "prompt": 48, "chunk": 48}
    for name in ("ours", "ours 64x32 w4 s2", "flashinfer fa3 paged", "sdpa cudnn (gqa)"):
        option = ao.Option(name, None, needs_cuda=False)
        row = bench.attempt(base, option, work(name))
        assert (row is None) == (name not in ("ours", "flashinfer fa3 paged")), name
    assert ran == ["ours", "flashinfer fa3 paged"]
    assert [r["option"] for r in bench.rows] == ran


def test_ratios_are_to_the_faster_correct_sdpa_cudnn_one_pass():
    rows = [_row("one_pass", "sdpa cudnn (gqa)", 16384, 3.4),
            _row("one_pass", "sdpa cudnn (kv expanded)", 16384, 3.3),
            _row("one_pass", "sdpa cudnn (broken)", 16384, 1.0, correct=False),
            _row("chunked", "ours", 2048, 6.6), _row("mixed", "ours", 2048, 1.0)]
    ao.add_ratios(rows)
    assert abs(rows[3]["ratio_to_sdpa_cudnn"] - 2.0) < 1e-9
    assert "ratio_to_sdpa_cudnn" not in rows[4]


CHILD = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from test_attention_options import _chunk, ao
op, errors = ao.LseOp("cpu", False), {}
for prompt, prefix in ((80, 48), (160, 130)):  # prefixes short of one key tile, and past it
    chunk = _chunk(prompt, prefix)
    for by_ours in (False, True):
        out = ao.split(op, by_ours)(chunk)()
        errors[f"{prefix}:{by_ours}"] = ao.chunk_error(chunk, out, 1 << 30, 0.25)
print(json.dumps(errors))
"""


def test_split_merges_the_square_and_the_prefix_exactly():
    """SPLIT on the interpreter: the chunk's causal square by the CPU LSE op, the prefix
    gathered or through the prefix kernel (masked tail, and whole tiles plus a tail), merged
    by LSE: float32 attention within 1e-5 of the reference."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(errors) == 4 and max(errors.values()) < 1e-5, errors
