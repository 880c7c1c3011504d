"""SPLIT attention for steps with prefill rows: each prefill sequence's chunk over its own keys
(a causal square) and over its cached prefix (segments, no mask), each part through an SDPA
op that also returns the log-sum-exp, the parts merged by their LSEs.

    one prefill sequence: prefix_len cached keys, then the chunk's query_len new keys

    keys |<- segment 0 ->|<- segment 1 ->|<-a->|<------ own keys ------>|
         every chunk row sees every segment key      causal square over the prefix's
         (no mask): one SDPA call per segment        last a keys and the own keys
    out = the parts merged by LSE in one launch (lse_merge.py; a prefix of more than
          LIVE_PARTS - 1 segments folds each LIVE_PARTS into a float32 running result)

Every call is padded to a shape from a small fixed set (split_shapes.py: the segment sizes,
the absorbed remainder a, the padded rows), so cuDNN builds a few plans at start-up and none
during a replay.

Why: on one H200 (Llama-3.1-8B heads, bf16, 16,384-token prompt) cuDNN's SDPA runs the
one pass in 3.3 ms per layer, our Triton paged kernel in 6.0 ms, 6.6 ms summed over
chunks of 2,048; SPLIT with cuDNN costs 3.3 ms in one pass, 3.7 ms summed over chunks of
2,048, 3.4 ms over chunks of 8,192 (benchmarks/attention_options.py). SDPA's own causal mask
is top-left aligned, so a chunk cannot attend over prefix + chunk in one call; split this
way, the square is a plain causal call and the prefix unmasked ones.

Decode rows (the batch's leading `num_decodes` sequences, one new token each) run the Triton
paged kernel's decode path in one launch. Prefill sequences of fewer than the plan's
`min_query_len` new tokens (the auto backend: SPLIT_MIN_QUERY) run the Triton paged kernel's
prefill path, one launch per run of adjacent such rows (`PagedRun`); every other prefill
sequence runs SPLIT on its own. The step's `SplitPlan` (split_plan.py, made on the host from
its lengths) holds that dispatch and each SPLIT sequence's padded parts; this module launches it.

Keys reach the SDPA op contiguous ([L, KVH, D] token-major, which the op reads as BSHD),
gathered out of the paged pool through the block table (K and V of a part in one launch,
kv_gather.py) into buffers made once per step and shared by every layer (`SplitBuffers` of
split_plan.py, zeroed when made):

    q         the chunk's rows copied to row a of a [rows, H, D] buffer (the square's dummy
              and pad rows are whatever finite rows the buffer holds)
    square    its a + c keys from a block boundary (a segment boundary is one), the rest of
              the last block zeroed: a cache slot past the context may hold anything
    segments  whole blocks, exactly their keys

The chunk's own keys are gathered too: the engine writes the step's rotated K straight into
the cache (the fused rotary + store kernel) and its piecewise graphs call attention with the
cache alone, so the cache is the one place they all are. A step's extra memory:

    fixed      2 x max_segment_tokens x KVH x D x dtype bytes (the segment buffers)
    per chunk  of its largest prefill sequence, padded: the q buffer (H x D x dtype per row),
               the square's K and V (2 x KVH x D x dtype per row), the square's and up to
               LIVE_PARTS - 1 segments' outputs and LSEs (H x D x dtype + H x 4 per row each)
               held for the merge, and beyond that many segments a float32 running result
               and its LSE (H x D x 4 + H x 4 per token)

SDPA ops: on CUDA `aten._scaled_dot_product_cudnn_attention` (fp16/bf16, GQA by head
counts), on CPU `aten._scaled_dot_product_flash_attention_for_cpu`; both return the LSE
in natural log, [1, H, S] (or [1, H, S, 1]). torch's cuDNN attention keys its plans on the
operands' sizes and strides (per thread), which `SplitShapes.sdpa_shapes` enumerates.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from gpu_backend.kernels.attention import DecodePlan, paged_attention
from gpu_backend.kernels.checks import check_cache_pair, check_same_device
from gpu_backend.kernels.kv_gather import gather_kv
from gpu_backend.kernels.lse_merge import merge_parts
from gpu_backend.kernels.split_plan import PrefillSeq, SplitBuffers, SplitPlan
from sim.core.split_shapes import SdpaShape

__all__ = ["gather_padded", "prepare_plan", "sdpa_with_lse", "split_attention", "warm_plans"]

CUDNN_DTYPES = (torch.float16, torch.bfloat16)
CUDNN_ALIGN_BYTES = 16  # cuDNN faults (a sticky CUDA error) on operands aligned below this
# a sequence's parts (the square's and its segments' outputs) held before they are merged: up
# to this many take one merge launch at the end; a longer prefix folds each LIVE_PARTS into a
# float32 running result first, so a long context holds at most this many outputs at once
LIVE_PARTS = 4


def prepare_plan(plan: SplitPlan, cache: Tensor, num_heads: int) -> SplitPlan:
    """`plan` with its step's buffers shaped like `cache` (a layer's K cache) and its runs'
    offsets on the cache's device: one copy of them all, from pinned memory on CUDA, so the
    host does not wait for the device (a pageable copy would, and a step launched ahead of
    the one running would then start only once that one ends)."""
    buffers = SplitBuffers.for_plan(plan, cache, num_heads) if plan.seqs else None
    if not plan.runs:
        return replace(plan, buffers=buffers, run_starts=())
    host = torch.from_numpy(np.concatenate([r.query_start_loc for r in plan.runs]))
    if cache.is_cuda:
        host = host.pin_memory()
    device = host.to(cache.device, non_blocking=cache.is_cuda)
    starts = device.split([len(r.query_start_loc) for r in plan.runs])
    return replace(plan, buffers=buffers, run_starts=starts)


def _check_cudnn_operand(name: str, x: Tensor) -> None:
    if x.dtype not in CUDNN_DTYPES:
        raise ValueError(f"SPLIT on CUDA runs cuDNN's SDPA, which takes fp16 or bf16; {name} "
                         f"is {x.dtype}")
    align = CUDNN_ALIGN_BYTES // x.element_size()
    if (x.data_ptr() % CUDNN_ALIGN_BYTES or x.stride(-1) != 1
            or any(s % align for s in x.stride()[:-1])):
        raise ValueError(f"{name} {tuple(x.shape)} strides {x.stride()} is not aligned to "
                         f"{CUDNN_ALIGN_BYTES} bytes as cuDNN needs")


def sdpa_with_lse(q: Tensor, k: Tensor, v: Tensor, causal: bool,
                  scale: float) -> tuple[Tensor, Tensor]:
    """q [S, H, D], k, v [L, KVH, D] (token-major) -> (out [S, H, D] in q's dtype, lse [S, H]
    float32, natural log), views of the op's outputs. causal: top-left aligned (row i sees
    keys 0..i), so only for the square (S == L). Query head h reads KV head h // (H // KVH)."""
    if causal and q.shape[0] != k.shape[0]:
        raise ValueError(f"a causal call is the square: {q.shape[0]} rows, {k.shape[0]} keys")
    q4, k4, v4 = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, heads, S, D]
    if q.is_cuda:
        for name, x in (("q", q), ("k", k), ("v", v)):
            _check_cudnn_operand(name, x)
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q4, k4, v4, None, True, 0.0, causal, False, scale=scale)[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q4, k4, v4, 0.0, causal, scale=scale)[:2]
    if lse.dim() == 4:  # [1, H, S, 1]
        lse = lse[..., 0]
    out = out[0].transpose(0, 1)
    return (out if out.stride(-1) == 1 else out.contiguous()), lse[0].transpose(0, 1)


