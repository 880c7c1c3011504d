"""SPLIT attention for steps with prefill rows: each prefill sequence's chunk over its own keys
(a causal square) and over its cached prefix (bounded segments, no mask), each part through
an SDPA op that also returns the log-sum-exp, the parts merged by their LSEs.

    one prefill sequence: prefix_len cached keys, then the chunk's query_len new keys

    keys |<- segment 0 ->|<- segment 1 ->|<- seg 2 ->|<------ own keys ------>|
         every chunk row sees every prefix key         causal square: row i sees
         (no mask): one SDPA call per segment          own keys 0..i (top-left)
    out = the parts merged by LSE (lse_merge.py); beyond one segment the running
          result is kept in float32

Why: on one H200 (Llama-3.1-8B heads, bf16, 16,384-token prompt) cuDNN's SDPA runs the
one pass in 3.3 ms per layer, our Triton paged kernel in 6.0 ms, 6.6 ms summed over
chunks of 2,048; SPLIT with cuDNN costs 3.3 ms in one pass, 3.7 ms summed over chunks of
2,048, 3.4 ms over chunks of 8,192 (benchmarks/attention_options.py). SDPA's own causal mask is top-left
aligned, so a chunk cannot attend over prefix + chunk in one call; split this way, the
square is a plain causal call and the prefix an unmasked one.

Decode rows (the batch's leading `num_decodes` sequences, one new token each) run the Triton
paged kernel's decode path in one launch; every prefill sequence then runs on its own.

Keys reach the SDPA op contiguous ([L, KVH, D] token-major, which the op reads as BSHD):
`gather_tokens` copies a sequence's blocks out of the paged pool (one index_select each for
K and V). The chunk's own keys are gathered too: the engine writes the step's rotated K
straight into the cache (the fused rotary + store kernel) and its piecewise graphs call
attention with the cache alone, so the cache is the one place they all are; a 2,048-token
chunk of an 8B model is 8 MiB to copy. Prefix segments of at most `segment_tokens` keys
(SEGMENT_TOKENS) go through one buffer pair (`SegmentBuffers`) made once per step and
shared by every layer, so the extra memory of a step is bounded:

    fixed        2 x segment_tokens x KVH x D x dtype bytes (the segment buffers)
    per token    of the largest prefill chunk: the square's and a segment's outputs
                 (2 x H x D x dtype) and LSEs (2 x H x 4), with a prefix beyond one segment
                 also the float32 running result and its LSE (H x D x 4 + H x 4)

SDPA ops: on CUDA `aten._scaled_dot_product_cudnn_attention` (fp16/bf16, GQA by head
counts), on CPU `aten._scaled_dot_product_flash_attention_for_cpu`; both return the LSE
in natural log, [1, H, S] (or [1, H, S, 1]). torch (its cuDNN MHA code) keeps one
execution plan per operand shape (per thread) and builds a plan the first time it meets a shape: the
square's (query_len, query_len) and each segment's (query_len, keys). Chunk lengths that
keep changing (a trace's prompts) keep meeting new shapes; with
TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 in the environment torch keys its plans on lengths
rounded up to powers of two for operands in BSHD layout, which these are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gpu_backend.kernels.attention import DecodePlan, paged_attention
from gpu_backend.kernels.checks import check_cache_pair, check_same_device
from gpu_backend.kernels.lse_merge import merge_partials

SEGMENT_TOKENS = 8192  # prefix keys per SDPA call, and what the segment buffers hold
CUDNN_DTYPES = (torch.float16, torch.bfloat16)
CUDNN_ALIGN_BYTES = 16  # cuDNN faults (a sticky CUDA error) on operands aligned below this


@dataclass(frozen=True)
class PrefillSeq:
    """One prefill row of a step: q[query_start : query_start + query_len] are the sequence's
    positions prefix_len .. prefix_len + query_len - 1 (its row in block_tables: `row`)."""
    row: int
    query_start: int
    query_len: int
    prefix_len: int


@dataclass(frozen=True)
class SegmentBuffers:
    """Contiguous K and V buffers of one prefix segment: [segment_tokens / block_size blocks,
    block_size, KVH, D] each, reused by every segment, sequence and layer of a step."""
    k: Tensor
    v: Tensor

    @classmethod
    def like(cls, cache: Tensor, segment_tokens: int) -> SegmentBuffers:
        block_size = cache.shape[1]
        if segment_tokens % block_size:
            raise ValueError(f"segment of {segment_tokens} tokens: use a multiple of the "
                             f"cache's block size {block_size}")
        shape = (segment_tokens // block_size, *cache.shape[1:])
        return cls(torch.empty(shape, dtype=cache.dtype, device=cache.device),
                   torch.empty(shape, dtype=cache.dtype, device=cache.device))

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def __repr__(self) -> str:
        return f"SegmentBuffers(2 x {tuple(self.k.shape)} {self.k.dtype} {self.k.device})"


@dataclass(frozen=True)
class SplitPlan:
    """A step's SPLIT dispatch, made once per step on the host (shared by every layer)."""
    num_decodes: int  # leading decode rows (one new token each)
    decode_max_seq_len: int  # longest decode row (bounds the decode launch's key split)
    seqs: tuple[PrefillSeq, ...]
    segment_tokens: int
    buffers: SegmentBuffers | None  # None: made per call when a prefix needs them

    @property
    def needs_buffers(self) -> bool:
        return any(s.prefix_len > 0 for s in self.seqs)


