"""Random paged-attention problems shared by the CPU (interpreter) and GPU kernel tests.

A problem stores K/V through the real `store_kvcache` into a strided view of a pool
whose untouched slots are NaN, with shuffled, non-contiguous block tables; the expected
output comes from dense K/V, independent of the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class AttentionProblem:
    q: Tensor  # [T, H, D]
    k_cache: Tensor  # [num_blocks, block_size, KVH, D], strided view of a pool
    v_cache: Tensor
    block_tables: Tensor  # [S, max_blocks] int32
    seq_lens: Tensor  # [S] int32
    query_start_loc: Tensor  # [S+1] int32
    slot_mapping: Tensor  # [T] int64 slots of the new tokens
    new_k: Tensor  # [T, KVH, D] keys of the new tokens
    new_v: Tensor
    dense_k: list[Tensor]  # per sequence [L, KVH, D]
    dense_v: list[Tensor]
    scale: float
    max_query_len: int
    max_seq_len: int


def make_problem(
    query_lens: list[int], prefix_lens: list[int], num_heads: int, num_kv_heads: int,
    head_dim: int, block_size: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0,
    num_layers_in_pool: int = 3, layer: int = 1,
) -> AttentionProblem:
    """K/V of the prefixes are written straight into the cache; the new tokens' K/V are
    returned for the caller to store with the kernel under test."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [p + q for p, q in zip(prefix_lens, query_lens, strict=True)]
    blocks_per_seq = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    max_blocks = max(blocks_per_seq) + 1
    perm = torch.randperm(num_blocks, generator=gen)  # shuffled, non-contiguous blocks
    # pool: [num_blocks, layers, 2, block_size, KVH, D]; one layer's K is a strided view.
    pool = torch.full((num_blocks, num_layers_in_pool, 2, block_size, num_kv_heads, head_dim),
                      float("nan"), dtype=dtype)
    k_cache, v_cache = pool[:, layer, 0], pool[:, layer, 1]
    block_tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    used = 0
    dense_k, dense_v, slots, new_k, new_v = [], [], [], [], []
    for i, (seq_len, nb) in enumerate(zip(seq_lens, blocks_per_seq, strict=True)):
        block_tables[i, :nb] = perm[used:used + nb].int()
        used += nb
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        dense_k.append(k)
        dense_v.append(v)
        pos = torch.arange(seq_len)
        seq_slots = block_tables[i, pos // block_size].long() * block_size + pos % block_size
        prefix = prefix_lens[i]
        prefix_slots = seq_slots[:prefix]
        k_cache[prefix_slots // block_size, prefix_slots % block_size] = k[:prefix]
        v_cache[prefix_slots // block_size, prefix_slots % block_size] = v[:prefix]
        slots.append(seq_slots[prefix:])
        new_k.append(k[prefix:])
        new_v.append(v[prefix:])
    total = sum(query_lens)
    q = torch.randn(total, num_heads, head_dim, generator=gen).to(dtype)
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    pool = pool.to(device)  # views taken after the move keep the pool's strides
    return AttentionProblem(
        q=q.to(device), k_cache=pool[:, layer, 0], v_cache=pool[:, layer, 1],
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=qsl.to(device), slot_mapping=torch.cat(slots).to(device),
        new_k=torch.cat(new_k).to(device), new_v=torch.cat(new_v).to(device),
        dense_k=dense_k, dense_v=dense_v, scale=head_dim ** -0.5,
        max_query_len=max(query_lens), max_seq_len=max(seq_lens),
    )


def dense_reference(pb: AttentionProblem) -> Tensor:
    """float32 causal attention from dense K/V. Returns [T, H, D] float32."""
    num_heads = pb.q.shape[1]
    qsl = pb.query_start_loc.tolist()
    out = torch.zeros(pb.q.shape, dtype=torch.float32)
    for i, (k, v) in enumerate(zip(pb.dense_k, pb.dense_v, strict=True)):
        q = pb.q[qsl[i]:qsl[i + 1]].float().cpu()  # [Q, H, D]
        group = num_heads // k.shape[1]
        k = k.float().repeat_interleave(group, 1)  # [L, H, D]
        v = v.float().repeat_interleave(group, 1)
        seq_len, query_len = k.shape[0], q.shape[0]
        scores = torch.einsum("qhd,khd->hqk", q, k) * pb.scale
        q_pos = seq_len - query_len + torch.arange(query_len)
        visible = torch.arange(seq_len)[None, :] <= q_pos[:, None]
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)
        out[qsl[i]:qsl[i + 1]] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


def rel_error(out: Tensor, ref: Tensor) -> float:
    """max |out - ref| / max |ref| (NaN-propagating)."""
    diff = (out.float().cpu() - ref).abs().max()
    return float(diff / ref.abs().max().clamp_min(1e-6))
