"""Paged-attention and KV-store kernels on a real GPU in bf16 (skipped without CUDA)."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_backend.kernels import paged_attention, store_kvcache, store_kvcache_ref  # noqa: E402
from tests.kernel_cases import dense_reference, make_problem, rel_error  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BF16_TOL = 2e-2

# (query_lens, prefix_lens)
BATCHES = {
    "decode": ([1] * 37, [0, 1, 15, 16, 17, 100, 511, 1000, 2047, 3000] + [257] * 27),
    "decode_few_long": ([1] * 3, [4000, 9000, 123]),
    # one long sequence among many short ones: the split plan gives it many shares
    "decode_skewed": ([1] * 41, [20000] + [5, 300, 1000] * 13 + [64]),
    "prefill_one_chunk": ([1000, 77], [0, 0]),
    "prefill_chunked": ([512, 300, 129], [1024, 777, 3000]),
    "mixed": ([1, 700, 1, 1, 64, 1], [500, 0, 33, 4096, 2000, 9]),
}
SHAPES = {  # (H, KVH, D)
    "mha_d64": (8, 8, 64),
    "gqa4_d128": (32, 8, 128),
    "gqa7_d128": (28, 4, 128),
    "gqa8_d64": (16, 2, 64),
}


@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("batch", list(BATCHES))
def test_paged_attention_bf16(batch: str, shape: str, block_size: int) -> None:
    heads, kv_heads, head_dim = SHAPES[shape]
    query_lens, prefix_lens = BATCHES[batch]
    pb = make_problem(query_lens, prefix_lens, heads, kv_heads, head_dim, block_size,
                      torch.bfloat16, device="cuda", seed=zlib.crc32(f"{batch}{shape}".encode()))
    store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    out = paged_attention(pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens,
                          pb.query_start_loc, pb.scale, max_query_len=pb.max_query_len,
                          max_seq_len=pb.max_seq_len)
    err = rel_error(out, dense_reference(pb))
    assert err < BF16_TOL, f"rel error {err}"


@pytest.mark.parametrize("decode_stream", [False, True])
@pytest.mark.parametrize("shape", ["gqa4_d128", "gqa8_d64"])
def test_mixed_step_runs_decode_rows_apart(shape: str, decode_stream: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixed step with its decode rows first, holding more keys than the layer's
    mixed_split_min_keys: PagedAttention runs them with the decode tiles and plan and the
    prefill rows apart (two launches; with DECODE_STREAM the decode rows on a second
    stream); same output as the reference."""
    from gpu_backend import layers
    from gpu_backend.batch import ForwardBatch, HostLens
    from gpu_backend.layers import PagedAttention

    monkeypatch.setattr(layers, "DECODE_STREAM", decode_stream)

    heads, kv_heads, head_dim = SHAPES[shape]
    pb = make_problem([1] * 33 + [700, 64], [2048] * 32 + [15000, 0, 2000], heads, kv_heads,
                      head_dim, 16, torch.bfloat16, device="cuda", seed=7)
    store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    empty = torch.zeros(0, dtype=torch.int64, device="cuda")
    batch = ForwardBatch(input_ids=empty, positions=empty, slot_mapping=empty,
                         block_tables=pb.block_tables, seq_lens=pb.seq_lens,
                         query_start_loc=pb.query_start_loc, logits_indices=empty,
                         max_query_len=pb.max_query_len, max_seq_len=pb.max_seq_len,
                         num_decodes=33, host_lens=HostLens(pb.query_start_loc.cpu().numpy(),
                                                            pb.seq_lens.cpu().numpy()))
    attn = PagedAttention(heads, kv_heads, head_dim)
    attn.mixed_split_min_keys = 32 * 2048
    prepared = attn.prepare(batch)
    assert prepared.decode_plan is not None and prepared.decode_plan.num_seqs == 33
    err = rel_error(attn.attend(pb.q, pb.k_cache, pb.v_cache, prepared), dense_reference(pb))
    assert err < BF16_TOL, f"rel error {err}"