def plan_split(query_start_loc: np.ndarray, seq_lens: np.ndarray, num_decodes: int,
               segment_tokens: int = SEGMENT_TOKENS, cache: Tensor | None = None) -> SplitPlan:
    """The plan of a step from its host lengths: query_start_loc [S+1], seq_lens [S] (the
    context after the step). `cache` (a layer's K cache): make the segment buffers now,
    when some prefill row has a prefix."""
    qsl = np.asarray(query_start_loc, dtype=np.int64)
    lens = np.asarray(seq_lens, dtype=np.int64)
    if qsl.shape != (lens.shape[0] + 1,):
        raise ValueError(f"query_start_loc {qsl.shape} must have one more entry than "
                         f"seq_lens {lens.shape}")
    query_lens = np.diff(qsl)
    if not 0 <= num_decodes <= lens.shape[0] or np.any(query_lens[:num_decodes] != 1):
        raise ValueError(f"the first {num_decodes} rows must be decode rows (one new token), "
                         f"got query lengths {query_lens[:num_decodes].tolist()}")
    if np.any(query_lens > lens) or segment_tokens < 1:
        raise ValueError("each row's new tokens must fit its context, and segments must hold "
                         "at least one token")
    seqs = tuple(PrefillSeq(row, int(qsl[row]), int(query_lens[row]),
                            int(lens[row] - query_lens[row]))
                 for row in range(num_decodes, lens.shape[0]) if query_lens[row] > 0)
    decode_max = int(lens[:num_decodes].max()) if num_decodes else 0
    plan = SplitPlan(num_decodes, decode_max, seqs, segment_tokens, None)
    if cache is not None and plan.needs_buffers:
        return SplitPlan(num_decodes, decode_max, seqs, segment_tokens,
                         SegmentBuffers.like(cache, segment_tokens))
    return plan


def gather_tokens(cache: Tensor, table_row: Tensor, start: int, length: int,
                  out: Tensor | None = None) -> Tensor:
    """Positions [start, start + length) of one sequence's keys (or values), copied out of the
    paged cache [num_blocks, block_size, KVH, D] through its block-table row: a contiguous
    [length, KVH, D] view of `out` (blocks; made when None)."""
    block_size = cache.shape[1]
    first, end = start // block_size, -(-(start + length) // block_size)
    num_blocks = end - first
    if out is None:
        out = torch.empty((num_blocks, *cache.shape[1:]), dtype=cache.dtype, device=cache.device)
    elif out.shape[0] < num_blocks or out.shape[1:] != cache.shape[1:]:
        raise ValueError(f"gather of {num_blocks} blocks into a buffer {tuple(out.shape)}")
    blocks = out[:num_blocks]
    torch.index_select(cache, 0, table_row[first:end], out=blocks)
    offset = start - first * block_size
    return blocks.view(-1, *cache.shape[2:])[offset:offset + length]


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


