"""attention_options' SPLIT: a chunk's causal square through an aten SDPA op that also returns
the log-sum-exp (LseOp), its cached prefix through the same op on gathered keys or through the
Triton prefix kernel here, the two merged by their LSEs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from attention_options_builders import (
    Builder,
    ChunkFn,
    Gather,
    bhsd,
    expand_heads,
    require_no_prefix,
    scale_of,
    tokens,
)
from attention_options_cases import Chunk
from torch import Tensor

from gpu_backend.kernels.attention import TileConfig, prefill_config
from gpu_backend.kernels.attention_kernel import LOG2E, _attend_tile
from gpu_backend.kernels.lse_merge import merge_partials


@triton.jit
def prefix_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, out_ptr, lse_ptr,
    prefix_len, query_len, scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Every query row of a chunk over all `prefix_len` paged keys (no causal mask): the
    normalised output (float32) and the natural log-sum-exp of the scaled scores, for a
    merge with the chunk's own causal square. Tiles pack the GQA group as the engine's
    kernel does, and walk keys with its `_attend_tile`."""
    q0 = tl.program_id(0) * BLOCK_Q
    kv_head = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    q_pos = q0 + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_valid = (offs_m < BLOCK_Q * GROUP) & (q_pos < query_len)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_valid = offs_d < HEAD_DIM
    io_mask = row_valid[:, None] & d_valid[None, :]
    q_rows = q_pos.to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=io_mask, other=0.0)
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    whole = prefix_len // BLOCK_N * BLOCK_N
    # every row sees every key below prefix_len: pass prefix_len as the causal offset
    for start_n in range(0, whole, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start_n, block_table_ptr, k_base, v_base, q_pos, prefix_len,
            prefix_len, offs_d, d_valid, stride_kb, stride_ks, stride_vb, stride_vs,
            scale_log2, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N, False)
    for start_n in range(whole, prefix_len, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start_n, block_table_ptr, k_base, v_base, q_pos, prefix_len,
            prefix_len, offs_d, d_valid, stride_kb, stride_ks, stride_vb, stride_vs,
            scale_log2, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N, True)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o_rows = q_pos.to(tl.int64) * stride_ot + head * stride_oh
    tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], acc / l_safe[:, None], mask=io_mask)
    lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453  # log2 units -> natural log
    tl.store(lse_ptr + q_pos.to(tl.int64) * stride_lt + head * stride_lh, lse, mask=row_valid)


def prefix_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, table_row: Tensor,
                     prefix_len: int, scale: float, out: Tensor, lse: Tensor,
                     tile: TileConfig) -> None:
    """Launch prefix_attention_kernel: q [c, H, D]; out [c, H, D] float32; lse [c, H]."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv = k_cache.shape[2]
    group = num_heads // num_kv
    block_q = tile.block_m // group
    prefix_attention_kernel[(triton.cdiv(num_tokens, block_q), num_kv)](
        q, k_cache, v_cache, table_row, out, lse, prefix_len, num_tokens, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=k_cache.shape[1], GROUP=group, HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim), BLOCK_M=tile.block_m, BLOCK_Q=block_q,
        BLOCK_N=tile.block_n, num_warps=tile.num_warps, num_stages=tile.num_stages)


@dataclass(frozen=True)
class LseOp:
    """An aten SDPA op that also returns the log-sum-exp, which merging two partial
    attentions needs. kernel: "cudnn", "flash" (CUDA) or "cpu"; expand: K/V heads expanded
    to the query heads inside the call (timed)."""
    kernel: str
    expand: bool

    @property
    def name(self) -> str:
        return f"aten {self.kernel} +lse ({'kv expanded' if self.expand else 'gqa'})"

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, causal: bool,
                 scale: float) -> tuple[Tensor, Tensor]:
        """q [S, H, D], k, v [L, KVH, D] -> out [S, H, D], natural lse [S, H] (views).
        causal: top-left aligned, so only for the square (S == L)."""
        if self.expand:
            group = q.shape[1] // k.shape[1]
            k, v = expand_heads(k, group), expand_heads(v, group)
        q4, k4, v4 = bhsd(q), bhsd(k), bhsd(v)
        aten = torch.ops.aten
        if self.kernel == "cudnn":
            out, lse = aten._scaled_dot_product_cudnn_attention(
                q4, k4, v4, None, True, 0.0, causal, False, scale=scale)[:2]
        elif self.kernel == "flash":
            out, lse = aten._scaled_dot_product_flash_attention(
                q4, k4, v4, 0.0, causal, False, scale=scale)[:2]
        else:
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
                q4, k4, v4, 0.0, causal, scale=scale)
        if lse.dim() == 4:  # [B, H, S, 1] in some versions
            lse = lse[..., 0]
        return tokens(out), lse[0].transpose(0, 1)


def lse_one_pass(op: LseOp) -> Builder:
    def build(chunk: Chunk) -> ChunkFn:
        require_no_prefix(chunk, "the op's causal mask is top-left aligned")
        return lambda: op(chunk.q, chunk.keys, chunk.values, True, scale_of(chunk))[0]
    return build


def split(op: LseOp, prefix_by_ours: bool) -> Builder:
    """SPLIT: the chunk's own keys (causal square) through `op` with its LSE; the prefix
    keys (every row sees all) either gathered then `op`, or our paged prefix kernel; then
    the two merged by their LSEs. Gather, both parts and the merge are timed."""
    def build(chunk: Chunk) -> ChunkFn:
        scale = scale_of(chunk)

        def own() -> tuple[Tensor, Tensor]:
            return op(chunk.q, chunk.keys, chunk.values, True, scale)
        if chunk.prefix == 0:
            return lambda: own()[0]
        layer, out = chunk.prompt.layer, torch.empty_like(chunk.q)
        if prefix_by_ours:
            part = torch.empty(chunk.q.shape, dtype=torch.float32, device=out.device)
            part_lse = torch.empty(chunk.q.shape[:2], dtype=torch.float32, device=out.device)
            tile = prefill_config(chunk.q.shape[-1])

            def prefix() -> tuple[Tensor, Tensor]:
                prefix_attention(chunk.q, layer.k, layer.v, chunk.table[0], chunk.prefix,
                                 scale, part, part_lse, tile)
                return part, part_lse
        else:
            fetch = Gather(layer, chunk.table[0], chunk.prefix)

            def prefix() -> tuple[Tensor, Tensor]:
                k, v = fetch()
                return op(chunk.q, k, v, False, scale)

        def run() -> Tensor:
            a, lse_a = own()
            b, lse_b = prefix()
            return merge_partials(out, a, lse_a, b, lse_b)
        return run
    return build


def split_parts(op: LseOp, chunk: Chunk) -> dict[str, ChunkFn]:
    """SPLIT with the gathered prefix, step by step, each callable alone: where its time
    goes (the square; with a prefix also the gather, the prefix's attention, the merge)."""
    scale = scale_of(chunk)
    parts: dict[str, ChunkFn] = {
        "square": lambda: op(chunk.q, chunk.keys, chunk.values, True, scale)[0]}
    if chunk.prefix == 0:
        return parts
    fetch = Gather(chunk.prompt.layer, chunk.table[0], chunk.prefix)
    k, v = fetch()
    a, lse_a = op(chunk.q, chunk.keys, chunk.values, True, scale)
    b, lse_b = op(chunk.q, k, v, False, scale)
    out = torch.empty_like(chunk.q)
    parts.update({"gather": lambda: fetch()[0],
                  "prefix": lambda: op(chunk.q, k, v, False, scale)[0],
                  "merge": lambda: merge_partials(out, a, lse_a, b, lse_b)})
    return parts