def warm_plans(shapes: list[SdpaShape], num_heads: int, num_kv_heads: int, head_dim: int,
               dtype: torch.dtype, device: torch.device) -> None:
    """Run one SDPA call of each shape on zeros, with the strides SPLIT's calls have, so the
    process holds each plan before its first step (call it on the thread that runs the
    steps: torch keeps cuDNN plans per thread)."""
    if not shapes:
        return
    rows = max(s.rows for s in shapes)
    keys = max(s.keys for s in shapes)
    q = torch.zeros(rows, num_heads, head_dim, dtype=dtype, device=device)
    k = torch.zeros(keys, num_kv_heads, head_dim, dtype=dtype, device=device)
    for shape in shapes:
        sdpa_with_lse(q[:shape.rows], k[:shape.keys], k[:shape.keys], shape.causal,
                      head_dim ** -0.5)


def gather_padded(k_cache: Tensor, v_cache: Tensor, table_row: Tensor, start: int,
                  length: int, rows: int, k_out: Tensor, v_out: Tensor) -> tuple[Tensor, Tensor]:
    """Positions [start, start + length) of one sequence's keys and values (start on a block
    boundary) as the first `length` of `rows` contiguous [rows, KVH, D] tokens of k_out,
    v_out (blocks; one launch): the rest of the last gathered block zeroed, the tokens after
    it as the buffers held them."""
    block_size = k_cache.shape[1]
    if start % block_size or rows < length or k_out.shape[0] * block_size < rows:
        raise ValueError(f"padded gather of {length} keys from {start} into {rows} rows of a "
                         f"buffer {tuple(k_out.shape)}: start on a block, fit the buffer")
    gather_kv(k_cache, v_cache, table_row, start // block_size, -(-length // block_size),
              length, k_out, v_out)
    tail = tuple(k_cache.shape[2:])
    return k_out.view(-1, *tail)[:rows], v_out.view(-1, *tail)[:rows]


