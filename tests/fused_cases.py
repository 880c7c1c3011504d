"""Random problems for the fused layer kernels, shared by the CPU (interpreter) and GPU tests.

Each case runs one fused kernel and the plain-torch modules of `gpu_backend.layers` (the
reference) on the same random inputs and returns the largest relative error. Inputs are
strided views where the engine passes views (rows of a wider tensor, k and v slices of one
qkv row, one layer's cache inside a NaN-filled pool).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _rel(out: Tensor, ref: Tensor) -> float:
    out, ref = out.float(), ref.float()
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def norm_case(hidden: int, rows: int, with_residual: bool, dtype: torch.dtype,
              device: str = "cpu", seed: int = 0) -> float:
    from gpu_backend.kernels import add_rms_norm
    from gpu_backend.layers import RMSNorm

    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(rows, hidden + 24, generator=gen).to(dtype).to(device)
    x = wide[:, 8:8 + hidden]  # rows of a wider tensor: row stride != hidden
    residual = torch.randn(rows, hidden, generator=gen).to(dtype).to(device) if with_residual \
        else None
    norm = RMSNorm(hidden, 1e-5, dtype).to(device)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(hidden, generator=gen))
        ref_out, ref_res = norm(x, residual)
        out, res = add_rms_norm(x, norm.weight, norm.eps, residual)
    return max(_rel(out, ref_out), _rel(res, ref_res))


def silu_case(inter: int, rows: int, dtype: torch.dtype, device: str = "cpu",
              seed: int = 0) -> float:
    from gpu_backend.kernels import silu_and_mul
    from gpu_backend.layers import silu_and_mul as silu_and_mul_ref

    gen = torch.Generator().manual_seed(seed)
    gate_up = (2 * torch.randn(rows, 2 * inter, generator=gen)).to(dtype).to(device)
    return _rel(silu_and_mul(gate_up), silu_and_mul_ref(gate_up.float()))


def rotary_store_case(heads: int, kv_heads: int, head_dim: int, tokens: int, block_size: int,
                      dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> float:
    """Rotated q, and the whole pool after the store (padding rows must leave it untouched),
    against RotaryEmbedding + store_kvcache_ref. NaN-equal: unwritten slots stay NaN."""
    from gpu_backend.kernels import rotary_store_kv, store_kvcache_ref
    from gpu_backend.layers import RotaryEmbedding

    gen = torch.Generator().manual_seed(seed)
    rotary = RotaryEmbedding(head_dim, 4096, 1e6).to(device)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    qkv = torch.randn(tokens, q_size + 2 * kv_size, generator=gen).to(dtype).to(device)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.view(tokens, heads, head_dim)
    k = k.view(tokens, kv_heads, head_dim)
    v = v.view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 4096, (tokens,), generator=gen).to(device)
    num_blocks = tokens // block_size + 4
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[::5] = -1  # padding rows
    slots = slots.to(device)
    pool = torch.full((num_blocks, 3, 2, block_size, kv_heads, head_dim), float("nan"),
                      dtype=dtype, device=device)
    expect = pool.clone()
    q_out = rotary_store_kv(q, k, v, positions, rotary.cos_sin, pool[:, 1, 0], pool[:, 1, 1],
                            slots)
    q_ref, k_ref = rotary(positions, q.float(), k.float())
    store_kvcache_ref(k_ref.to(dtype), v, expect[:, 1, 0], expect[:, 1, 1], slots)
    if not torch.equal(pool.isnan(), expect.isnan()):
        return float("inf")  # a slot written that should not be, or one missed
    written = ~expect.isnan()
    return max(_rel(q_out, q_ref), _rel(pool[written], expect[written]))