def sequence_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, table_row: Tensor,
                       prefix_len: int, scale: float, out: Tensor,
                       buffers: SegmentBuffers | None) -> Tensor:
    """One prefill sequence: q [c, H, D] (positions prefix_len .. prefix_len + c - 1, its
    K/V already in the cache) into out [c, H, D]. `buffers` hold each prefix segment."""
    num_tokens = q.shape[0]
    own_k = gather_tokens(k_cache, table_row, prefix_len, num_tokens)
    own_v = gather_tokens(v_cache, table_row, prefix_len, num_tokens)
    part, part_lse = sdpa_with_lse(q, own_k, own_v, True, scale)
    del own_k, own_v  # their memory serves the prefix's partials
    if prefix_len == 0:
        return out.copy_(part)
    if buffers is None:
        raise ValueError("a sequence with a prefix needs segment buffers")
    segment = buffers.k.shape[0] * buffers.k.shape[1]

    def prefix_part(start: int) -> tuple[Tensor, Tensor]:
        length = min(segment, prefix_len - start)
        keys = gather_tokens(k_cache, table_row, start, length, buffers.k)
        values = gather_tokens(v_cache, table_row, start, length, buffers.v)
        return sdpa_with_lse(q, keys, values, False, scale)

    *middle, last = range(0, prefix_len, segment)
    if middle:  # more than one segment: a float32 running result
        running = (torch.empty(q.shape, dtype=torch.float32, device=q.device),
                   torch.empty(q.shape[:2], dtype=torch.float32, device=q.device))
        for start in middle:
            merge_partials(running[0], part, part_lse, *prefix_part(start), out_lse=running[1])
            part, part_lse = running
    return merge_partials(out, part, part_lse, *prefix_part(last))


def split_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                    seq_lens: Tensor, query_start_loc: Tensor, scale: float, plan: SplitPlan,
                    *, decode_plan: DecodePlan | None = None,
                    out: Tensor | None = None) -> Tensor:
    """Causal varlen attention of a step with prefill rows over the paged cache (K/V already
    stored): the decode rows through the paged kernel's decode path, each prefill sequence
    through SPLIT. Shapes as `paged_attention`'s; `plan` from `plan_split` of the same step;
    `decode_plan` the decode rows' split plan (made by the launch when None)."""
    check_cache_pair(k_cache, v_cache)
    check_same_device(q=q, k_cache=k_cache, block_tables=block_tables, seq_lens=seq_lens)
    if q.dim() != 3 or q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)}")
    end = plan.seqs[-1].query_start + plan.seqs[-1].query_len if plan.seqs else plan.num_decodes
    if q.shape[0] < end or q.dtype != k_cache.dtype:
        raise ValueError(f"q {tuple(q.shape)} {q.dtype}: the plan covers {end} tokens of "
                         f"cache dtype {k_cache.dtype}")
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    d = plan.num_decodes
    if d:
        paged_attention(q[:d], k_cache, v_cache, block_tables[:d], seq_lens[:d],
                        query_start_loc[:d + 1], scale, max_query_len=1,
                        max_seq_len=plan.decode_max_seq_len, plan=decode_plan, out=out[:d])
    buffers = plan.buffers
    if buffers is None and plan.needs_buffers:
        buffers = SegmentBuffers.like(k_cache, plan.segment_tokens)
    for seq in plan.seqs:
        rows = slice(seq.query_start, seq.query_start + seq.query_len)
        sequence_attention(q[rows], k_cache, v_cache, block_tables[seq.row], seq.prefix_len,
                           scale, out[rows], buffers)
    return out