def sequence_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, table_row: Tensor,
                       seq: PrefillSeq, scale: float, out: Tensor,
                       buffers: SplitBuffers) -> Tensor:
    """One SPLIT sequence: q [c, H, D] (positions prefix_len .. prefix_len + c - 1, its K/V
    already in the cache) into out [c, H, D], through the step's `buffers`: the square, then
    each prefix segment (its K and V gathered into the one segment buffer pair, in stream
    order after the call before read it), the parts merged by one launch at the end (and
    one per LIVE_PARTS before it where a long prefix has more)."""
    num_tokens, absorbed = q.shape[0], seq.absorbed
    real = slice(absorbed, absorbed + num_tokens)
    rows = buffers.q[:seq.query_rows]
    rows[real].copy_(q)
    keys, values = gather_padded(k_cache, v_cache, table_row, seq.prefix_len - absorbed,
                                 absorbed + num_tokens, seq.square_rows, buffers.square_k,
                                 buffers.square_v)
    part, part_lse = sdpa_with_lse(rows[:seq.square_rows], keys, values, True, scale)
    if not seq.segments:
        return out.copy_(part[real])
    if buffers.segment_k is None or buffers.segment_v is None:
        raise ValueError("a sequence with prefix segments needs segment buffers")
    segment_q = rows[absorbed:absorbed + seq.segment_rows]
    parts = [(part[real], part_lse[real])]
    running: tuple[Tensor, Tensor] | None = None
    for i, (start, length) in enumerate(seq.segments):  # whole blocks from a block boundary
        keys, values = gather_padded(k_cache, v_cache, table_row, start, length, length,
                                     buffers.segment_k, buffers.segment_v)
        seg_out, seg_lse = sdpa_with_lse(segment_q, keys, values, False, scale)
        parts.append((seg_out[:num_tokens], seg_lse[:num_tokens]))
        if len(parts) == LIVE_PARTS and i + 1 < len(seq.segments):
            if running is None:
                running = (torch.empty(q.shape, dtype=torch.float32, device=q.device),
                           torch.empty(q.shape[:2], dtype=torch.float32, device=q.device))
            merge_parts(running[0], parts, out_lse=running[1])  # running may be among parts
            parts = [running]
    return merge_parts(out, parts)


def split_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                    seq_lens: Tensor, query_start_loc: Tensor, scale: float, plan: SplitPlan,
                    *, decode_plan: DecodePlan | None = None,
                    out: Tensor | None = None) -> Tensor:
    """Causal varlen attention of a step with prefill rows over the paged cache (K/V already
    stored): the decode rows through the paged kernel's decode path, the plan's runs through
    its prefill path, each other prefill sequence through SPLIT. Shapes as
    `paged_attention`'s; `plan` from `plan_split` of the same step (with `prepare_plan`'s
    buffers, else made here); `decode_plan` the decode rows' split plan (made by the launch
    when None)."""
    check_cache_pair(k_cache, v_cache)
    check_same_device(q=q, k_cache=k_cache, block_tables=block_tables, seq_lens=seq_lens)
    if q.dim() != 3 or q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)}")
    if q.shape[0] < plan.num_tokens or q.dtype != k_cache.dtype:
        raise ValueError(f"q {tuple(q.shape)} {q.dtype}: the plan covers {plan.num_tokens} "
                         f"tokens of cache dtype {k_cache.dtype}")
    if plan.run_starts is None or (plan.seqs and plan.buffers is None):
        plan = prepare_plan(plan, k_cache, q.shape[1])
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    d = plan.num_decodes
    if d:
        paged_attention(q[:d], k_cache, v_cache, block_tables[:d], seq_lens[:d],
                        query_start_loc[:d + 1], scale, max_query_len=1,
                        max_seq_len=plan.decode_max_seq_len, plan=decode_plan, out=out[:d])
    for run, starts in zip(plan.runs, plan.run_starts or (), strict=True):
        tokens, rows = slice(run.token_start, run.token_end), slice(run.first_row, run.end_row)
        paged_attention(q[tokens], k_cache, v_cache, block_tables[rows], seq_lens[rows],
                        starts, scale, max_query_len=run.max_query_len,
                        max_seq_len=run.max_seq_len, out=out[tokens])
    for seq in plan.seqs:
        assert plan.buffers is not None
        tokens = slice(seq.query_start, seq.query_start + seq.query_len)
        sequence_attention(q[tokens], k_cache, v_cache, block_tables[seq.row], seq, scale,
                           out[tokens], plan.buffers)
    return out
