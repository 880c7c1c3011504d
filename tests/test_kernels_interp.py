"""Triton kernels checked on CPU through Triton's interpreter.

TRITON_INTERPRET must be set before triton is first imported, and other test modules
import the kernels in compiled mode, so the cases run in one child process (this file
run as a script); each pytest test then checks its case's result.
fp16/fp32 only: the interpreter's bf16 tl.dot is wrong; bf16 is checked on the GPU.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# name -> (query_lens, prefix_lens, H, KVH, D, block_size, dtype, num_splits[, min_split_keys])
# Decode cases without num_splits run the per-step split plan; the interpreter counts 4 SMs
# (8 target programs), so a small min_split_keys makes long sequences take several shares.
CASES: dict[str, tuple] = {
    "decode_mha_d64_bs16": ([1] * 5, [0, 15, 16, 40, 130], 4, 4, 64, 16, "float32", None),
    "decode_gqa4_d128_bs32": ([1] * 4, [3, 31, 77, 200], 8, 2, 128, 32, "float16", None),
    "decode_gqa7_split3": ([1] * 3, [5, 90, 150], 7, 1, 64, 16, "float32", 3),
    "decode_gqa4_split5_fp16": ([1] * 2, [0, 260], 8, 2, 128, 16, "float16", 5),
    "prefill_one_chunk_gqa4": ([150], [0], 8, 2, 64, 16, "float32", None),
    "prefill_chunked_prefix_gqa7": ([70, 33], [64, 129], 14, 2, 64, 32, "float16", None),
    "prefill_mha_d128_bs64": ([130, 5], [0, 70], 2, 2, 128, 64, "float32", None),
    "mixed_batch_gqa4": ([1, 40, 1, 17, 1], [99, 0, 7, 64, 300], 8, 2, 64, 16, "float16",
                         None),
    "decode_padded_empty_seqs": ([1, 0, 1, 0], [10, 0, 5, 0], 4, 2, 64, 16, "float32", 2),
    "prefill_split4_gqa4": ([40, 75], [200, 31], 8, 2, 64, 16, "float16", 4),
    "mixed_split3_gqa7": ([1, 30, 1], [90, 60, 0], 7, 1, 128, 32, "float32", 3),
    "mixed_gqa7_d128": ([3, 1, 50], [20, 45, 10], 7, 1, 128, 16, "float32", None),
    "decode_plan_one_long_mqa": ([1, 1], [2000, 10], 7, 1, 64, 16, "float32", None, 16),
    "decode_plan_skewed_gqa4": ([1] * 6, [700, 3, 40, 0, 130, 64], 8, 2, 64, 16, "float16",
                                None, 16),
    "decode_plan_mha_d128": ([1] * 3, [900, 1, 333], 4, 4, 128, 32, "float32", None, 64),
}

# Cases run again in other launch orders of the prefill tile (TileConfig.longest_first,
# TileConfig.heads_inner): the same outputs whatever order the tiles start in, split keys and
# mixed batches included
LAUNCH_ORDERS = {"longest_first": {"longest_first": True},
                 "heads_inner": {"heads_inner": True},
                 "longest_first_heads_inner": {"longest_first": True, "heads_inner": True}}
LONGEST_FIRST_CASES = ("prefill_chunked_prefix_gqa7", "prefill_mha_d128_bs64",
                       "mixed_batch_gqa4", "prefill_split4_gqa4", "mixed_gqa7_d128")

# Split plans checked for their invariants: (seq_lens, KVH, min_keys, block_n)
PLAN_CASES = [
    ([5], 1, 16, 64),
    ([2000, 10], 1, 16, 64),
    ([700, 3, 40, 1, 130, 64], 2, 16, 64),
    ([1] * 40 + [9000], 8, 256, 64),
    ([300] * 17, 8, 256, 64),
    ([70000, 2, 5], 8, 256, 64),  # longest / MAX_NUM_SPLITS sets the share
    ([1, 0, 1, 0], 2, 16, 16),  # padded graph rows: length 0 still gets one share
]

# Plans whose shares follow from the scoring rule by hand, on the interpreter's 4 SMs with 4
# programs per SM (16 slots): (seq_lens, KVH, min_keys) -> shares of each sequence
PLAN_CHOICES = [
    # 4 shares each (the smallest share, 320 keys) are 20 programs: two waves of 250-key
    # programs (cost 500); 3 shares (448) are 15 programs in one wave of 334 (cost 384)
    (([1000] * 5, 1, 16), [3] * 5),
    # the smallest share (256) splits evenly into 16 programs: one wave, nothing better
    (([1024] * 4, 1, 16), [4] * 4),
    # one long sequence among short ones: 11 shares of 192 keys, though 23 programs need two
    # waves (cost 245); 4 shares (16 programs, one wave) would cost their length, 512
    (([64] * 12 + [2048], 1, 16), [1] * 12 + [11]),
    # 5 x 1000 keys as in the first case, padded to a graph of 8 rows by rows of one key: the
    # padding takes no slot, so 3 shares (15 programs, one wave, cost 384) still beat 4
    # (20 programs, two waves of 250, cost 500); counting the 3 padding programs made 3
    # shares two waves too (18 programs, cost 556) and chose 4 (23, cost 435)
    (([1000] * 5 + [1] * 3, 1, 16), [3] * 5 + [1] * 3),
]


def _plan_shares(seq_lens: list[int], kv_heads: int, min_keys: int) -> list[int]:
    import torch

    from gpu_backend.kernels.attention import plan_decode_splits

    plan = plan_decode_splits(torch.tensor(seq_lens, dtype=torch.int32), kv_heads, 64,
                              min_keys, target_waves=4)
    return plan.seq_shares.tolist()


def _run_case(name: str, order: str | None = None) -> float:
    import dataclasses

    import torch

    from gpu_backend.kernels import paged_attention, store_kvcache
    from gpu_backend.kernels.attention import prefill_config
    from tests.kernel_cases import dense_reference, make_problem, rel_error

    query_lens, prefix_lens, heads, kv_heads, head_dim, block_size, dtype, splits, *rest = (
        CASES[name])
    pb = make_problem(query_lens, prefix_lens, heads, kv_heads, head_dim, block_size,
                      getattr(torch, dtype), seed=zlib.crc32(name.encode()))
    store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    tile = (dataclasses.replace(prefill_config(head_dim), **LAUNCH_ORDERS[order])
            if order else None)
    out = paged_attention(pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens,
                          pb.query_start_loc, pb.scale, max_query_len=pb.max_query_len,
                          max_seq_len=pb.max_seq_len, num_splits=splits,
                          min_split_keys=rest[0] if rest else 256, tile_config=tile)
    assert out.dtype == pb.q.dtype and out.shape == pb.q.shape
    return rel_error(out, dense_reference(pb))


def _plan_violations(seq_lens: list[int], kv_heads: int, min_keys: int, block_n: int) -> list[str]:
    """Every invariant of a decode split plan that the device plan breaks (empty: none)."""
    import torch

    from gpu_backend.kernels.attention import (
        DECODE_TARGET_WAVES,
        MAX_NUM_SPLITS,
        _num_sms,
        plan_decode_splits,
    )

    lens = torch.tensor(seq_lens, dtype=torch.int32)
    plan = plan_decode_splits(lens, kv_heads, block_n, min_keys)
    shares, starts = plan.seq_shares.tolist(), plan.extra_start.tolist()
    keys = int(plan.split_keys.item())
    num_extras = starts[-1]
    extras = list(zip(plan.extra_seq.tolist()[:num_extras], plan.extra_split.tolist()[:num_extras]))
    target = DECODE_TARGET_WAVES * _num_sms(lens.device)
    bad = []
    if keys % block_n or keys < min_keys or keys * target < sum(seq_lens) * kv_heads:
        bad.append(f"share of {keys} keys")
    if num_extras > plan.extra_seq.shape[0]:
        bad.append(f"{num_extras} extra shares for a launch of {plan.extra_seq.shape[0]}")
    for i, n in enumerate(seq_lens):
        k = shares[i]
        if not 1 <= k <= MAX_NUM_SPLITS or k * keys < n or (k - 1) * keys >= max(n, 1):
            bad.append(f"sequence {i} of {n} keys in {k} shares of {keys}")
        cut = math.ceil(math.ceil(max(n, 1) / k) / block_n) * block_n  # the kernel's even cut
        if k * cut < n or (k - 1) * cut >= max(n, 1) or cut > keys:
            bad.append(f"sequence {i} of {n} keys cut in {k} shares of {cut}")
        mine = extras[starts[i]:starts[i] + k - 1]
        if mine != [(i, j) for j in range(1, k)]:
            bad.append(f"sequence {i}: extra shares {mine}")
    if sum(k - 1 for k in shares) != num_extras:
        bad.append(f"{num_extras} extras for shares {shares}")
    return bad


def _run_store_case() -> float:
    """Store from a non-contiguous qkv view; negative slots must be skipped."""
    import torch

    from gpu_backend.kernels import store_kvcache, store_kvcache_ref

    torch.manual_seed(0)
    tokens, kv_heads, head_dim, block_size = 9, 3, 64, 16
    qkv = torch.randn(tokens, 4 * kv_heads * head_dim, dtype=torch.float16)
    k = qkv[:, 2 * kv_heads * head_dim:3 * kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    v = qkv[:, 3 * kv_heads * head_dim:].view(tokens, kv_heads, head_dim)
    pool = torch.zeros(6, 2, 2, block_size, kv_heads, head_dim, dtype=torch.float16)
    expect = pool.clone()
    slots = torch.tensor([5, 17, 94, -1, 33, 0, 80, 47, 63], dtype=torch.int32)
    store_kvcache(k, v, pool[:, 1, 0], pool[:, 1, 1], slots)
    store_kvcache_ref(k, v, expect[:, 1, 0], expect[:, 1, 1], slots)
    return float((pool.float() - expect.float()).abs().max())


def _run_model_case(mixed_split: bool = False) -> float:
    """The tiny paged model with the Triton kernels against the dense forward; with
    mixed_split its mixed steps run their decode rows apart (from one key on)."""
    from tests.test_model_cpu import run_scenario

    max_err, ids_a, ids_b = run_scenario("triton", mixed_split_min_keys=1 if mixed_split else 0)
    assert ids_a[:len(ids_b)] == ids_b
    return max_err


# name -> (function name in tests/fused_cases.py, kwargs); dtype names resolved in the child
FUSED_CASES: dict[str, tuple[str, dict]] = {
    "norm_residual_f32": ("norm_case", {"hidden": 100, "rows": 7, "with_residual": True,
                                        "dtype": "float32"}),
    "norm_plain_f16": ("norm_case", {"hidden": 256, "rows": 5, "with_residual": False,
                                     "dtype": "float16"}),
    "silu_f32_two_blocks": ("silu_case", {"inter": 1500, "rows": 3, "dtype": "float32"}),
    "rotary_store_gqa7_f32": ("rotary_store_case", {"heads": 7, "kv_heads": 1, "head_dim": 64,
                                                    "tokens": 23, "block_size": 16,
                                                    "dtype": "float32"}),
    "rotary_store_gqa3_f16": ("rotary_store_case", {"heads": 6, "kv_heads": 3, "head_dim": 32,
                                                    "tokens": 11, "block_size": 32,
                                                    "dtype": "float16"}),
}


def _run_fused_case(name: str) -> float:
    import torch

    import tests.fused_cases as cases

    func, kwargs = FUSED_CASES[name]
    return getattr(cases, func)(**{**kwargs, "dtype": getattr(torch, kwargs["dtype"])})


def _main() -> None:
    results = {name: _run_case(name) for name in CASES}
    results |= {f"{name}_{order}": _run_case(name, order)
                for name in LONGEST_FIRST_CASES for order in LAUNCH_ORDERS}
    results |= {name: _run_fused_case(name) for name in FUSED_CASES}
    results["store"] = _run_store_case()
    results["model"] = _run_model_case()
    results["model_mixed_split"] = _run_model_case(mixed_split=True)
    results["plans"] = [_plan_violations(*case) for case in PLAN_CASES]
    results["plan_choices"] = [_plan_shares(*case) for case, _ in PLAN_CHOICES]
    results["attention_launch"] = _run_attention_launch_case()
    print(json.dumps(results))


def _run_attention_launch_case() -> dict:
    """The profile's attention timing path (attention_profile.launch_ms) on a mixed step: the
    launch it builds (rows first, then the chunk over its prefix) runs, its output the shape
    of the step's tokens x heads, every value finite."""
    import torch

    from gpu_backend.engine.attention_profile import launch_ms
    from gpu_backend.engine.shapes import StepShape

    seen = {}

    def run_once(fn, reps: int) -> float:
        out = fn()
        seen.update(shape=list(out.shape), finite=bool(torch.isfinite(out).all()), reps=reps)
        return 1.0

    ms = launch_ms(StepShape("mixed", ((40, 70),), (90, 300, 5)), 8, 2, 64, reps=3,
                   device="cpu", dtype=torch.float32, timer=run_once)
    return {"ms": ms, **seen}