@pytest.mark.parametrize("num_splits", [1, 4, 13])
@pytest.mark.parametrize("query_len", [1, 300])
def test_splits_agree(num_splits: int, query_len: int) -> None:
    pb = make_problem([query_len] * 4, [5000, 40, 700, 2222], 32, 8, 128, 16, torch.bfloat16,
                      device="cuda", seed=num_splits)
    store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    out = paged_attention(pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens,
                          pb.query_start_loc, pb.scale, max_query_len=query_len,
                          num_splits=num_splits)
    assert rel_error(out, dense_reference(pb)) < BF16_TOL


@pytest.mark.parametrize("order", [{"longest_first": True}, {"heads_inner": True},
                                   {"longest_first": True, "heads_inner": True}])
@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("batch", ["prefill_chunked", "mixed"])
def test_launch_orders_and_timeline_bf16(batch: str, num_splits: int | None,
                                         order: dict) -> None:
    """Every launch order of the prefill tile gives the reference's output, with the
    timeline written: one (SM, start, end) per program that worked, on the GPU's SMs."""
    import dataclasses

    from gpu_backend.kernels.attention import prefill_config

    query_lens, prefix_lens = BATCHES[batch]
    pb = make_problem(query_lens, prefix_lens, 32, 8, 128, 16, torch.bfloat16, device="cuda",
                      seed=zlib.crc32(f"{batch}{order}".encode()))
    store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    tile = dataclasses.replace(prefill_config(128), **order)
    timeline = torch.zeros(3 * 8 * 64 * (sum(query_lens) + 64), dtype=torch.int64,
                           device="cuda")
    out = paged_attention(pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens,
                          pb.query_start_loc, pb.scale, max_query_len=pb.max_query_len,
                          max_seq_len=pb.max_seq_len, num_splits=num_splits, tile_config=tile,
                          timeline=timeline)
    assert rel_error(out, dense_reference(pb)) < BF16_TOL
    rows = timeline.view(-1, 3).cpu()
    ran = rows[rows[:, 1] > 0]
    assert len(ran) > 0 and bool((ran[:, 2] >= ran[:, 1]).all())
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert bool((ran[:, 0] >= 0).all()) and bool((ran[:, 0] < num_sms).all())
    with pytest.raises(ValueError, match="timeline holds"):
        paged_attention(pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens,
                        pb.query_start_loc, pb.scale, max_query_len=pb.max_query_len,
                        tile_config=tile, timeline=timeline[:6])


def _captured_decode(pb, max_seq_len: int):
    """(graph, its output, the attention args) of one decode step captured over `pb`."""
    store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    args = (pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens, pb.query_start_loc,
            pb.scale)
    paged_attention(*args, max_query_len=1, max_seq_len=max_seq_len)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention(*args, max_query_len=1, max_seq_len=max_seq_len)
    return graph, out, args


