"""Launcher for the paged-attention kernel: checks, tile configs, split-K choice.

Dispatch, on Python ints only (no host sync, so decode steps stay graph-capturable):

* `max_query_len == 1` (pure decode): small tiles (BLOCK_M = 16 rows = the GQA group,
  padded), one tile per sequence, keys split by a per-step plan made on the device
  (flash-decoding): the batch's keys x KV heads are cut into shares of at most one size so
  that they spread over DECODE_TARGET_WAVES programs per SM, each sequence cut evenly into
  as many shares as its context needs, and a second kernel merges the partials. A decode step
  then costs about its total keys even when one long sequence sits among short ones;
  splitting each sequence evenly, and only when the batch left SMs idle, made such
  steps follow the longest sequence (Mooncake replays: 17-32 sequences of ~11k tokens
  took twice what their keys predict).
* otherwise (prefill chunks, or mixed batches): 128-row tiles over every sequence in
  one launch; when tiles x KV heads would leave SMs idle (a short chunk of a single
  sequence) each tile's key range is split evenly across programs. For prefill chunks
  this was measured neutral, so it only kicks in below one program per SM.

Measured on one H200 (Llama-3.1-8B heads, bf16, benchmarks/kernel_bench.py): decode at
0.86-1.0x of the copy-bandwidth roofline; a 16k-token causal prefill at ~400 TFLOP/s; the
same prompt in chunks of 512 / 2048 / 8192 costs 1.23 / 1.12 / 1.03x the single pass.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
from torch import Tensor

from gpu_backend.kernels.attention_kernel import (
    LOG2E,
    combine_splits_kernel,
    decode_split_plan_kernel,
    paged_attention_kernel,
)
from gpu_backend.kernels.checks import check_cache_pair, check_int_tensor, check_same_device

MAX_NUM_SPLITS = 32
MIN_KEYS_PER_SPLIT = 256
SPLIT_TARGET_WAVES = 2  # prefill/mixed launches, when splitting: programs per SM to aim for
# A decode plan spreads a step's keys over this many programs per SM (the decode tile fits 4
# per SM by registers). GPU_BACKEND_DECODE_WAVES overrides it for A/B runs.
DECODE_TARGET_WAVES = int(os.environ.get("GPU_BACKEND_DECODE_WAVES", "4"))
PLAN_CANDIDATES = 13  # share sizes a plan scores: 1x, 1.25x, ... 4x the smallest
if not 1 <= DECODE_TARGET_WAVES <= 16:
    raise ValueError(f"GPU_BACKEND_DECODE_WAVES={DECODE_TARGET_WAVES}: use 1..16 programs per SM")
# GPU_BACKEND_DECODE_PLAN=0 splits decode like prefill (evenly, only when SMs sit idle): the
# earlier behaviour, for A/B runs and as a fallback.
DECODE_SPLIT_PLAN = os.environ.get("GPU_BACKEND_DECODE_PLAN", "1") != "0"


def uses_split_plan(max_query_len: int, num_splits: int | None = None) -> bool:
    """Whether a launch splits by a decode plan: decode-only, no split count forced."""
    return DECODE_SPLIT_PLAN and max_query_len <= 1 and num_splits is None


@dataclass(frozen=True)
class TileConfig:
    block_m: int  # query rows per tile (tokens x GQA group)
    block_n: int  # keys per inner step
    num_warps: int
    num_stages: int
    # Launch order of a prefill or mixed launch's tiles: False numbers them from the first
    # sequence's first tile (each sequence's shortest causal tile first); True from the last,
    # so the longest tiles start first and the launch ends on short ones (no effect on a
    # decode plan's launch)
    longest_first: bool = False
    # True: the launch takes every KV head of a tile before the next tile (one grid axis for
    # both), so with longest_first each head's longest tiles start before any shorter tile
    heads_inner: bool = False


def prefill_config(head_dim: int) -> TileConfig:
    if head_dim <= 64:
        return TileConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
    return TileConfig(block_m=128, block_n=128, num_warps=8, num_stages=3)


def decode_config(group: int) -> TileConfig:
    return TileConfig(block_m=max(16, triton.next_power_of_2(group)), block_n=64,
                      num_warps=2, num_stages=4)


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # interpreter runs: any small number exercises the split path
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(num_programs: int, max_seq_len: int | None, device: torch.device) -> int:
    """Split key ranges only when tiles x KV heads would leave SMs idle.

    `num_programs` is the launch's tile count times KV heads (an upper bound: some tiles
    exit at once). Each split keeps at least MIN_KEYS_PER_SPLIT keys of max_seq_len.
    """
    num_sms = _num_sms(device)
    if num_programs >= num_sms:
        return 1
    splits = triton.cdiv(SPLIT_TARGET_WAVES * num_sms, max(1, num_programs))
    if max_seq_len is not None:
        splits = min(splits, triton.cdiv(max_seq_len, MIN_KEYS_PER_SPLIT))
    return max(1, min(splits, MAX_NUM_SPLITS))


@dataclass
class DecodePlan:
    """Device buffers of one decode step's split plan (see decode_split_plan_kernel); made
    once per step and shared by every layer (same sequence lengths, same KV heads)."""
    seq_shares: Tensor  # [S] int32: shares of each sequence (>= 1)
    extra_start: Tensor  # [S + 1] int32: first extra share of each sequence; [S] = count
    extra_seq: Tensor  # [max_extras] int32: the sequence of each extra share
    extra_split: Tensor  # [max_extras] int32: its index within the sequence (>= 1)
    split_keys: Tensor  # [1] int32: keys per share
    num_kv_heads: int
    block_n: int

    @property
    def num_seqs(self) -> int:
        return self.seq_shares.shape[0]

    @property
    def launch_size(self) -> int:
        """Programs per KV head: one per sequence, then the most extras a plan can have."""
        return self.num_seqs + self.extra_seq.shape[0]

    def buffers(self) -> tuple[Tensor, ...]:
        """The buffers the attention and merge kernels read (split_keys only sets counts)."""
        return self.seq_shares, self.extra_start, self.extra_seq, self.extra_split


def plan_decode_splits(seq_lens: Tensor, num_kv_heads: int, block_n: int = 64,
                       min_keys: int = MIN_KEYS_PER_SPLIT,
                       target_waves: int | None = None) -> DecodePlan:
    """Launch the one-program plan kernel for a decode batch (no host sync). `block_n` must
    be the decode tile's (decode_config(group).block_n, 64); `target_waves` (programs per
    SM to spread the keys over) defaults to DECODE_TARGET_WAVES."""
    num_seqs = seq_lens.shape[0]
    device = seq_lens.device
    target = (target_waves or DECODE_TARGET_WAVES) * _num_sms(device)
    # extras = sum (ceil(len / keys) - 1) <= total / keys, and keys >= total x KVH / target
    max_extras = triton.cdiv(target, num_kv_heads)

    def ints(n: int) -> Tensor:
        return torch.empty(n, dtype=torch.int32, device=device)

    plan = DecodePlan(ints(num_seqs), ints(num_seqs + 1), ints(max_extras), ints(max_extras),
                      ints(1), num_kv_heads, block_n)
    decode_split_plan_kernel[(1,)](
        seq_lens, *plan.buffers(), plan.split_keys, num_seqs, num_kv_heads, target,
        SEQS_PAD=triton.next_power_of_2(max(num_seqs, 1)), MIN_KEYS=min_keys,
        MAX_SPLITS=MAX_NUM_SPLITS, BLOCK_N=block_n, NUM_CANDIDATES=PLAN_CANDIDATES,
        num_warps=4,
    )
    return plan


def _check_args(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                seq_lens: Tensor, query_start_loc: Tensor) -> None:
    check_cache_pair(k_cache, v_cache)
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if q.dim() != 3 or q.shape[2] != head_dim:
        raise ValueError(f"q must be [T, H, {head_dim}], got {tuple(q.shape)}")
    if q.shape[1] % num_kv_heads != 0:
        raise ValueError(f"num_heads {q.shape[1]} must be a multiple of num_kv_heads "
                         f"{num_kv_heads}")
    if q.dtype != k_cache.dtype:
        raise ValueError(f"q dtype {q.dtype} != cache dtype {k_cache.dtype}")
    if q.stride(-1) != 1:
        raise ValueError(f"q must be contiguous in head_dim, strides {q.stride()}")
    check_int_tensor("block_tables", block_tables, 2)
    check_int_tensor("seq_lens", seq_lens, 1)
    check_int_tensor("query_start_loc", query_start_loc, 1)
    num_seqs = seq_lens.shape[0]
    if block_tables.shape[0] != num_seqs or query_start_loc.shape[0] != num_seqs + 1:
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} and query_start_loc "
            f"{tuple(query_start_loc.shape)} must have {num_seqs} and {num_seqs + 1} rows"
        )
    if block_tables.stride(1) != 1:
        raise ValueError(f"block_tables rows must be contiguous, strides {block_tables.stride()}")
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                      seq_lens=seq_lens, query_start_loc=query_start_loc)


def _split_layout(q: Tensor, seq_lens: Tensor, num_kv_heads: int, cfg: TileConfig,
                  max_query_len: int, max_seq_len: int | None, num_splits: int | None,
                  plan: DecodePlan | None, min_split_keys: int, num_tiles: int,
                  ) -> tuple[DecodePlan | None, int, int, int]:
    """How a launch splits its keys: a decode step's split plan (made here unless given, and
    then checked against this call), or an even split of every tile. Returns the plan (None
    for an even split), the tiles and splits to launch, and the rows of partial results."""
    num_tokens, num_heads, _ = q.shape
    num_seqs = seq_lens.shape[0]
    if uses_split_plan(max_query_len, num_splits):
        if plan is None:
            plan = plan_decode_splits(seq_lens, num_kv_heads, cfg.block_n, min_split_keys)
        elif (plan.num_kv_heads, plan.block_n, plan.num_seqs) != (
                num_kv_heads, cfg.block_n, num_seqs):
            raise ValueError(f"decode plan for {plan.num_seqs} sequences, "
                             f"{plan.num_kv_heads} KV heads, block_n {plan.block_n} does not fit "
                             f"this call ({num_seqs}, {num_kv_heads}, {cfg.block_n})")
        return plan, plan.launch_size, 1, plan.launch_size * num_heads
    if num_splits is None:
        num_splits = choose_num_splits(num_tiles * num_kv_heads, max_seq_len, q.device)
    if not 1 <= num_splits <= MAX_NUM_SPLITS:
        raise ValueError(f"num_splits {num_splits}: use 1..{MAX_NUM_SPLITS}")
    return None, num_tiles, num_splits, num_tokens * num_heads * num_splits


def _check_timeline(timeline: Tensor, grid: tuple[int, int, int], q: Tensor) -> None:
    """A launch's timeline holds three int64 values for each of its programs, on q's device."""
    if timeline.dtype != torch.int64 or not timeline.is_contiguous():
        raise ValueError(f"timeline must be a contiguous int64 tensor, not {timeline.dtype}")
    if timeline.numel() < 3 * grid[0] * grid[1] * grid[2]:
        raise ValueError(f"timeline holds {timeline.numel()} values; this launch of "
                         f"{grid[0] * grid[1] * grid[2]} programs needs 3 per program")
    check_same_device(q=q, timeline=timeline)


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
    *,
    max_query_len: int,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    tile_config: TileConfig | None = None,
    min_split_keys: int = MIN_KEYS_PER_SPLIT,
    plan: DecodePlan | None = None,
    out: Tensor | None = None,
    timeline: Tensor | None = None,
) -> Tensor:
    """Causal varlen attention of new tokens over a paged KV cache (K/V already stored).

    q: [T, H, D]; k_cache, v_cache: [num_blocks, block_size, KVH, D] (dim 0 any stride);
    block_tables: [S, max_blocks]; seq_lens: [S] context length including the new
    tokens; query_start_loc: [S+1]. Returns out: [T, H, D] in q's dtype.
    `max_query_len` (and `max_seq_len`, used to bound split-K) are host-side ints;
    `num_splits` (an even split of every tile; for decode it replaces the plan),
    `tile_config` and `min_split_keys` (the smallest decode share) override the heuristics
    (tests, tuning). `plan`: a decode step's split plan made once for all layers
    (plan_decode_splits of these seq_lens); without it a decode call makes its own.
    `timeline` (benchmarks): an int64 tensor of at least 3 x the launch's programs, which
    each program that runs fills with its SM, start and end (the GPU's global ns timer) at
    its grid position (axis 0 fastest, then 1, then 2).
    """
    _check_args(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if tile_config is None:
        tile_config = decode_config(group) if max_query_len <= 1 else prefill_config(head_dim)
    cfg = tile_config
    if cfg.block_m < group:
        raise ValueError(f"tile block_m {cfg.block_m} must hold the GQA group of {group} heads")
    block_q = cfg.block_m // group
    one_tile_per_seq = max_query_len <= block_q
    num_tiles = num_seqs if one_tile_per_seq else num_tokens // block_q + num_seqs
    head_dim_pad = triton.next_power_of_2(head_dim)
    plan, num_tiles, num_splits, rows = _split_layout(
        q, seq_lens, num_kv_heads, cfg, max_query_len, max_seq_len, num_splits, plan,
        min_split_keys, num_tiles)
    if plan is not None or num_splits > 1:
        part_acc = torch.empty(rows, head_dim_pad, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(rows, 2, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out  # unused by the kernel
    # without a plan its buffers are unused: any int32 tensor stands in
    buffers = plan.buffers() if plan is not None else (seq_lens,) * 4
    # plan: one flat launch, first shares of every head before any extra share (see kernel)
    heads_inner = cfg.heads_inner and plan is None
    grid = ((num_tiles * num_kv_heads, 1, 1) if plan is not None
            else (num_tiles * num_kv_heads, 1, num_splits) if heads_inner
            else (num_tiles, num_kv_heads, num_splits))
    if timeline is not None:
        _check_timeline(timeline, grid, q)
    paged_attention_kernel[grid](
        q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc,
        part_acc, part_ml, *buffers, timeline if timeline is not None else seq_lens,
        scale * LOG2E, num_seqs, num_heads, num_splits,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=block_size, GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_M=cfg.block_m, BLOCK_Q=block_q, BLOCK_N=cfg.block_n,
        ONE_TILE_PER_SEQ=one_tile_per_seq, SPLIT_PLAN=plan is not None,
        LONGEST_FIRST=cfg.longest_first, HEADS_INNER=heads_inner,
        TIMELINE=timeline is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if plan is not None or num_splits > 1:
        # plan: one program per sequence, merging its shares; else one per token
        combine_splits_kernel[(num_seqs if plan is not None else num_tokens, num_heads)](
            out, part_acc, part_ml, query_start_loc, buffers[0], buffers[1], num_seqs, num_heads,
            num_splits, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
            SPLITS_PAD=triton.next_power_of_2(MAX_NUM_SPLITS), SPLIT_PLAN=plan is not None,
            num_warps=4,
        )
    return out