@pytest.fixture(scope="module")
def interp_results() -> dict[str, float]:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_paged_attention_matches_reference(interp_results: dict[str, float], name: str) -> None:
    tol = 1e-4 if CASES[name][6] == "float32" else 5e-3
    assert interp_results[name] < tol, f"{name}: rel error {interp_results[name]}"


@pytest.mark.parametrize("order", list(LAUNCH_ORDERS))
@pytest.mark.parametrize("name", LONGEST_FIRST_CASES)
def test_other_launch_orders_match_reference(interp_results: dict[str, float], name: str,
                                             order: str) -> None:
    tol = 1e-4 if CASES[name][6] == "float32" else 5e-3
    error = interp_results[f"{name}_{order}"]
    assert error < tol, f"{name}, launch order {order}: rel error {error}"


@pytest.mark.parametrize("name", list(FUSED_CASES))
def test_fused_kernel_matches_torch_layers(interp_results: dict[str, float], name: str) -> None:
    tol = 1e-5 if FUSED_CASES[name][1]["dtype"] == "float32" else 2e-3
    assert interp_results[name] < tol, f"{name}: rel error {interp_results[name]}"


@pytest.mark.parametrize("case", range(len(PLAN_CASES)))
def test_decode_split_plan_covers_every_sequence(interp_results: dict, case: int) -> None:
    """Shares cover each sequence exactly (no share past its end), fit the launch, spread
    the batch's keys over at most the target number of programs, and stay under the cap."""
    assert interp_results["plans"][case] == [], PLAN_CASES[case]


@pytest.mark.parametrize("case", range(len(PLAN_CHOICES)))
def test_decode_split_plan_scores_waves(interp_results: dict, case: int) -> None:
    """The share size is the one whose programs best fill the slots, not simply the smallest."""
    assert interp_results["plan_choices"][case] == PLAN_CHOICES[case][1], PLAN_CHOICES[case][0]


def test_the_profiles_attention_launch_runs_the_steps_tokens(interp_results: dict) -> None:
    """3 decode rows and a 40-token chunk: 43 tokens x 8 heads x 64 dims, all finite."""
    assert interp_results["attention_launch"] == {"ms": 1.0, "shape": [43, 8, 64],
                                                  "finite": True, "reps": 3}


def test_store_kvcache_matches_reference(interp_results: dict[str, float]) -> None:
    assert interp_results["store"] == 0.0


def test_model_with_triton_kernels_matches_dense(interp_results: dict[str, float]) -> None:
    assert interp_results["model"] < 1e-4


def test_model_with_mixed_steps_split_matches_dense(interp_results: dict[str, float]) -> None:
    assert interp_results["model_mixed_split"] < 1e-4


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest or set TRITON_INTERPRET=1"
    sys.path.insert(0, str(ROOT))
    _main()