def test_decode_graph_capture() -> None:
    """A captured decode step replays correctly after the inputs change in place."""
    pb = make_problem([1] * 8, [100] * 8, 32, 8, 128, 16, torch.bfloat16, device="cuda")
    graph, out, args = _captured_decode(pb, 4096)
    pb.seq_lens.sub_(torch.arange(8, device="cuda", dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    expect = paged_attention(*args, max_query_len=1, max_seq_len=4096)
    assert torch.equal(out, expect)


def test_decode_graph_replans_after_capture() -> None:
    """The split plan is made inside the graph: lengths that change after capture (the long
    sequence shrinking to a short one) change the shares, and the output stays exact."""
    lens = [5000, 40, 700, 2222, 3, 90, 16, 1]
    pb = make_problem([1] * 8, lens, 32, 8, 128, 16, torch.bfloat16, device="cuda", seed=7)
    graph, out, args = _captured_decode(pb, 8192)
    graph.replay()
    assert rel_error(out, dense_reference(pb)) < BF16_TOL
    # Attend over shorter prefixes of the same cache: sequence 0 shrinks to 200 keys,
    # sequence 2 keeps 700; the reference is the dense attention over those prefixes.
    new_lens = torch.tensor([200, 41, 701, 2223, 4, 91, 17, 2], dtype=torch.int32)
    pb.seq_lens.copy_(new_lens)
    graph.replay()
    torch.cuda.synchronize()
    expect = paged_attention(*args, max_query_len=1, max_seq_len=8192, num_splits=1)
    assert rel_error(out, expect.float().cpu()) < BF16_TOL


def test_store_kvcache_bf16_strided() -> None:
    tokens, kv_heads, head_dim, block_size = 300, 8, 128, 16
    qkv = torch.randn(tokens, 6, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = qkv[:, 4], qkv[:, 5]  # non-contiguous views
    pool = torch.zeros(40, 3, 2, block_size, kv_heads, head_dim, device="cuda",
                       dtype=torch.bfloat16)
    expect = pool.clone()
    slots = torch.randperm(40 * block_size, device="cuda")[:tokens]
    slots[7] = -1
    store_kvcache(k, v, pool[:, 2, 0], pool[:, 2, 1], slots)
    store_kvcache_ref(k, v, expect[:, 2, 0], expect[:, 2, 1], slots)
    assert torch.equal(pool, expect)


def test_model_decode_graph_matches_eager() -> None:
    """A tiny bf16 model: prefill, then a decode step replayed from a CUDA graph."""
    from types import SimpleNamespace

    from gpu_backend.batch import ForwardBatch
    from gpu_backend.model import build_model

    spec = SimpleNamespace(num_layers=2, hidden_size=256, intermediate_size=512,
                           num_attention_heads=8, num_kv_heads=2, head_dim=32, vocab_size=1000,
                           tie_word_embeddings=True)
    model = build_model(spec, "cuda", torch.bfloat16, qkv_bias=True, rope_theta=1e6, seed=0,
                        max_position=4096)
    pool = torch.zeros(16, 2, 2, 16, 2, 32, device="cuda", dtype=torch.bfloat16)
    kv_caches = [(pool[:, i, 0], pool[:, i, 1]) for i in range(2)]
    cuda = dict(device="cuda")

    def batch(ids: list[int], start: int) -> ForwardBatch:
        pos = torch.arange(start, start + len(ids), **cuda)
        return ForwardBatch(
            input_ids=torch.tensor(ids, **cuda), positions=pos, slot_mapping=pos + 16 * 3,
            block_tables=torch.tensor([[3, 4, 5, 6]], dtype=torch.int32, **cuda),
            seq_lens=torch.tensor([start + len(ids)], dtype=torch.int32, **cuda),
            query_start_loc=torch.tensor([0, len(ids)], dtype=torch.int32, **cuda),
            logits_indices=torch.tensor([len(ids) - 1], **cuda),
            max_query_len=len(ids), max_seq_len=64)

    first = model(batch(list(range(1, 41)), 0), kv_caches)
    decode = batch([int(first[0])], 40)
    eager = model.compute_logits(decode, kv_caches)
    model(decode, kv_caches)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = model.compute_logits(decode, kv_caches)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(eager).all()
    assert torch.equal(captured, eager)


# Fused layer kernels in bf16 at the shapes of the models the engine runs.
@pytest.mark.parametrize("hidden", [896, 4096, 5120])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm_bf16(hidden: int, with_residual: bool) -> None:
    from tests.fused_cases import norm_case

    assert norm_case(hidden, 300, with_residual, torch.bfloat16, "cuda") < BF16_TOL


@pytest.mark.parametrize("inter", [4864, 14336])
def test_silu_and_mul_bf16(inter: int) -> None:
    from tests.fused_cases import silu_case

    assert silu_case(inter, 70, torch.bfloat16, "cuda") < BF16_TOL


@pytest.mark.parametrize("shape", list(SHAPES) + ["qwen_0.5b"])
@pytest.mark.parametrize("block_size", [16, 64])
def test_rotary_store_kv_bf16(shape: str, block_size: int) -> None:
    from tests.fused_cases import rotary_store_case

    heads, kv_heads, head_dim = SHAPES.get(shape, (14, 2, 64))
    assert rotary_store_case(heads, kv_heads, head_dim, 513, block_size, torch.bfloat16,
                             "cuda") < BF16_TOL


def test_fused_model_matches_unfused_bf16() -> None:
    """The same weights with the fused kernels and with the torch layers: same logits to bf16
    rounding over a prefill and a decode step."""
    from types import SimpleNamespace

    from gpu_backend.batch import ForwardBatch
    from gpu_backend.model import build_model, set_fused

    spec = SimpleNamespace(num_layers=4, hidden_size=512, intermediate_size=1024,
                           num_attention_heads=8, num_kv_heads=2, head_dim=64, vocab_size=1000,
                           tie_word_embeddings=False)
    model = build_model(spec, "cuda", torch.bfloat16, qkv_bias=True, rope_theta=1e6, seed=0,
                        max_position=4096)
    cuda = dict(device="cuda")
    logits = []
    for fused in (True, False):
        set_fused(model, fused)
        pool = torch.zeros(16, 4, 2, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
        kv_caches = [(pool[:, i, 0], pool[:, i, 1]) for i in range(4)]
        step_logits = []
        for ids, start in ((list(range(1, 100)), 0), ([7], 99)):
            pos = torch.arange(start, start + len(ids), **cuda)
            batch = ForwardBatch(
                input_ids=torch.tensor(ids, **cuda), positions=pos, slot_mapping=pos + 16 * 2,
                block_tables=torch.tensor([[2, 3, 4, 5, 6, 7, 8]], dtype=torch.int32, **cuda),
                seq_lens=torch.tensor([start + len(ids)], dtype=torch.int32, **cuda),
                query_start_loc=torch.tensor([0, len(ids)], dtype=torch.int32, **cuda),
                logits_indices=torch.tensor([len(ids) - 1], **cuda),
                max_query_len=len(ids), max_seq_len=128)
            step_logits.append(model.compute_logits(batch, kv_caches).float())
        logits.append(torch.cat(step_logits))
    fused_logits, torch_logits = logits
    assert torch.isfinite(fused_logits).all()
    err = float((fused_logits - torch_logits).abs().max() / torch_logits.abs().max())
    assert err < 5e-2, err


# SPLIT attention (gpu_backend/kernels/split_attention.py): cuDNN's SDPA with its LSE.
# (query_lens, prefix_lens): leading rows of one token are decode rows
SPLIT_BATCHES = {
    "prefill_square": ([1000, 77], [0, 0]),
    # prefixes of two segments (8,192 + 808 keys), exactly one, and three (the last 5 keys)
    "prefix_segments": ([700, 129, 1000], [9000, 8192, 16389]),
    "mixed": ([1] * 33 + [700, 64], [2048] * 32 + [15000, 0, 2000]),
    "odd_lengths": ([1, 1, 3, 517, 2], [31, 4096, 0, 1111, 8191]),
    # auto: 300 and 40 new tokens run the Triton kernel; 1,500 (8,192 + 808 absorbed),
    # 2,000 (8,192 + 2,048 + 60 absorbed) and 1,024 (1,023 absorbed) run SPLIT
    "auto_mix": ([1, 1, 300, 1500, 40, 2000, 1024], [100, 5000, 0, 9000, 3000, 10300, 1023]),
}


def _split_problem(batch: str, shape: str, block_size: int = 16):
    import numpy as np

    from gpu_backend.engine.inputs import leading_decodes

    heads, kv_heads, head_dim = SHAPES[shape]
    query_lens, prefix_lens = SPLIT_BATCHES[batch]
    pb = make_problem(query_lens, prefix_lens, heads, kv_heads, head_dim, block_size,
                      torch.bfloat16, device="cuda", seed=zlib.crc32(f"{batch}{shape}".encode()))
    store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
    return pb, leading_decodes(np.array(query_lens))


def _paged_reference_f32(pb) -> torch.Tensor:
    from gpu_backend.kernels import paged_attention_ref

    return paged_attention_ref(pb.q.float(), pb.k_cache.float(), pb.v_cache.float(),
                               pb.block_tables, pb.seq_lens, pb.query_start_loc, pb.scale).cpu()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", ["gqa4_d128", "gqa8_d64"])
def test_cudnn_sdpa_lse_is_natural_log(shape: str, causal: bool) -> None:
    """The cuDNN op's LSE: [S, H] float32 in natural log (a base-2 LSE would be 1.44x off)."""
    from gpu_backend.kernels.split_attention import sdpa_with_lse

    heads, kv_heads, head_dim = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(3)
    rows, keys = 333, 333 if causal else 1500

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16)

    q, k, v = randn(rows, heads, head_dim), randn(keys, kv_heads, head_dim), randn(
        keys, kv_heads, head_dim)
    out, lse = sdpa_with_lse(q, k, v, causal, head_dim ** -0.5)
    group = heads // kv_heads
    scores = torch.einsum("shd,lhd->hsl", q.float(), k.float().repeat_interleave(group, 1))
    scores = scores * head_dim ** -0.5
    if causal:
        seen = torch.ones(rows, keys, dtype=torch.bool, device="cuda").tril()
        scores = scores.masked_fill(~seen, float("-inf"))
    ref_lse = torch.logsumexp(scores, -1).transpose(0, 1)
    ref_out = torch.einsum("hsl,lhd->shd", scores.softmax(-1),
                           v.float().repeat_interleave(group, 1))
    assert lse.shape == (rows, heads) and lse.dtype == torch.float32
    assert (lse - ref_lse).abs().max() < 2e-2
    assert rel_error(out, ref_out.cpu()) < BF16_TOL


@pytest.mark.parametrize("min_query_len", [1, 1024])  # split, auto
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("batch", list(SPLIT_BATCHES))
def test_split_attention_cudnn_bf16(batch: str, shape: str, min_query_len: int) -> None:
    """Every batch through SPLIT's padded cuDNN calls (the pool's unused slots are NaN) and,
    on auto, its rows under 1,024 new tokens through the Triton kernel: the float32 paged
    reference to bf16 rounding."""
    from gpu_backend.kernels.split_attention import prepare_plan, split_attention
    from gpu_backend.kernels.split_plan import plan_split

    pb, num_decodes = _split_problem(batch, shape)
    plan = plan_split(pb.query_start_loc.cpu().numpy(), pb.seq_lens.cpu().numpy(), num_decodes,
                      min_query_len=min_query_len)
    plan = prepare_plan(plan, pb.k_cache, pb.q.shape[1])
    out = split_attention(pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens,
                          pb.query_start_loc, pb.scale, plan)
    err = rel_error(out, _paged_reference_f32(pb))
    assert err < BF16_TOL, f"rel error {err}"


def test_split_plans_are_built_up_front() -> None:
    """After warm_plans of a configuration's shapes, steps of chunk and prefix lengths never
    run before build no cuDNN plan: each takes well under one plan's build (50-190 ms)."""
    import time

    import numpy as np

    from gpu_backend.kernels.split_attention import prepare_plan, split_attention, warm_plans
    from gpu_backend.kernels.split_plan import plan_split
    from sim.core.split_shapes import SplitShapes

    heads, kv_heads, head_dim = SHAPES["gqa4_d128"]
    shapes = SplitShapes()
    warm_plans(shapes.sdpa_shapes(4096, 16384), heads, kv_heads, head_dim, torch.bfloat16,
               torch.device("cuda"))
    times = {}
    # the first case compiles the Triton merge kernels (the later shapes' strides are all
    # multiples of 16, so they meet no new variant); the others are timed
    for chunk, prefix in ((1024, 9221), (1031, 0), (2999, 5001), (4096, 12001), (1500, 777),
                          (3333, 9999)):
        pb = make_problem([chunk], [prefix], heads, kv_heads, head_dim, 16, torch.bfloat16,
                          device="cuda", seed=chunk)
        store_kvcache(pb.new_k, pb.new_v, pb.k_cache, pb.v_cache, pb.slot_mapping)
        plan = prepare_plan(plan_split(np.array([0, chunk]), np.array([chunk + prefix]), 0,
                                       shapes), pb.k_cache, heads)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = split_attention(pb.q, pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens,
                              pb.query_start_loc, pb.scale, plan)
        torch.cuda.synchronize()
        times[(chunk, prefix)] = time.perf_counter() - start
        assert rel_error(out, _paged_reference_f32(pb)) < BF16_TOL
    del times[(1024, 9221)]
    assert max(times.values()) < 0.03, times


@pytest.mark.parametrize("block_size", [32, 64])
def test_split_backend_layer_bf16(block_size: int) -> None:
    """PagedAttention on the split backend over a mixed step: decode rows with their plan,
    the prefill rows through cuDNN, host lengths from the batch."""
    from gpu_backend.batch import ForwardBatch, HostLens
    from gpu_backend.layers import PagedAttention

    pb, num_decodes = _split_problem("mixed", "gqa4_d128", block_size)
    empty = torch.zeros(0, dtype=torch.int64, device="cuda")
    batch = ForwardBatch(input_ids=empty, positions=empty, slot_mapping=empty,
                         block_tables=pb.block_tables, seq_lens=pb.seq_lens,
                         query_start_loc=pb.query_start_loc, logits_indices=empty,
                         max_query_len=pb.max_query_len, max_seq_len=pb.max_seq_len,
                         num_decodes=num_decodes,
                         host_lens=HostLens(pb.query_start_loc.cpu().numpy(),
                                            pb.seq_lens.cpu().numpy()))
    attn = PagedAttention(*SHAPES["gqa4_d128"], backend="split")
    prepared = attn.prepare(batch, pb.k_cache)
    assert prepared.split_plan is not None and prepared.split_plan.buffers is not None
    assert prepared.decode_plan is not None and prepared.decode_plan.num_seqs == num_decodes
    err = rel_error(attn.attend(pb.q, pb.k_cache, pb.v_cache, prepared), _paged_reference_f32(pb))
    assert err < BF16_TOL, f"rel error {err}"


def test_split_model_matches_triton_model_bf16() -> None:
    """One set of weights, attention on triton then on split: the same logits to bf16
    rounding over a prompt of 12,000 tokens in chunks of 3,000 (the last over a prefix past
    one segment) beside a decode row, then a decode-only step."""
    from types import SimpleNamespace

    from gpu_backend.batch import ForwardBatch
    from gpu_backend.model import build_model, set_attention_backend

    spec = SimpleNamespace(num_layers=2, hidden_size=512, intermediate_size=1024,
                           num_attention_heads=8, num_kv_heads=2, head_dim=64, vocab_size=1000,
                           tie_word_embeddings=False)
    model = build_model(spec, "cuda", torch.bfloat16, qkv_bias=True, rope_theta=1e6, seed=0,
                        max_position=16384)
    cuda = dict(device="cuda")
    prompt, other = 12000, 300  # the other sequence decodes beside the prompt's chunks
    width = -(-(prompt + 16) // 16)
    tables = torch.stack([torch.arange(1, 1 + width), torch.arange(1 + width, 1 + 2 * width)])
    tables = tables.int().to(**cuda)

    def step(rows: list[tuple[int, int]]) -> ForwardBatch:  # (computed, new) per table row
        pos = torch.cat([torch.arange(c, c + n, **cuda) for c, n in rows])
        row = torch.cat([torch.full((n,), i, **cuda) for i, (_, n) in enumerate(rows)])
        lens = [c + n for c, n in rows]
        qsl = [0]
        for _, n in rows:
            qsl.append(qsl[-1] + n)
        return ForwardBatch(
            input_ids=pos % 997, positions=pos,
            slot_mapping=tables[row, pos // 16].long() * 16 + pos % 16,
            block_tables=tables[:len(rows)], seq_lens=torch.tensor(lens, **cuda).int(),
            query_start_loc=torch.tensor(qsl, **cuda).int(),
            logits_indices=torch.tensor(qsl[1:], **cuda) - 1,
            max_query_len=max(n for _, n in rows), max_seq_len=max(lens),
            num_decodes=1 if len(rows) > 1 else 0)  # the other sequence's row leads

    steps = ([[(0, other)]] + [[(other + i, 1), (3000 * i, 3000)] for i in range(4)]
             + [[(other + 4, 1), (prompt, 1)]])
    logits = []
    for backend in ("triton", "split"):
        set_attention_backend(model, backend)
        pool = torch.zeros(2 + 2 * width, 2, 2, 16, 2, 64, **cuda, dtype=torch.bfloat16)
        caches = [(pool[:, i, 0], pool[:, i, 1]) for i in range(2)]
        logits.append(torch.cat([model.compute_logits(step(rows), caches).float()
                                 for rows in steps]))
    triton_logits, split_logits = logits
    assert torch.isfinite(split_logits).all()
    err = float((split_logits - triton_logits).abs().max() / triton_logits.abs().max())
    assert err < 5e-2, err


def test_split_memory_profile_covers_longer_prefixes_and_mixed_steps() -> None:
    """The memory profile's split step of T tokens (one chunk over a prefix of two segments
    and 1,008 keys the square absorbs) bounds a chunk of T tokens over a prefix of three
    segments: the split path's memory does not grow with the prefix (1 MiB of slack for the
    allocator's rounding of cuDNN's workspace). The whole profile at T bounds a chunk beside
    64 decode rows."""
    from gpu_backend.engine.memory import (
        dummy_prefix_batch,
        forward_peak,
        measure_activation_peak,
        split_profile_shapes,
    )
    from gpu_backend.engine.runner import InputCopier
    from gpu_backend.engine.setup import load_model
    from gpu_backend.engine.shapes import blocks_needed, host_batch, mixed_shape
    from sim.core.catalog import get_gpu, get_model
    from sim.core.engine_config import EngineConfig
    from sim.core.split_shapes import SEGMENT_TOKENS, SplitShapes

    spec, device, tokens, bs = get_model("qwen2.5-0.5b"), torch.device("cuda"), 2048, 16
    config = EngineConfig(spec, get_gpu("h200"), max_model_len=32768, block_size=bs)
    model = load_model(config, device, seed=0, backend="split")
    profiled = measure_activation_peak(model, spec, tokens, config.num_seqs, bs, device, 32768)
    (chunk, prefix), = split_profile_shapes(tokens, 32768, bs, SplitShapes())
    assert (chunk, prefix) == (tokens, SEGMENT_TOKENS + 2048 - bs)
    split_step = forward_peak(model, spec, *dummy_prefix_batch(chunk, prefix, bs, device), bs,
                              device)
    longer = forward_peak(model, spec, *dummy_prefix_batch(tokens, 3 * SEGMENT_TOKENS, bs,
                                                           device), bs, device)
    assert split_step <= profiled and longer <= split_step + 2**20
    mixed = mixed_shape(tokens - 64, 3 * SEGMENT_TOKENS, 64, 1024)
    num_blocks = blocks_needed(mixed, bs) + 1
    mixed_batch = InputCopier(device).to_device(host_batch(mixed, bs, num_blocks))
    assert forward_peak(model, spec, mixed_batch, num_blocks, bs, device) <= profiled


def _has_flashinfer() -> bool:
    import importlib.util

    return importlib.util.find_spec("flashinfer") is not None


@pytest.mark.skipif(not _has_flashinfer(), reason="needs FlashInfer (the flashinfer extra)")
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("shape", ["gqa4_d128", "gqa7_d128", "mha_d64"])
@pytest.mark.parametrize("batch", list(SPLIT_BATCHES))
def test_flashinfer_backend_bf16(batch: str, shape: str, block_size: int) -> None:
    """The flashinfer backend over the engine's strided pool (one layer's K of a [blocks,
    layers, 2, ...] pool, unused slots NaN): prefill rows through FlashInfer's paged prefill,
    a mixed step's leading decode rows through the Triton decode path; the float32 paged
    reference to bf16 rounding."""
    from gpu_backend.batch import ForwardBatch, HostLens
    from gpu_backend.layers import PagedAttention

    pb, num_decodes = _split_problem(batch, shape, block_size)
    empty = torch.zeros(0, dtype=torch.int64, device="cuda")
    batch_ = ForwardBatch(
        input_ids=empty, positions=empty, slot_mapping=empty, block_tables=pb.block_tables,
        seq_lens=pb.seq_lens, query_start_loc=pb.query_start_loc, logits_indices=empty,
        max_query_len=pb.max_query_len, max_seq_len=pb.max_seq_len, num_decodes=num_decodes,
        host_lens=HostLens(pb.query_start_loc.cpu().numpy(), pb.seq_lens.cpu().numpy(),
                           pb.block_tables.cpu().numpy()))
    heads, kv_heads, head_dim = SHAPES[shape]
    attn = PagedAttention(heads, kv_heads, head_dim, "flashinfer")
    prepared = attn.prepare(batch_, pb.k_cache)
    assert prepared.prefill_plan is not None
    assert prepared.prefill_plan.num_rows == pb.q.shape[0] - num_decodes
    out = attn.attend(pb.q, pb.k_cache, pb.v_cache, prepared)
    err = rel_error(out, _paged_reference_f32(pb))
    assert err < BF16_TOL, f"rel error {err}"
    # planned at the first layer's attend when the batch came unprepared and without host
    # block tables (copied from the device)
    bare = ForwardBatch(**{**batch_.__dict__, "host_lens": None})
    err = rel_error(attn.attend(pb.q, pb.k_cache, pb.v_cache, bare), _paged_reference_f32(pb))
    assert err < BF16_TOL, f"rel error {err}"
