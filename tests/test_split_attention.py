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

ROOT = Path(__file__).resolve().parents[1]

# name -> (query_lens, prefix_lens, H, KVH, D, block_size, dtype, num_decodes, segment_tokens,
#          segment buffers made by the plan (else per call))
SPLIT_CASES: dict[str, tuple] = {
    "prefill_square_only": ([40, 23], [0, 0], 8, 2, 32, 16, "float32", 0, 32, True),
    # prefix 100 = segments of 32, 32, 32, 4; the second chunk starts mid-block (13)
    "prefix_many_segments_gqa4": ([30, 17], [100, 13], 8, 2, 32, 16, "float32", 0, 32, True),
    "prefix_one_full_segment": ([9, 20], [64, 65], 4, 4, 16, 32, "float32", 0, 64, True),
    "mixed_decodes_mqa7": ([1, 1, 1, 25, 9], [50, 0, 130, 70, 33], 7, 1, 64, 32, "float32",
                           3, 64, True),
    "mixed_fp16_gqa4": ([1, 1, 40, 33], [300, 5, 64, 200], 8, 2, 64, 16, "float16", 2, 64,
                        True),
    "buffers_per_call": ([1, 12, 30], [40, 77, 3], 6, 3, 32, 16, "float32", 1, 16, False),
    # the engine's own segment size: a prefix of one full segment and 100 keys more
    "engine_segment": ([1, 20], [40, 8292], 4, 2, 16, 16, "float32", 1, None, True),
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


def _cache_with_positions(num_blocks=9, block_size=16, kv_heads=2, head_dim=4):
    """A strided K cache view whose slot (block b, offset o) holds the value 1000 b + o,
    and a shuffled table row."""
    pool = torch.zeros(num_blocks, 2, 2, block_size, kv_heads, head_dim)
    ids = torch.arange(num_blocks)[:, None] * 1000 + torch.arange(block_size)[None, :]
    pool[:, 1, 0] = ids[:, :, None, None].float()
    return pool[:, 1, 0], torch.tensor([5, 2, 8, 0, 3], dtype=torch.int32)


def test_gather_tokens_copies_positions_in_table_order():
    from gpu_backend.kernels.split_attention import gather_tokens

    cache, row = _cache_with_positions()
    got = gather_tokens(cache, row, 13, 40)  # positions 13..52: blocks 0..3 of the row
    expect = [1000 * int(row[p // 16]) + p % 16 for p in range(13, 53)]
    assert got.shape == (40, 2, 4) and got.is_contiguous()
    assert got[:, 1, 3].tolist() == expect
    buffer = torch.full((4, 16, 2, 4), -1.0)
    into = gather_tokens(cache, row, 32, 20, buffer)
    assert into.data_ptr() == buffer.data_ptr() and into[:, 0, 0].tolist() == expect[19:39]
    with pytest.raises(ValueError, match="buffer"):
        gather_tokens(cache, row, 0, 70, buffer)  # 5 blocks into 4


def test_plan_split_lists_prefill_rows_with_their_prefixes():
    from gpu_backend.kernels.split_attention import PrefillSeq, plan_split

    qsl = np.array([0, 1, 2, 42, 42, 59])  # rows: 2 decodes, a 40-token chunk, empty, 17
    seq_lens = np.array([100, 8, 40, 5, 117], dtype=np.int32)
    cache = torch.zeros(4, 16, 2, 8)
    plan = plan_split(qsl, seq_lens, 2, 32, cache)
    assert plan.seqs == (PrefillSeq(2, 2, 40, 0), PrefillSeq(4, 42, 17, 100))
    assert (plan.num_decodes, plan.decode_max_seq_len) == (2, 100)
    assert plan.buffers is not None and plan.buffers.k.shape == (2, 16, 2, 8)
    assert plan.buffers.nbytes == 2 * 32 * 2 * 8 * 4
    square_only = plan_split(np.array([0, 40]), np.array([40]), 0, 32, cache)
    assert square_only.buffers is None and not square_only.needs_buffers


def test_plan_split_refuses_what_it_cannot_run():
    from gpu_backend.kernels.split_attention import SegmentBuffers, plan_split

    with pytest.raises(ValueError, match="decode rows"):
        plan_split(np.array([0, 1, 5]), np.array([9, 5]), 2)  # row 1 has 4 new tokens
    with pytest.raises(ValueError, match="one more entry"):
        plan_split(np.array([0, 1]), np.array([9, 5]), 0)
    with pytest.raises(ValueError, match="multiple of the cache's block size"):
        SegmentBuffers.like(torch.zeros(4, 16, 2, 8), 40)


def test_split_profile_shapes():
    """The chunk takes all the step's tokens over a prefix a block past one segment; where
    the context is too short for both, the longest chunk and a chunk that fits the prefix."""
    from gpu_backend.engine.memory import split_profile_shapes

    assert split_profile_shapes(2048, 131072, 16, 8192) == [(2048, 8208)]
    assert split_profile_shapes(2048, 4096, 16, 8192) == [(2048, 2048)]
    assert split_profile_shapes(8192, 10000, 16, 8192) == [(8192, 1808), (1792, 8208)]
    assert split_profile_shapes(8192, 8000, 16, 8192) == [(7984, 16)]


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


def test_set_attention_backend_switches_triton_and_split_only():
    from test_model_cpu import tiny_model

    from gpu_backend.model import set_attention_backend

    model = tiny_model("triton")
    set_attention_backend(model, "split")
    assert {layer.attn.backend for layer in model.layers} == {"split"}
    assert all(layer.fused for layer in model.layers)  # the same fused layers either way
    with pytest.raises(ValueError, match="switch among"):
        set_attention_backend(model, "torch")
    with pytest.raises(ValueError, match="switch among"):
        set_attention_backend(tiny_model("torch"), "split")


def test_replay_cli_chooses_the_attention_backend():
    from gpu_backend.__main__ import build_parser
    from sim.core.config_flags import UsageError

    parser = build_parser()
    base = ["replay", "--trace", "azure-conv"]
    assert parser.parse_args(base).attention_backend == "triton"
    assert parser.parse_args([*base, "--attention-backend", "split"]).attention_backend == "split"
    with pytest.raises(UsageError, match="invalid choice: 'torch'"):
        parser.parse_args([*base, "--attention-backend", "torch"])


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


def _run_split_case(name: str) -> float:
    from gpu_backend.kernels import store_kvcache
    from gpu_backend.kernels.split_attention import SEGMENT_TOKENS, plan_split, split_attention
    from tests.kernel_cases import rel_error

    *_, num_decodes, segment, with_buffers = SPLIT_CASES[name]
    pb = _problem(name)
    store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    plan = plan_split(pb.query_start_loc.numpy(), pb.seq_lens.numpy(), num_decodes,
                      segment or SEGMENT_TOKENS, pb.k_cache if with_buffers else None)
    assert (plan.buffers is not None) == (with_buffers and plan.needs_buffers)
    out = split_attention(pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens,
                          pb.query_start_loc, pb.scale, plan)
    assert out.dtype == pb.q.dtype and out.shape == pb.q.shape
    return rel_error(out, _reference(pb))


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
    from tests.kernel_cases import make_problem, rel_error

    pb = make_problem([1, 1, 1, 30, 12], [40, 77, 0, 90, 0], 8, 2, 32, 16, torch.float32,
                      seed=11)
    store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    attn = PagedAttention(8, 2, 32, "split")
    attn.segment_tokens = 32  # the 90-token prefix in three segments
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

    def caches():
        pool = torch.zeros(12, TINY.num_layers, 2, BLOCK_SIZE, TINY.num_kv_heads, TINY.head_dim)
        return [(pool[:, i, 0], pool[:, i, 1]) for i in range(TINY.num_layers)]

    torch.manual_seed(3)
    reference = tiny_model("torch")
    torch.manual_seed(3)
    split = tiny_model("split")
    for layer in split.layers:
        layer.attn.segment_tokens = 16
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

    model = tiny_model("split")
    for layer in model.layers:
        layer.attn.segment_tokens = 32
    batch, num_blocks = dummy_prefix_batch(20, 48, 16, torch.device("cpu"))
    pool = torch.zeros(num_blocks, TINY.num_layers, 2, 16, TINY.num_kv_heads, TINY.head_dim)
    caches = [(pool[:, i, 0], pool[:, i, 1]) for i in range(TINY.num_layers)]
    plan = model.layers[0].attn.prepare(batch, caches[0][0]).split_plan
    logits = model.compute_logits(batch, caches)
    return {"prefix": plan.seqs[0].prefix_len if plan else None,
            "segments": -(-plan.seqs[0].prefix_len // 32) if plan else None,
            "finite": bool(torch.isfinite(logits).all()), "rows": logits.shape[0]}


def _main() -> None:
    results: dict = {name: _run_split_case(name) for name in SPLIT_CASES}
    results["merge"] = _run_merge_case()
    results["layer"] = _run_layer_case()
    results["model"] = _run_model_case()
    results["profile_step"] = _run_profile_step_case()
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
    tol = 1e-5 if SPLIT_CASES[name][6] == "float32" else 3e-3
    assert interp[name] < tol, f"{name}: rel error {interp[name]}"


def test_triton_merge_matches_torch_merge(interp: dict) -> None:
    merge = interp["merge"]
    assert merge["out"] < 2e-3  # written in fp16
    assert merge["in_place"] < 1e-5 and merge["lse"] < 1e-5
    assert merge["lse_empty"] and merge["empty_rows_zero"]


def test_split_backend_dispatch(interp: dict) -> None:
    """Decode rows first (three, through the paged kernel with their own plan), then each
    prefill row through SPLIT: with host lengths, copied from the device, or planned inside
    attend; into a given output; a decode-only step stays on the paged kernel."""
    layer = interp["layer"]
    assert layer["plan"] == [[3, 90], [4, 0]] and layer["buffers"]
    assert layer["decode_plan_rows"] == 3
    assert layer["err"] < 1e-5
    assert layer["same_without_host_lens"] and layer["same_unprepared"] and layer["into_out"]
    assert not layer["decode_only_split_plan"] and layer["decode_only_err"] < 1e-5


def test_split_model_matches_torch_model_eager_and_piecewise(interp: dict) -> None:
    assert interp["model"]["err"] < 1e-4
    assert interp["model"]["piecewise_err"] < 1e-4


def test_profiled_worst_split_step_runs_its_prefix_segments(interp: dict) -> None:
    assert interp["profile_step"] == {"prefix": 48, "segments": 2, "finite": True, "rows": 1}


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest or set TRITON_INTERPRET=1"
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    _main()
