"""SPLIT attention (gpu_backend/kernels/split_attention.py) and the split backend on CPU.

In this process: the SDPA op with its log-sum-exp (shapes, natural-log base, GQA), the torch
merge, the gather, the step plan, the memory profile's dummy steps, the model switch and the
CLI choice. The parts that launch Triton kernels (the LSE merge, the decode rows' paged
kernel, the KV store, the fused layer kernels) run in one child process through Triton's
interpreter (TRITON_INTERPRET must be set before triton is first imported; see
test_kernels_interp.py), checked against gpu_backend.kernels.reference's float32 paged
reference and against the torch backend's model.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]

# name -> (query_lens, prefix_lens, H, KVH, D, block_size, dtype, num_decodes,
#          SplitShapes(max_segment_tokens, min_segment_tokens, min_rows) (None: the engine's),
#          buffers made by prepare_plan (else inside the call), min_query_len (auto: Triton below))
SPLIT_CASES: dict[str, tuple] = {
    "prefill_square_only": ([40, 23], [0, 0], 8, 2, 32, 16, "float32", 0, (64, 16, 16), True, 1),
    # prefix 100 = segments of 32, 32, 32 and 4 keys absorbed; 13 keys absorbed (no segment)
    "prefix_many_segments_gqa4": ([30, 17], [100, 13], 8, 2, 32, 16, "float32", 0,
                                  (32, 16, 16), True, 1),
    # prefix 112 = 64 + 32 + 16 (binary digits), 125 = 64 + 32 + 16 and 13 absorbed
    "prefix_binary_segments": ([21, 50], [112, 125], 4, 2, 16, 16, "float32", 0,
                               (64, 16, 16), True, 1),
    "prefix_one_full_segment": ([9, 20], [64, 65], 4, 4, 16, 32, "float32", 0, (64, 32, 16),
                                True, 1),
    "mixed_decodes_mqa7": ([1, 1, 1, 25, 9], [50, 0, 130, 70, 33], 7, 1, 64, 32, "float32",
                           3, (64, 32, 24), True, 1),
    "mixed_fp16_gqa4": ([1, 1, 40, 33], [300, 5, 64, 200], 8, 2, 64, 16, "float16", 2,
                        (64, 16, 16), True, 1),
    "buffers_per_call": ([1, 12, 30], [40, 77, 3], 6, 3, 32, 16, "float32", 1, (16, 16, 8),
                         False, 1),
    # auto: rows under 24 new tokens (5; 3 and 7 side by side) through the Triton kernel
    "auto_mixed_runs": ([1, 1, 5, 40, 3, 7, 33], [50, 9, 20, 70, 0, 100, 16], 8, 2, 32, 16,
                        "float32", 2, (32, 16, 16), True, 24),
    "auto_runs_per_call": ([1, 30, 4, 26], [7, 40, 60, 0], 4, 1, 32, 16, "float32", 1,
                           (32, 16, 16), False, 24),
    # prefix 200 = six segments of 32 and 8 absorbed: 7 parts, folded into a float32 running
    # result at 4 (LIVE_PARTS); 150 = four of 32, one of 16 and 6 absorbed: 6 parts
    "prefix_folds_running_result": ([19, 33], [200, 150], 4, 2, 32, 16, "float32", 0,
                                    (32, 16, 16), True, 1),
    # the engine's own shapes: 8,192 + 100 absorbed; 8,192 + 2,048 + 1,024 + 500 absorbed
    "engine_shapes": ([1, 20, 30], [40, 8292, 11764], 4, 2, 16, 16, "float32", 1, None, True,
                      1),
}


# ----------------------------------------------------------------------------- in process

def reference_attention(q, k, v, scale, causal):
    """float32 attention of q [S, H, D] over k, v [L, KVH, D] (query head h reads KV head
    h // group; causal: row i sees keys 0..i) -> (out [S, H, D], natural lse [S, H])."""
    group = q.shape[1] // k.shape[1]
    kk, vv = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    scores = torch.einsum("shd,lhd->hsl", q.float(), kk) * scale
    if causal:
        seen = torch.arange(k.shape[0])[None, :] <= torch.arange(q.shape[0])[:, None]
        scores = scores.masked_fill(~seen, float("-inf"))
    out = torch.einsum("hsl,lhd->shd", torch.softmax(scores, -1), vv)
    return out, torch.logsumexp(scores, -1).transpose(0, 1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_with_lse_returns_out_and_natural_log_lse(causal, dtype):
    from gpu_backend.kernels.split_attention import sdpa_with_lse

    gen = torch.Generator().manual_seed(1)
    keys = 11 if causal else 29
    q = torch.randn(40, 6, 16, generator=gen).to(dtype)[5:16]  # 11 rows of a longer batch
    k = torch.randn(keys, 2, 16, generator=gen).to(dtype)
    v = torch.randn(keys, 2, 16, generator=gen).to(dtype)
    out, lse = sdpa_with_lse(q, k, v, causal, 0.3)
    ref_out, ref_lse = reference_attention(q, k, v, 0.3, causal)
    assert out.shape == (11, 6, 16) and out.dtype == dtype and out.stride(-1) == 1
    assert lse.shape == (11, 6) and lse.dtype == torch.float32
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert (out.float() - ref_out).abs().max() < tol
    assert (lse - ref_lse).abs().max() < tol
    # base 2 would differ by a factor log2(e) = 1.44: far beyond the tolerance
    assert (lse - ref_lse / math.log(2)).abs().max() > 0.1


def test_sdpa_causal_call_is_the_square_only():
    from gpu_backend.kernels.split_attention import sdpa_with_lse

    with pytest.raises(ValueError, match="square"):
        sdpa_with_lse(torch.randn(5, 2, 8), torch.randn(7, 2, 8), torch.randn(7, 2, 8), True, 1.0)


def test_padded_rows_follow_the_ladders():
    from sim.core.split_shapes import SplitShapes

    shapes = SplitShapes()
    squares = {n: shapes.square_rows(n) for n in (1, 1024, 1025, 1152, 1153, 1537, 2049, 4097,
                                                  8192, 8193, 9215, 9217)}
    assert squares == {1: 1024, 1024: 1024, 1025: 1152, 1152: 1152, 1153: 1536, 1537: 2048,
                       2049: 2304, 4097: 4608, 8192: 8192, 8193: 9216, 9215: 9216,
                       9217: 12288}
    segments = {n: shapes.segment_rows(n) for n in (1, 1025, 1984, 2049, 6000, 8128)}
    assert segments == {1: 1024, 1025: 1536, 1984: 2048, 2049: 3072, 6000: 6144, 8128: 8192}


def test_a_prefix_splits_into_power_of_two_segments_and_an_absorbed_tail():
    from sim.core.split_shapes import SplitShapes

    shapes = SplitShapes()
    assert shapes.split_prefix(0) == (0, ())
    assert shapes.split_prefix(1023) == (1023, ())
    assert shapes.split_prefix(14336) == (0, ((0, 8192), (8192, 4096), (12288, 2048)))
    assert shapes.split_prefix(8192 + 1024 + 5) == (5, ((0, 8192), (8192, 1024)))
    assert shapes.split_prefix(2 * 8192 + 7 * 1024 + 1000) == (
        1000, ((0, 8192), (8192, 8192), (16384, 4096), (20480, 2048), (22528, 1024)))


def test_every_step_meets_only_the_enumerated_shapes():
    """39 shapes for 8,192 batched tokens and 32,768 of context; random chunks and prefixes
    within those limits plan only shapes among them, padded by at most the ladders' steps,
    their segments tiling the prefix up to the absorbed tail."""
    from gpu_backend.kernels.split_plan import plan_split
    from sim.core.split_shapes import SdpaShape, SplitShapes

    shapes = SplitShapes()
    allowed = set(shapes.sdpa_shapes(8192, 32768))
    assert len(allowed) == 39
    assert SdpaShape(9216, 9216, True) in allowed and SdpaShape(12288, 12288, True) not in allowed
    assert sum(s.causal for s in allowed) == 11
    rng = np.random.default_rng(4)
    for _ in range(400):
        chunk = int(rng.integers(1, 8193))
        prefix = int(rng.integers(0, 32768 - chunk + 1))
        plan = plan_split(np.array([0, chunk]), np.array([chunk + prefix]), 0, shapes)
        (seq,) = plan.seqs
        assert plan.sdpa_shapes() <= allowed, (chunk, prefix)
        assert seq.absorbed < 1024 and seq.square_rows >= seq.absorbed + chunk
        assert seq.square_rows <= max(1024, 1.5 * (seq.absorbed + chunk))
        assert chunk <= seq.segment_rows <= max(1024, 1.5 * chunk)
        start = 0
        for first, keys in seq.segments:
            assert first == start and keys in (1024, 2048, 4096, 8192)
            start += keys
        assert start + seq.absorbed == prefix
    small = shapes.sdpa_shapes(2048, 4096)  # squares to 3,072; segments of 1,024 .. 2,048
    assert max(s.rows for s in small if s.causal) == 3072
    assert {s.keys for s in small if not s.causal} == {1024, 2048}


def test_torch_merge_of_two_key_sets_is_attention_over_both():
    from gpu_backend.kernels.lse_merge import merge_partials_ref
    from gpu_backend.kernels.split_attention import sdpa_with_lse

    gen = torch.Generator().manual_seed(2)
    q = torch.randn(9, 4, 8, generator=gen)
    k, v = torch.randn(30, 2, 8, generator=gen), torch.randn(30, 2, 8, generator=gen)
    a, lse_a = sdpa_with_lse(q, k[:12], v[:12], False, 0.5)
    b, lse_b = sdpa_with_lse(q, k[12:], v[12:], False, 0.5)
    out, lse = merge_partials_ref(a, lse_a, b, lse_b)
    ref_out, ref_lse = reference_attention(q, k, v, 0.5, False)
    assert (out - ref_out).abs().max() < 1e-5 and (lse - ref_lse).abs().max() < 1e-5


def test_torch_merge_with_an_empty_side():
    """A side without keys (lse -inf) weighs nothing; both empty give zeros and -inf."""
    from gpu_backend.kernels.lse_merge import merge_partials_ref

    a, b = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    lse_a = torch.tensor([[0.5, -1.0, 2.0], [float("-inf")] * 3])
    lse_b = torch.full((2, 3), float("-inf"))
    out, lse = merge_partials_ref(a, lse_a, b, lse_b)
    assert torch.equal(out[0], a[0]) and torch.equal(lse[0], lse_a[0])
    assert torch.equal(out[1], torch.zeros(3, 4)) and torch.isneginf(lse[1]).all()


def test_plan_split_lists_prefill_rows_with_their_prefixes():
    from gpu_backend.kernels.split_attention import prepare_plan
    from gpu_backend.kernels.split_plan import PrefillSeq, plan_split
    from sim.core.split_shapes import SplitShapes

    qsl = np.array([0, 1, 2, 42, 42, 59])  # rows: 2 decodes, a 40-token chunk, empty, 17
    seq_lens = np.array([100, 8, 40, 5, 117], dtype=np.int32)
    cache = torch.zeros(4, 16, 2, 8)
    shapes = SplitShapes(32, 16, 16)
    plan = plan_split(qsl, seq_lens, 2, shapes)
    # 100 keys of prefix: segments 0..31, 32..63, 64..95 and 4 keys absorbed into the square;
    # square rows: 40 -> 48 (16 x 3), 21 -> 24 (16 x 3/2); segment rows 17 -> 24
    assert plan.seqs == (PrefillSeq(2, 2, 40, 0, 0, 48, 48, ()),
                         PrefillSeq(4, 42, 17, 100, 4, 24, 24, ((0, 32), (32, 32), (64, 32))))
    assert (plan.num_decodes, plan.decode_max_seq_len, plan.runs) == (2, 100, ())
    assert plan.buffers is None
    ready = prepare_plan(plan, cache, 6)
    buffers = ready.buffers
    assert buffers is not None and buffers.q.shape == (48, 6, 8)  # the larger sequence's rows
    assert buffers.square_k.shape == (3, 16, 2, 8)  # 48 rows in whole blocks
    assert buffers.segment_k is not None and buffers.segment_k.shape == (2, 16, 2, 8)
    assert all(int(x.count_nonzero()) == 0 for x in (buffers.q, buffers.square_k))
    assert buffers.nbytes == (48 * 6 * 8 + 2 * 48 * 2 * 8 + 2 * 32 * 2 * 8) * 4
    square_only = prepare_plan(plan_split(np.array([0, 40]), np.array([40]), 0, shapes),
                               cache, 6)
    assert square_only.buffers is not None and square_only.buffers.segment_k is None


def test_plan_split_sends_short_rows_to_the_paged_kernel_in_runs():
    from gpu_backend.kernels.split_attention import prepare_plan
    from gpu_backend.kernels.split_plan import plan_split

    # rows: 1 decode; 5 (short), 30 (split), 3 and 7 (short, side by side), 26 (split)
    qsl = np.array([0, 1, 6, 36, 39, 46, 72])
    seq_lens = np.array([9, 25, 30, 3, 107, 26], dtype=np.int32)
    plan = plan_split(qsl, seq_lens, 1, min_query_len=24)
    assert [s.row for s in plan.seqs] == [2, 5]
    assert [(r.first_row, r.end_row, r.token_start, r.token_end, r.max_query_len,
             r.max_seq_len) for r in plan.runs] == [(1, 2, 1, 6, 5, 25), (3, 5, 36, 46, 7, 107)]
    assert plan.runs[1].query_start_loc.tolist() == [0, 3, 10]
    ready = prepare_plan(plan, torch.zeros(4, 16, 2, 8), 4)
    assert ready.run_starts is not None
    assert [t.tolist() for t in ready.run_starts] == [[0, 5], [0, 3, 10]]
    everything = plan_split(qsl, seq_lens, 1)  # the split backend: every prefill row
    assert [s.row for s in everything.seqs] == [1, 2, 3, 4, 5] and everything.runs == ()


def test_plan_split_refuses_what_it_cannot_run():
    from gpu_backend.kernels.split_plan import SplitBuffers, plan_split
    from sim.core.split_shapes import SplitShapes

    with pytest.raises(ValueError, match="decode rows"):
        plan_split(np.array([0, 1, 5]), np.array([9, 5]), 2)  # row 1 has 4 new tokens
    with pytest.raises(ValueError, match="one more entry"):
        plan_split(np.array([0, 1]), np.array([9, 5]), 0)
    with pytest.raises(ValueError, match="multiple of the cache's block size"):
        plan = plan_split(np.array([0, 40]), np.array([100]), 0, SplitShapes(48, 24, 16))
        SplitBuffers.for_plan(plan, torch.zeros(4, 16, 2, 8), 2)
    with pytest.raises(ValueError, match="power of two"):
        SplitShapes(48, 32, 16)
    with pytest.raises(ValueError, match="multiple of 8"):
        SplitShapes(64, 16, 12)


def test_split_profile_shapes():
    """The chunk takes all the step's tokens over a prefix a block past one segment; where
    the context is too short for both, the longest chunk and a chunk that fits the prefix."""
    from gpu_backend.engine.memory import split_profile_shapes
    from sim.core.split_shapes import SplitShapes

    shapes = SplitShapes()  # the worst prefix: 8,192 + 1,024 + 1,008 absorbed = 10,224
    assert split_profile_shapes(2048, 131072, 16, shapes) == [(2048, 10224)]
    assert split_profile_shapes(2048, 4096, 16, shapes) == [(2048, 2048)]
    assert split_profile_shapes(8192, 12000, 16, shapes) == [(8192, 3808), (1776, 10224)]
    assert split_profile_shapes(8192, 8000, 16, shapes) == [(7984, 16)]


def test_dummy_prefix_batch_is_one_chunk_over_a_prefix():
    from gpu_backend.engine.memory import dummy_prefix_batch

    batch, num_blocks = dummy_prefix_batch(40, 96, 16, torch.device("cpu"))
    assert num_blocks == 4  # the chunk's 3 blocks and the scratch block
    assert batch.positions.tolist() == list(range(96, 136))
    assert batch.seq_lens.tolist() == [136] and batch.max_query_len == 40
    table = batch.block_tables[0].tolist()
    assert len(table) == 136 // 16 + 1 and max(table) == 3 and min(table) >= 1
    slots = batch.slot_mapping.tolist()  # the chunk's tokens in blocks 1..3, in order
    assert slots == list(range(16, 56))
    assert batch.host_lens is not None
    assert batch.host_lens.query_start_loc.tolist() == batch.query_start_loc.tolist()
    assert batch.host_lens.seq_lens.tolist() == [136]
    with pytest.raises(ValueError, match="multiple"):
        dummy_prefix_batch(40, 90, 16, torch.device("cpu"))


def test_host_lens_from_the_engine_and_from_the_device():
    from gpu_backend.batch import ForwardBatch
    from gpu_backend.engine.shapes import host_batch, mixed_shape
    from gpu_backend.layers import host_lens_from_device

    host = host_batch(mixed_shape(30, 50, 3, 20), 16, 64)
    lens = host.host_lens()
    assert lens.query_start_loc is host.query_start_loc and lens.seq_lens is host.seq_lens
    zeros = torch.zeros(host.num_tokens, dtype=torch.int64)
    batch = ForwardBatch(zeros, zeros, zeros, torch.as_tensor(host.block_tables),
                         torch.as_tensor(host.seq_lens), torch.as_tensor(host.query_start_loc),
                         zeros[:1], host.max_query_len, host.max_seq_len, host.num_decodes)
    copied = host_lens_from_device(batch)
    assert copied.query_start_loc.tolist() == [0, 1, 2, 3, 33]
    assert copied.seq_lens.tolist() == [20, 20, 20, 80]
    assert copied.block_tables is None
    both = host_lens_from_device(batch, with_tables=True)
    assert both.seq_lens.tolist() == [20, 20, 20, 80]
    assert both.block_tables.dtype == np.int32
    np.testing.assert_array_equal(both.block_tables, host.block_tables)


def test_set_attention_backend_switches_triton_split_and_auto_only():
    from test_model_cpu import tiny_model

    from gpu_backend.model import set_attention_backend

    model = tiny_model("triton")
    set_attention_backend(model, "split")
    assert {layer.attn.backend for layer in model.layers} == {"split"}
    set_attention_backend(model, "auto")
    assert {layer.attn.backend for layer in model.layers} == {"auto"}
    assert all(layer.fused for layer in model.layers)  # the same fused layers either way
    with pytest.raises(ValueError, match="switch among"):
        set_attention_backend(model, "torch")
    with pytest.raises(ValueError, match="switch among"):
        set_attention_backend(tiny_model("torch"), "split")


def test_replay_and_profile_take_the_engine_configs_attention_backend():
    from gpu_backend.__main__ import build_parser
    from sim.core.config_flags import UsageError, engine_config

    parser = build_parser()

    def backend(*argv: str) -> str:
        return engine_config(parser.parse_args(list(argv))).attention_backend

    base = ["replay", "--trace", "azure-conv"]
    assert backend(*base) == "triton"
    assert backend(*base, "--attention-backend", "split") == "split"
    assert backend(*base, "--attention-backend", "auto") == "auto"
    with pytest.raises(UsageError, match="torch"):
        parser.parse_args([*base, "--attention-backend", "torch"])
    profile = ["profile", "--model", "llama-3.1-8b"]
    assert backend(*profile) == "triton"
    assert backend(*profile, "--attention-backend", "auto") == "auto"


def test_cli_backend_choices_are_the_switchable_backends():
    from gpu_backend.layers import FUSED_BACKENDS
    from sim.core.split_shapes import ATTENTION_BACKENDS

    assert ATTENTION_BACKENDS == FUSED_BACKENDS


# ----------------------------------------------------------------------------- interpreter

def _problem(name: str):
    from tests.kernel_cases import make_problem

    query_lens, prefix_lens, heads, kv_heads, head_dim, block_size, dtype = SPLIT_CASES[name][:7]
    return make_problem(query_lens, prefix_lens, heads, kv_heads, head_dim, block_size,
                        getattr(torch, dtype), seed=zlib.crc32(name.encode()))


def _reference(pb) -> torch.Tensor:
    """reference.py's paged attention in float32 over the stored cache."""
    from gpu_backend.kernels import paged_attention_ref

    return paged_attention_ref(pb.q.float(), pb.k_cache.float(), pb.v_cache.float(),
                               pb.block_tables, pb.seq_lens, pb.query_start_loc, pb.scale)


def _case_shapes(name: str):
    from sim.core.split_shapes import SplitShapes

    sizes = SPLIT_CASES[name][8]
    return SplitShapes(*sizes) if sizes is not None else SplitShapes()


class _SdpaShapes(TorchDispatchMode):
    """Records (rows, keys, causal) of every CPU SDPA op the real code runs."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, int, bool]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:
            q, k = args[0], args[1]
            causal = args[4] if len(args) > 4 else (kwargs or {}).get("is_causal", False)
            self.seen.add((q.shape[2], k.shape[2], bool(causal)))
        return func(*args, **(kwargs or {}))


def _run_split_case(name: str) -> dict:
    from gpu_backend.kernels import store_kvcache
    from gpu_backend.kernels.split_attention import prepare_plan, split_attention
    from gpu_backend.kernels.split_plan import plan_split
    from tests.kernel_cases import rel_error

    *_, num_decodes, _, with_buffers, min_query = SPLIT_CASES[name]
    pb = _problem(name)
    shapes = _case_shapes(name)
    store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    plan = plan_split(pb.query_start_loc.numpy(), pb.seq_lens.numpy(), num_decodes, shapes,
                      min_query)
    if with_buffers:
        plan = prepare_plan(plan, pb.k_cache, pb.q.shape[1])
    with _SdpaShapes() as recorder:
        out = split_attention(pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens,
                              pb.query_start_loc, pb.scale, plan)
    assert out.dtype == pb.q.dtype and out.shape == pb.q.shape
    planned = {(s.rows, s.keys, s.causal) for s in plan.sdpa_shapes()}
    return {"err": rel_error(out, _reference(pb)), "sdpa": sorted(recorder.seen),
            "planned": sorted(planned),
            "runs": [[r.first_row, r.end_row] for r in plan.runs],
            "split_rows": [s.row for s in plan.seqs]}


def _run_merge_case() -> dict:
    """The Triton merge on the views SDPA ops return ([1, H, S, D] as [S, H, D]), with 6
    heads and head_dim 48 (both padded in the kernel), rows with an empty side, in place
    with the merged LSE; against the torch merge."""
    from gpu_backend.kernels.lse_merge import merge_partials, merge_partials_ref

    gen = torch.Generator().manual_seed(5)
    a = torch.randn(1, 6, 10, 48, generator=gen)[0].transpose(0, 1)  # [10, 6, 48], strided
    b = torch.randn(10, 6, 48, generator=gen).half()
    lse_a = (3 * torch.randn(1, 6, 10, generator=gen))[0].transpose(0, 1)
    lse_b = 3 * torch.randn(10, 6, generator=gen)
    lse_a[2, 1] = float("-inf")
    lse_b[3] = float("-inf")
    lse_a[4, :] = lse_b[4, :] = float("-inf")
    ref_out, ref_lse = merge_partials_ref(a, lse_a, b, lse_b)
    out = merge_partials(torch.empty(10, 6, 48, dtype=torch.float16), a, lse_a, b, lse_b)
    in_place, in_place_lse = a.clone(), lse_a.clone()
    merge_partials(in_place, in_place, in_place_lse, b, lse_b, out_lse=in_place_lse)
    finite = torch.isfinite(ref_lse)
    return {"out": float((out.float() - ref_out).abs().max()),
            "in_place": float((in_place - ref_out).abs().max()),
            "lse": float((in_place_lse[finite] - ref_lse[finite]).abs().max()),
            "lse_empty": bool(torch.isneginf(in_place_lse[~finite]).all()),
            "empty_rows_zero": bool((in_place[4] == 0).all())}


def _lse_merge_all(parts: list) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 torch merge of many parts, folded pairwise by the reference merge from an
    empty one (no keys: zeros, LSE -inf)."""
    from gpu_backend.kernels.lse_merge import merge_partials_ref

    out = torch.zeros(parts[0][0].shape)
    lse = torch.full(parts[0][1].shape, float("-inf"))
    for o, part_lse in parts:
        out, lse = merge_partials_ref(out, lse, o, part_lse)
    return out, lse


def _run_merge_many_case() -> dict:
    """merge_parts on 1, 5 and 11 parts, strided and fp16 parts among them, rows where some
    or all parts are empty; in place into a part; against the reference merge folded
    pairwise."""
    from gpu_backend.kernels.lse_merge import merge_parts

    gen = torch.Generator().manual_seed(11)

    def part(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        o = torch.randn(1, 6, 9, 48, generator=gen)[0].transpose(0, 1)  # [9, 6, 48], strided
        lse = (4 * torch.randn(1, 6, 9, generator=gen))[0].transpose(0, 1)
        lse[i % 9, i % 6] = float("-inf")
        lse[5] = float("-inf")  # row 5 empty in every part
        return (o.half() if i % 3 == 2 else o), lse

    result: dict = {}
    for count in (1, 5, 11):
        parts = [part(i) for i in range(count)]
        ref_out, ref_lse = _lse_merge_all(parts)
        out, out_lse = torch.empty(9, 6, 48), torch.empty(9, 6)
        merge_parts(out, parts, out_lse=out_lse)
        finite = torch.isfinite(ref_lse)
        result[str(count)] = {
            "out": float((out - ref_out).abs().max()),
            "lse": float((out_lse[finite] - ref_lse[finite]).abs().max()),
            "lse_empty": bool(torch.isneginf(out_lse[~finite]).all()),
            "empty_row_zero": bool((out[5] == 0).all())}
    parts = [part(i) for i in range(4)]
    parts[0] = (parts[0][0].contiguous(), parts[0][1].contiguous())
    ref_out, _ = _lse_merge_all(parts)
    merge_parts(parts[0][0], parts, out_lse=parts[0][1])  # into the first part
    result["in_place"] = float((parts[0][0] - ref_out).abs().max())
    return result


def _run_gather_case() -> dict:
    """gather_kv from a strided pool view (every layer of a block together) through a
    shuffled table row: whole blocks, a last block cut by valid_tokens, a buffer longer than
    the gather; the pool's other slots NaN."""
    from gpu_backend.kernels.kv_gather import gather_kv

    gen = torch.Generator().manual_seed(3)
    pool = torch.full((9, 2, 2, 16, 2, 8), float("nan"))  # [blocks, layers, K/V, 16, KVH, D]
    pool[:, 1] = torch.randn(9, 2, 16, 2, 8, generator=gen)
    k_cache, v_cache = pool[:, 1, 0], pool[:, 1, 1]
    row = torch.tensor([5, 2, 8, 0, 3, 7], dtype=torch.int32)
    k_out, v_out = torch.full((5, 16, 2, 8), -7.0), torch.full((5, 16, 2, 8), -7.0)
    gather_kv(k_cache, v_cache, row, 1, 3, 40, k_out, v_out)  # blocks 2, 8, 0; 40 tokens
    expect_k = k_cache[row[1:4].long()].reshape(48, 2, 8)
    expect_v = v_cache[row[1:4].long()].reshape(48, 2, 8)
    got_k, got_v = k_out[:3].reshape(48, 2, 8), v_out[:3].reshape(48, 2, 8)
    errors = {}
    try:
        gather_kv(k_cache, v_cache, row, 4, 3, 48, k_out, v_out)  # past the row's end
    except ValueError as exc:
        errors["past_row"] = str(exc)
    try:
        gather_kv(k_cache, v_cache, row, 0, 6, 96, k_out, v_out)  # 6 blocks into 5
    except ValueError as exc:
        errors["past_buffer"] = str(exc)
    return {"valid_equal": bool(torch.equal(got_k[:40], expect_k[:40])
                                and torch.equal(got_v[:40], expect_v[:40])),
            "tail_zero": bool((got_k[40:] == 0).all() and (got_v[40:] == 0).all()),
            "rest_untouched": bool((k_out[3:] == -7).all() and (v_out[3:] == -7).all()),
            "errors": errors}


def _mixed_batch(pb, num_decodes: int, with_host: bool):
    from gpu_backend.batch import ForwardBatch, HostLens

    empty = torch.zeros(0, dtype=torch.int64)
    host = (HostLens(pb.query_start_loc.numpy(), pb.seq_lens.numpy()) if with_host else None)
    return ForwardBatch(input_ids=empty, positions=empty, slot_mapping=empty,
                        block_tables=pb.block_tables, seq_lens=pb.seq_lens,
                        query_start_loc=pb.query_start_loc, logits_indices=empty,
                        max_query_len=pb.max_query_len, max_seq_len=pb.max_seq_len,
                        num_decodes=num_decodes, host_lens=host)


def _run_layer_case() -> dict:
    """PagedAttention on the split backend, as Model and the piecewise graphs call it."""
    from gpu_backend.kernels import store_kvcache
    from gpu_backend.layers import PagedAttention
    from sim.core.split_shapes import SplitShapes
    from tests.kernel_cases import make_problem, rel_error

    pb = make_problem([1, 1, 1, 30, 12], [40, 77, 0, 90, 0], 8, 2, 32, 16, torch.float32,
                      seed=11)
    store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    attn = PagedAttention(8, 2, 32, "split")
    attn.split_shapes = SplitShapes(32, 16, 16)  # the 90-token prefix: 32 + 32 + 16, 10 absorbed
    ref = _reference(pb)
    res: dict = {}
    prepared = attn.prepare(_mixed_batch(pb, 3, True), pb.k_cache)
    plan = prepared.split_plan
    res["plan"] = [[s.row, s.prefix_len] for s in plan.seqs] if plan else None
    res["buffers"] = plan is not None and plan.buffers is not None
    res["decode_plan_rows"] = prepared.decode_plan.num_seqs if prepared.decode_plan else None
    out = attn.attend(pb.q, pb.k_cache, pb.v_cache, prepared)
    res["err"] = rel_error(out, ref)
    fallback = attn.prepare(_mixed_batch(pb, 3, False))  # lengths copied from the device
    res["same_without_host_lens"] = bool(torch.equal(
        attn.attend(pb.q, pb.k_cache, pb.v_cache, fallback), out))
    unprepared = attn.attend(pb.q, pb.k_cache, pb.v_cache, _mixed_batch(pb, 3, True))
    res["same_unprepared"] = bool(torch.equal(unprepared, out))
    into = torch.full_like(pb.q, float("nan"))  # the piecewise graphs' static output rows
    res["into_out"] = bool(attn.attend(pb.q, pb.k_cache, pb.v_cache, prepared, out=into)
                           is into) and bool(torch.equal(into, out))
    decode = make_problem([1] * 4, [30, 0, 200, 64], 8, 2, 32, 16, torch.float32, seed=12)
    store_kvcache(decode.new_k, decode.new_v, decode.k_cache, decode.v_cache,
                  decode.slot_mapping)
    decode_batch = attn.prepare(_mixed_batch(decode, 4, False), decode.k_cache)
    res["decode_only_split_plan"] = decode_batch.split_plan is not None
    auto = PagedAttention(8, 2, 32, "auto")
    auto.split_shapes, auto.split_min_query = SplitShapes(32, 16, 16), 16
    auto_batch = auto.prepare(_mixed_batch(pb, 3, True), pb.k_cache)
    auto_plan = auto_batch.split_plan
    res["auto_split_rows"] = [s.row for s in auto_plan.seqs] if auto_plan else None
    res["auto_runs"] = [[r.first_row, r.end_row] for r in auto_plan.runs] if auto_plan else None
    res["auto_err"] = rel_error(auto.attend(pb.q, pb.k_cache, pb.v_cache, auto_batch), ref)
    auto.split_min_query = 31  # no row has 31 new tokens: the step runs as triton
    short = auto.prepare(_mixed_batch(pb, 3, True), pb.k_cache)
    res["auto_short_split_plan"] = short.split_plan is not None
    res["auto_short_err"] = rel_error(auto.attend(pb.q, pb.k_cache, pb.v_cache, short), ref)
    res["decode_only_err"] = rel_error(
        attn.attend(decode.q, decode.k_cache, decode.v_cache, decode_batch), _reference(decode))
    return res


def _run_model_case() -> dict:
    """The tiny model on the split backend (segments of 16 keys) against the torch backend's
    model with the same weights, step by step over the same batches: two prompts prefilled
    (one whole, one in chunks over its growing prefix, beside the first's decodes), then
    decode-only steps; eager and through the piecewise pieces."""
    from test_model_cpu import BLOCK_SIZE, TINY, build_batch, tiny_model

    from gpu_backend.engine.piecewise import PiecewiseGraphs
    from sim.core.split_shapes import SplitShapes

    def caches():
        pool = torch.zeros(12, TINY.num_layers, 2, BLOCK_SIZE, TINY.num_kv_heads, TINY.head_dim)
        return [(pool[:, i, 0], pool[:, i, 1]) for i in range(TINY.num_layers)]

    torch.manual_seed(3)
    reference = tiny_model("torch")
    torch.manual_seed(3)
    split = tiny_model("split")
    for layer in split.layers:
        layer.attn.split_shapes = SplitShapes(16, 16, 8)
    tables = torch.stack([torch.arange(0, 4), torch.arange(5, 9)]).int()
    prompt = torch.randint(0, TINY.vocab_size, (40,)).tolist()
    second = prompt[:37]  # prefilled in chunks of 13, 12, 12: it samples after the third
    steps = [[(prompt, 0, 40), (second, 0, 13)], [(prompt + [3], 40, 1), (second, 13, 12)],
             [(prompt + [3, 4], 41, 1), (second, 25, 12)],
             [(prompt + [3, 4, 5], 42, 1), (second + [7], 37, 1)]]
    ref_caches, split_caches, piece_caches = caches(), caches(), caches()
    pieces = PiecewiseGraphs(split, piece_caches, 64, torch.device("cpu"), sizes=(16, 64))
    pieces.capture()
    err = piece_err = 0.0
    for step in steps:
        batch = build_batch(step, tables, list(range(len(step))))
        expect = reference.compute_logits(batch, ref_caches)
        err = max(err, float((split.compute_logits(batch, split_caches) - expect).abs().max()))
        size = 16 if batch.input_ids.shape[0] <= 16 else 64
        got = pieces.compute_logits(batch, size)
        piece_err = max(piece_err, float((got - expect).abs().max()))
    return {"err": err, "piecewise_err": piece_err}


def _run_profile_step_case() -> dict:
    """The memory profile's worst split step runs: one chunk over a prefix of two segments."""
    from test_model_cpu import TINY, tiny_model

    from gpu_backend.engine.memory import dummy_prefix_batch
    from sim.core.split_shapes import SplitShapes

    model = tiny_model("split")
    for layer in model.layers:
        layer.attn.split_shapes = SplitShapes(32, 16, 16)
    batch, num_blocks = dummy_prefix_batch(20, 48, 16, torch.device("cpu"))
    pool = torch.zeros(num_blocks, TINY.num_layers, 2, 16, TINY.num_kv_heads, TINY.head_dim)
    caches = [(pool[:, i, 0], pool[:, i, 1]) for i in range(TINY.num_layers)]
    plan = model.layers[0].attn.prepare(batch, caches[0][0]).split_plan
    logits = model.compute_logits(batch, caches)
    return {"prefix": plan.seqs[0].prefix_len if plan else None,
            "segments": [n for _, n in plan.seqs[0].segments] if plan else None,
            "finite": bool(torch.isfinite(logits).all()), "rows": logits.shape[0]}


def _run_profile_launch_case() -> dict:
    """The profile's attention timing (calibrate_timing.backend_launch_ms) on a mixed step: each
    backend's timed call computes the attention triton's does over the same K/V and q."""
    from gpu_backend.engine.calibrate_timing import backend_launch_ms
    from gpu_backend.engine.shapes import StepShape

    outs = {}
    for backend in ("triton", "split", "auto"):
        def keep(fn, reps: int, name: str = backend) -> float:
            outs[name] = fn()
            return 1.0

        torch.manual_seed(7)  # the same layer and q for every backend
        backend_launch_ms(StepShape("mixed", ((40, 70), (1030, 20)), (90, 300, 5)), backend,
                          8, 2, 32, reps=1, device="cpu", dtype=torch.float32, timer=keep)
    return {name: float((out - outs["triton"]).abs().max()) for name, out in outs.items()}


def _main() -> None:
    results: dict = {name: _run_split_case(name) for name in SPLIT_CASES}
    results["merge"] = _run_merge_case()
    results["merge_many"] = _run_merge_many_case()
    results["gather"] = _run_gather_case()
    results["layer"] = _run_layer_case()
    results["model"] = _run_model_case()
    results["profile_step"] = _run_profile_step_case()
    results["profile_launch"] = _run_profile_launch_case()
    print(json.dumps(results))


@pytest.fixture(scope="module")
def interp() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    proc = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_split_attention_matches_paged_reference(interp: dict, name: str) -> None:
    """Every case against the float32 paged reference (the pool's unused slots are NaN, so a
    padded key or row reaching a real row's result shows), and the SDPA ops it ran are the
    plan's padded shapes, each among those the shape rules enumerate for its lengths."""
    from sim.core.split_shapes import SplitShapes

    case = interp[name]
    tol = 1e-5 if SPLIT_CASES[name][6] == "float32" else 3e-3
    assert case["err"] < tol, f"{name}: rel error {case['err']}"
    assert case["sdpa"] == case["planned"]
    query_lens, prefix_lens = SPLIT_CASES[name][:2]
    sizes = SPLIT_CASES[name][8]
    shapes = SplitShapes(*sizes) if sizes is not None else SplitShapes()
    allowed = {(s.rows, s.keys, s.causal) for s in shapes.sdpa_shapes(
        max(query_lens), max(q + p for q, p in zip(query_lens, prefix_lens, strict=True)))}
    assert {tuple(s) for s in case["sdpa"]} <= allowed


def test_auto_runs_short_rows_through_the_paged_kernel(interp: dict) -> None:
    assert interp["auto_mixed_runs"]["runs"] == [[2, 3], [4, 6]]
    assert interp["auto_mixed_runs"]["split_rows"] == [3, 6]
    assert interp["auto_runs_per_call"]["runs"] == [[2, 3]]
    assert interp["auto_runs_per_call"]["split_rows"] == [1, 3]


def test_triton_merge_matches_torch_merge(interp: dict) -> None:
    merge = interp["merge"]
    assert merge["out"] < 2e-3  # written in fp16
    assert merge["in_place"] < 1e-5 and merge["lse"] < 1e-5
    assert merge["lse_empty"] and merge["empty_rows_zero"]


def test_merge_of_many_parts_is_the_pairwise_merge(interp: dict) -> None:
    """One launch of any number of parts; fp16 and strided parts read through their
    strides; an empty part weighs nothing, all empty gives zeros."""
    merge = interp["merge_many"]
    for count in ("1", "5", "11"):
        assert merge[count]["out"] < 1e-5 and merge[count]["lse"] < 1e-5, count
        assert merge[count]["lse_empty"] and merge[count]["empty_row_zero"], count
    assert merge["in_place"] < 1e-5


def test_gather_copies_table_order_blocks_and_zeroes_past_the_valid_tokens(interp: dict) -> None:
    gather = interp["gather"]
    assert gather["valid_equal"] and gather["tail_zero"] and gather["rest_untouched"]
    assert "6-block row" in gather["errors"]["past_row"]
    assert "5-block buffer" in gather["errors"]["past_buffer"]


def test_split_backend_dispatch(interp: dict) -> None:
    """Decode rows first (three, through the paged kernel with their own plan), then each
    prefill row through SPLIT: with host lengths, copied from the device, or planned inside
    attend; into a given output; a decode-only step stays on the paged kernel. On auto the
    short prefill row runs the paged kernel, and a step of short rows only runs it alone."""
    layer = interp["layer"]
    assert layer["plan"] == [[3, 90], [4, 0]] and layer["buffers"]
    assert layer["auto_split_rows"] == [3] and layer["auto_runs"] == [[4, 5]]
    assert layer["auto_err"] < 1e-5 and not layer["auto_short_split_plan"]
    assert layer["auto_short_err"] < 1e-5
    assert layer["decode_plan_rows"] == 3
    assert layer["err"] < 1e-5
    assert layer["same_without_host_lens"] and layer["same_unprepared"] and layer["into_out"]
    assert not layer["decode_only_split_plan"] and layer["decode_only_err"] < 1e-5


def test_split_model_matches_torch_model_eager_and_piecewise(interp: dict) -> None:
    assert interp["model"]["err"] < 1e-4
    assert interp["model"]["piecewise_err"] < 1e-4


def test_profile_times_each_backends_attention(interp: dict) -> None:
    assert interp["profile_launch"]["split"] < 1e-4
    assert interp["profile_launch"]["auto"] < 1e-4


def test_profiled_worst_split_step_runs_its_prefix_segments(interp: dict) -> None:
    assert interp["profile_step"] == {"prefix": 48, "segments": [32, 16], "finite": True,
                                      "rows": 1}


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest or set TRITON_INTERPRET=1"
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    _main()
