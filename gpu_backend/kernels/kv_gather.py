"""Copy a run of one sequence's K and V blocks out of the paged cache, in one launch.

SPLIT attention (split_attention.py) hands cuDNN's SDPA contiguous keys: a sequence's blocks
`table_row[first : first + num_blocks]` of a layer's caches

    k_cache, v_cache: [num_blocks_in_pool, block_size, KVH, D]   (block stride any: a block
                                                                  of the pool holds every
                                                                  layer, vmm/layout.py)
    k_out, v_out:     [>= num_blocks, block_size, KVH, D]        contiguous

copied block by block, K and V by the same program, the token slots from `valid_tokens` on
written as zeros (a slot past a sequence's context may hold anything, NaN included, and a
pad key must stay finite). Two `index_select`s and two `zero_`s did this before: four
launches where one does, and SPLIT runs it for the square and each prefix segment of every
sequence in every layer.

One program copies BLOCK elements of one block plane (a plane, [block_size, KVH, D], is
contiguous in the cache); the grid is (num_blocks, planes' elements / BLOCK).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from gpu_backend.kernels.checks import check_cache_pair, check_same_device

COPY_BLOCK = 4096  # elements one program copies (8 KiB of bf16 per K and per V)


@triton.jit
def _gather_kv_kernel(
    k_cache_ptr, v_cache_ptr, k_out_ptr, v_out_ptr, table_ptr, first, valid_elements,
    s_kb, s_vb, s_kob, s_vob,
    PLANE: tl.constexpr, BLOCK: tl.constexpr,
):
    j = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_plane = offs < PLANE
    keep = in_plane & (j * PLANE + offs < valid_elements)
    src = tl.load(table_ptr + first + j).to(tl.int64)
    k = tl.load(k_cache_ptr + src * s_kb + offs, mask=keep, other=0.0)
    v = tl.load(v_cache_ptr + src * s_vb + offs, mask=keep, other=0.0)
    tl.store(k_out_ptr + j * s_kob + offs, k, mask=in_plane)
    tl.store(v_out_ptr + j * s_vob + offs, v, mask=in_plane)


def _check_plane(name: str, x: Tensor) -> None:
    _, block_size, num_kv_heads, head_dim = x.shape
    if x.stride()[1:] != (num_kv_heads * head_dim, head_dim, 1):
        raise ValueError(f"{name} {tuple(x.shape)} strides {x.stride()}: each block must be "
                         "one contiguous [block_size, KVH, D] plane")


def gather_kv(k_cache: Tensor, v_cache: Tensor, table_row: Tensor, first: int,
              num_blocks: int, valid_tokens: int, k_out: Tensor, v_out: Tensor) -> None:
    """Blocks table_row[first : first + num_blocks] of both caches into k_out, v_out
    [:num_blocks], token slots from `valid_tokens` on (counted from the first block's first
    slot) as zeros. Only shapes are checked, so no host sync: the table's block ids are
    trusted, as the attention kernels trust them."""
    check_cache_pair(k_cache, v_cache)
    check_cache_pair(k_out, v_out)
    check_same_device(k_cache=k_cache, k_out=k_out, table_row=table_row)
    block_size = k_cache.shape[1]
    if k_out.shape[1:] != k_cache.shape[1:] or k_out.dtype != k_cache.dtype:
        raise ValueError(f"gather into {tuple(k_out.shape)} {k_out.dtype} from a cache "
                         f"{tuple(k_cache.shape)} {k_cache.dtype}: blocks must match")
    if table_row.dim() != 1 or table_row.stride(0) != 1:
        raise ValueError(f"table_row must be one contiguous row, got {tuple(table_row.shape)}")
    if not (0 <= first and first + num_blocks <= table_row.shape[0]
            and num_blocks <= k_out.shape[0] and 0 <= valid_tokens):
        raise ValueError(f"gather of blocks [{first}, {first + num_blocks}) of a "
                         f"{table_row.shape[0]}-block row into a {k_out.shape[0]}-block buffer")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k_out", k_out),
                    ("v_out", v_out)):
        _check_plane(name, x)
    if num_blocks == 0:
        return
    plane = block_size * k_cache.shape[2] * k_cache.shape[3]
    block = min(COPY_BLOCK, triton.next_power_of_2(plane))
    grid = (num_blocks, triton.cdiv(plane, block))
    _gather_kv_kernel[grid](
        k_cache, v_cache, k_out, v_out, table_row, first,
        min(valid_tokens, num_blocks * block_size) * plane // block_size,
        k_cache.stride(0), v_cache.stride(0), k_out.stride(0), v_out.stride(0),
        PLANE=plane, BLOCK=block, num_warps=4)
