"""benchmarks/attention_schedule.py on the CPU: a launch's programs as the Triton kernel lays
out its grid, and their list schedule."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import attention_schedule as bench  # noqa: E402


def test_a_fresh_prompt_gives_one_program_per_tile_and_head():
    # Llama-3.1-8B: 8 KV heads, a GQA group of 4, so 32 query tokens a 128-row tile; the
    # kernel's grid is (num_tokens // 32 + num_seqs) tiles x 8 heads
    blocks, splits = bench.launch_programs([(16384, 0)], [], 8, 4, 132, 128)
    assert splits == 1 and len(blocks) == (16384 // 32 + 1) * 8
    per_head = blocks[: 16384 // 32 + 1]
    assert per_head[0] == 1 and per_head[-2] == 128 and per_head[-1] == 0  # last tile exits
    assert (blocks.reshape(8, -1) == per_head).all()  # every head the same tiles


def test_a_short_chunk_over_a_long_prefix_splits_its_keys():
    # 512 new tokens: 17 tiles x 8 heads = 136 programs >= 132 SMs, so no split; 128 new
    # tokens: 5 x 8 = 40 < 132, split into ceil(2 x 132 / 40) = 7 shares of the keys
    assert bench.launch_programs([(512, 8192)], [], 8, 4, 132, 128)[1] == 1
    blocks, splits = bench.launch_programs([(128, 2048)], [], 8, 4, 132, 128)
    assert splits == 7 and len(blocks) == 7 * 40
    # the last tile (2,048 + 128 keys = 17 blocks) cut evenly: 7 shares of 3, 3, ..., 2 blocks
    last_tile = blocks.reshape(7, 8, 5)[:, 0, 3]
    assert last_tile.sum() == 17 and last_tile.max() - last_tile.min() <= 3


def test_decode_rows_get_a_tile_of_their_own():
    blocks, _ = bench.launch_programs([(1024, 0)], [30000, 1000], 8, 4, 132, 128)
    per_head = blocks[: len(blocks) // 8]
    assert per_head[0] == -(-30000 // 128) and per_head[1] == -(-1000 // 128)


def test_list_schedule():
    # equal programs fill the slots in waves; one long program last ends last
    assert bench.makespan(np.full(264, 2.0), 132) == 4.0
    assert bench.makespan(np.full(133, 1.0), 132) == 2.0
    assert bench.makespan(np.array([1.0] * 131 + [10.0]), 132) == 10.0
    # a long program first frees its slot last: the others queue on the rest
    assert bench.makespan(np.array([10.0] + [1.0] * 262), 132) == 10.0
    assert bench.makespan(np.array([0.0, 0.0, 3.0]), 2) == 3.0  # exits take no slot
