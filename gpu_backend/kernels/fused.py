"""Fused elementwise kernels of the decoder layer, one launch where torch needs several.

A decode step of an 8B model spends little time in each of these ops, but written in plain
torch each costs several kernels (RMSNorm: add, cast, square, mean, rsqrt, two multiplies,
cast; rotary: gather, casts, four multiplies, two adds, concatenations), about 40 per layer
and 1,300 per step. Each launch has a fixed cost on the device (inside a CUDA graph) and on
the host (eager steps), which is what kept the decode step above its memory roofline and
the small-chunk prefill steps above their compute time. Here each group is one kernel:

    add_rms_norm      (x + residual) -> RMSNorm, and the new residual           [T, hidden]
    rotary_store_kv   neox rotary on q and k, k and v written to the paged cache  [T, heads, D]
    silu_and_mul      silu(gate) * up                                            [T, I]

All arithmetic is in float32 with one rounding at each output; the torch versions in
`gpu_backend.layers` round after each op, so the two agree to bf16 rounding, not bitwise.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor, empty, empty_like

from gpu_backend.kernels.checks import check_cache_pair, check_same_device


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    stride_x, stride_r, stride_o, stride_ro, n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = (x.to(tl.float32) + tl.load(res_ptr + row * stride_r + offs, mask=mask,
                                        other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    x32 = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (x32 * rstd * w).to(x.dtype), mask=mask)


def add_rms_norm(x: Tensor, weight: Tensor, eps: float,
                 residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """x, residual: [T, N] -> (rms_norm(x + residual) * weight, x + residual).

    Without a residual the second output is x itself (as `layers.RMSNorm` returns it).
    """
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be [T, N] contiguous in N, got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    num_rows, n_cols = x.shape
    if weight.shape != (n_cols,):
        raise ValueError(f"weight must be [{n_cols}], got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1):
        raise ValueError(f"residual must be {tuple(x.shape)} contiguous in N, got "
                         f"{tuple(residual.shape)} strides {residual.stride()}")
    check_same_device(x=x, weight=weight, **({} if residual is None else {"residual": residual}))
    out = empty_like(x)
    res_out = x if residual is None else empty_like(x)
    if num_rows == 0:
        return out, res_out
    block = triton.next_power_of_2(n_cols)
    res = x if residual is None else residual
    _add_rms_norm_kernel[(num_rows,)](
        x, res, weight, out, res_out,
        x.stride(0), res.stride(0), out.stride(0), res_out.stride(0), n_cols, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block,
        num_warps=min(16, max(1, block // 512)),
    )
    return out, res_out


@triton.jit
def _rotary_store_kv_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, cos_sin_ptr, q_out_ptr,
    k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_cs,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    H_PAD: tl.constexpr, KVH_PAD: tl.constexpr, HALF_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, HALF_PAD)
    d_mask = offs_d < HALF
    cos = tl.load(cos_sin_ptr + pos * stride_cs + offs_d, mask=d_mask, other=0.0)[None, :]
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + offs_d, mask=d_mask, other=0.0)[None, :]

    offs_h = tl.arange(0, H_PAD)
    mask = (offs_h[:, None] < NUM_HEADS) & d_mask[None, :]
    q_src = q_ptr + token * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :]
    q1 = tl.load(q_src, mask=mask, other=0.0).to(tl.float32)
    q2 = tl.load(q_src + HALF, mask=mask, other=0.0).to(tl.float32)
    q_dst = q_out_ptr + token * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    tl.store(q_dst, (q1 * cos - q2 * sin).to(q_out_ptr.dtype.element_ty), mask=mask)
    tl.store(q_dst + HALF, (q2 * cos + q1 * sin).to(q_out_ptr.dtype.element_ty), mask=mask)

    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:  # a negative slot is a padding row: nothing is written to the cache
        block_id = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        offs_kh = tl.arange(0, KVH_PAD)
        kv_mask = (offs_kh[:, None] < NUM_KV_HEADS) & d_mask[None, :]
        k_src = k_ptr + token * stride_kt + offs_kh[:, None] * stride_kh + offs_d[None, :]
        k1 = tl.load(k_src, mask=kv_mask, other=0.0).to(tl.float32)
        k2 = tl.load(k_src + HALF, mask=kv_mask, other=0.0).to(tl.float32)
        k_dst = (k_cache_ptr + block_id * stride_kcb + offset * stride_kcs
                 + offs_kh[:, None] * stride_kch + offs_d[None, :])
        tl.store(k_dst, (k1 * cos - k2 * sin).to(k_cache_ptr.dtype.element_ty), mask=kv_mask)
        tl.store(k_dst + HALF, (k2 * cos + k1 * sin).to(k_cache_ptr.dtype.element_ty),
                 mask=kv_mask)
        v_src = v_ptr + token * stride_vt + offs_kh[:, None] * stride_vh + offs_d[None, :]
        v_dst = (v_cache_ptr + block_id * stride_vcb + offset * stride_vcs
                 + offs_kh[:, None] * stride_vch + offs_d[None, :])
        tl.store(v_dst, tl.load(v_src, mask=kv_mask), mask=kv_mask)
        tl.store(v_dst + HALF, tl.load(v_src + HALF, mask=kv_mask), mask=kv_mask)


def rotary_store_kv(q: Tensor, k: Tensor, v: Tensor, positions: Tensor, cos_sin: Tensor,
                    k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> Tensor:
    """Rotate q and k (neox style) and write rotated k and v into the paged cache.

    q: [T, H, D]; k, v: [T, KVH, D] (strided views of one qkv row are fine); positions: [T];
    cos_sin: [max_position, D] float32 (cos in the first half, sin in the second, as
    `layers.RotaryEmbedding` builds it); caches: [num_blocks, block_size, KVH, D];
    slot_mapping: [T], negative = skip. Returns the rotated q as a new contiguous [T, H, D].
    """
    check_cache_pair(k_cache, v_cache)
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    if head_dim != cache_dim or head_dim % 2:
        raise ValueError(f"q head_dim {head_dim} must be even and equal the cache's {cache_dim}")
    for name, x in (("k", k), ("v", v)):
        if x.shape != (num_tokens, num_kv_heads, head_dim):
            raise ValueError(f"{name} must be [{num_tokens}, {num_kv_heads}, {head_dim}], "
                             f"got {tuple(x.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype != k_cache.dtype:
            raise ValueError(f"{name} dtype {x.dtype} != cache dtype {k_cache.dtype}")
    for name, x in (("q", q), ("k", k), ("v", v), ("cos_sin", cos_sin)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim, strides {x.stride()}")
    if cos_sin.dim() != 2 or cos_sin.shape[1] != head_dim:
        raise ValueError(f"cos_sin must be [max_position, {head_dim}], got {tuple(cos_sin.shape)}")
    if positions.shape != (num_tokens,) or slot_mapping.shape != (num_tokens,):
        raise ValueError(f"positions {tuple(positions.shape)} and slot_mapping "
                         f"{tuple(slot_mapping.shape)} must both be [{num_tokens}]")
    check_same_device(q=q, k=k, v=v, positions=positions, cos_sin=cos_sin, k_cache=k_cache,
                      v_cache=v_cache, slot_mapping=slot_mapping)
    q_out = empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    half = head_dim // 2
    _rotary_store_kv_kernel[(num_tokens,)](
        q, k, v, positions, cos_sin, q_out, k_cache, v_cache, slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), cos_sin.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HALF=half,
        H_PAD=triton.next_power_of_2(num_heads), KVH_PAD=triton.next_power_of_2(num_kv_heads),
        HALF_PAD=triton.next_power_of_2(half), BLOCK_SIZE=block_size, num_warps=4,
    )
    return q_out


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


SILU_BLOCK = 1024


def silu_and_mul(gate_up: Tensor) -> Tensor:
    """gate_up: [T, 2 * I] -> silu(gate) * up: [T, I]."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(-1) != 1:
        raise ValueError(f"gate_up must be [T, 2 * I] contiguous in its last dim, got "
                         f"{tuple(gate_up.shape)} strides {gate_up.stride()}")
    num_rows, n_cols = gate_up.shape[0], gate_up.shape[1] // 2
    out = empty((num_rows, n_cols), dtype=gate_up.dtype, device=gate_up.device)
    if num_rows == 0:
        return out
    block = min(SILU_BLOCK, triton.next_power_of_2(n_cols))
    _silu_and_mul_kernel[(num_rows, triton.cdiv(n_cols, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), n_cols, BLOCK=block, num_warps=4,
    )
    return out
