"""Argument checks shared by the kernel launchers (run before every launch).

They read only shapes, dtypes, strides and devices, never tensor values, so they cost no
host sync and stay valid inside CUDA-graph capture.
"""

from __future__ import annotations

import torch
from torch import Tensor

SUPPORTED_BLOCK_SIZES = (16, 32, 64)
SUPPORTED_CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_cache_pair(k_cache: Tensor, v_cache: Tensor) -> None:
    """Both caches `[num_blocks, block_size, KVH, D]`, same shape and dtype, last dim dense."""
    if k_cache.dim() != 4:
        raise ValueError(
            f"k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(
            f"v_cache {tuple(v_cache.shape)} {v_cache.dtype} must match "
            f"k_cache {tuple(k_cache.shape)} {k_cache.dtype}"
        )
    if k_cache.shape[1] not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(
            f"block_size {k_cache.shape[1]} unsupported; use one of {SUPPORTED_BLOCK_SIZES}"
        )
    if k_cache.dtype not in SUPPORTED_CACHE_DTYPES:
        raise ValueError(f"cache dtype {k_cache.dtype} unsupported; use fp16, bf16 or fp32")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.stride(-1) != 1:
            raise ValueError(
                f"{name} must be contiguous in head_dim (stride 1), strides {cache.stride()}"
            )


def check_same_device(**tensors: Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


def check_int_tensor(name: str, x: Tensor, dims: int) -> None:
    if x.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims, got shape {tuple(x.shape)}")
    if x.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32 or int64, got {x.dtype}")
