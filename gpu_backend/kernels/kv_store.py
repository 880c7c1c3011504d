"""Triton kernel that writes new keys and values into the paged KV cache.

Cache layout per layer (one block = `block_size` consecutive token slots):

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    slot = block_id * block_size + offset_in_block

The caches may be strided views into a larger pool (all layers of one block stored
together), so dim 0 may have any stride; only the last dim must be contiguous.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from gpu_backend.kernels.checks import check_cache_pair, check_same_device


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch,
    stride_vcb, stride_vcs, stride_vch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    KVH_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding token of a fixed-shape batch: nothing to store
        return
    block_id = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, KVH_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    # tiles: [KVH_PAD, HEAD_DIM_PAD]
    k = tl.load(k_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :],
                mask=mask)
    v = tl.load(v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :],
                mask=mask)
    k_dst = block_id * stride_kcb + offset * stride_kcs
    v_dst = block_id * stride_vcb + offset * stride_vcs
    tl.store(k_cache_ptr + k_dst + offs_h[:, None] * stride_kch + offs_d[None, :], k, mask=mask)
    tl.store(v_cache_ptr + v_dst + offs_h[:, None] * stride_vch + offs_d[None, :], v, mask=mask)


def store_kvcache(
    k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """Scatter k, v `[T, KVH, D]` into `k_cache`, `v_cache` at `slot_mapping` `[T]`.

    Negative slots are skipped, so padded rows of a CUDA-graph batch never write into a
    block (a detached elastic range must never be touched). Slot values are not
    range-checked here: that would need a host sync.
    """
    check_cache_pair(k_cache, v_cache)
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    for name, x in (("k", k), ("v", v)):
        if x.dim() != 3 or x.shape[1:] != (num_kv_heads, head_dim):
            raise ValueError(
                f"{name} must be [T, {num_kv_heads}, {head_dim}] to match the cache, "
                f"got {tuple(x.shape)}"
            )
        if x.dtype != k_cache.dtype:
            raise ValueError(f"{name} dtype {x.dtype} != cache dtype {k_cache.dtype}")
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim, strides {x.stride()}")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k has {k.shape[0]} tokens but v has {v.shape[0]}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(f"slot_mapping must be [{k.shape[0]}], got {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype.is_floating_point or slot_mapping.dtype.itemsize not in (4, 8):
        raise ValueError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        KVH_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        num_warps=4,
    )
