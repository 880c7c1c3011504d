"""Byte layout of the elastic KV pool: block shapes, regions and physical handles.

One virtual range holds every KV block; block ``b`` starts at ``b * block_bytes``::

    offset 0                      base_bytes                       total_bytes
    |<- base blocks [0, B) ------->|<- elastic blocks [B, B+E) -->|pad|
    |  base handles, always mapped |  elastic handles, attached / detached on demand
    block b: [num_layers, 2 (K/V), block_size, num_kv_heads, head_dim]

A block's bytes for all layers are contiguous, so the elastic blocks are one contiguous
upper part of the range, and layer ``l``'s K cache is a strided view
``[num_blocks, block_size, num_kv_heads, head_dim]`` with block stride ``block_bytes``.

The boundary ``base_bytes = B * block_bytes`` must be a multiple of the allocation
granularity so the elastic part starts on a handle boundary; the elastic part is cut into
whole handles and holds ``floor(elastic_bytes / block_bytes)`` blocks, the tail is padding
(still usable by activations when the reserve is lent out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1,
               "float8_e5m2": 1, "uint8": 1}


@dataclass(frozen=True)
class KVLayout:
    """Shape of one KV block (all layers, K and V) as the paged attention kernel reads it."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int  # tokens per block
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KVLayout.{name} must be positive, got {getattr(self, name)}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"KVLayout.dtype {self.dtype!r} unknown; use one of {sorted(DTYPE_BYTES)}")

    @property
    def element_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def plane_elements(self) -> int:
        """Elements of K (or V) of one layer in one block: [block_size, num_kv_heads, head_dim]."""
        return self.block_size * self.num_kv_heads * self.head_dim

    @property
    def block_elements(self) -> int:
        return self.num_layers * 2 * self.plane_elements

    @property
    def block_bytes(self) -> int:
        return self.block_elements * self.element_bytes

    @classmethod
    def from_name(cls, name: str, block_size: int = 16) -> KVLayout:
        """Named model shapes, e.g. ``KVLayout.from_name("llama-3.1-8b")`` (2 MiB blocks)."""
        presets = {"llama-3.1-8b": (32, 8, 128), "llama-3.1-70b": (80, 8, 128),
                   "qwen2.5-7b": (28, 4, 128), "tiny": (2, 2, 64)}
        if name not in presets:
            raise ValueError(f"unknown model {name!r}; known: {sorted(presets)}")
        num_layers, num_kv_heads, head_dim = presets[name]
        return cls(num_layers, num_kv_heads, head_dim, block_size)


def check_granular(name: str, value_bytes: int, granularity_bytes: int) -> None:
    """Raise ValueError unless ``value_bytes`` is a positive multiple of the granularity."""
    if value_bytes > 0 and value_bytes % granularity_bytes == 0:
        return
    down = value_bytes // granularity_bytes * granularity_bytes
    up = down + granularity_bytes
    nearest = f"{down} or {up}" if down > 0 else f"{up}"
    raise ValueError(f"{name}={value_bytes} bytes is not a positive multiple of the CUDA "
                     f"allocation granularity ({granularity_bytes} bytes = "
                     f"{granularity_bytes / MIB:g} MiB); nearest valid: {nearest} bytes")


def base_block_quantum(block_bytes: int, granularity_bytes: int) -> int:
    """Smallest block count whose bytes are a multiple of the granularity."""
    return granularity_bytes // math.gcd(granularity_bytes, block_bytes)


def split_into_handles(total_bytes: int, handle_bytes: int) -> tuple[int, ...]:
    """Whole handles of ``handle_bytes`` plus one smaller remainder handle if needed."""
    num_full, remainder = divmod(total_bytes, handle_bytes)
    return (handle_bytes,) * num_full + ((remainder,) if remainder else ())


@dataclass(frozen=True)
class PoolPlan:
    """Validated sizes of every region and handle; pure data, no driver calls."""

    layout: KVLayout
    num_base_blocks: int
    num_elastic_blocks: int
    base_bytes: int
    elastic_bytes: int
    base_handle_sizes: tuple[int, ...]
    elastic_handle_sizes: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        return self.num_base_blocks + self.num_elastic_blocks

    @property
    def total_bytes(self) -> int:
        return self.base_bytes + self.elastic_bytes

    def handle_offsets(self, sizes: tuple[int, ...], start_bytes: int) -> list[int]:
        """Byte offsets of consecutive handles of ``sizes`` starting at ``start_bytes``."""
        offsets, cursor = [], start_bytes
        for size in sizes:
            offsets.append(cursor)
            cursor += size
        return offsets


def plan_pool(layout: KVLayout, num_base_blocks: int, elastic_reserve_bytes: int,
              base_handle_bytes: int, elastic_handle_bytes: int,
              granularity_bytes: int) -> PoolPlan:
    """Check every size against the granularity and cut the regions into handles."""
    check_granular("elastic_handle_bytes", elastic_handle_bytes, granularity_bytes)
    check_granular("base_handle_bytes", base_handle_bytes, granularity_bytes)
    check_granular("elastic_reserve_bytes", elastic_reserve_bytes, granularity_bytes)
    if num_base_blocks < 0:
        raise ValueError(f"num_base_blocks must be >= 0, got {num_base_blocks}")
    quantum = base_block_quantum(layout.block_bytes, granularity_bytes)
    if num_base_blocks % quantum:
        down = num_base_blocks // quantum * quantum
        raise ValueError(
            f"num_base_blocks={num_base_blocks} x block_bytes={layout.block_bytes} does not end on "
            f"the {granularity_bytes}-byte allocation granularity, so the elastic part would not "
            f"start on a handle boundary; use a multiple of {quantum}: nearest valid "
            f"{down} or {down + quantum}")
    num_elastic_blocks = elastic_reserve_bytes // layout.block_bytes
    if num_elastic_blocks == 0:
        raise ValueError(f"elastic_reserve_bytes={elastic_reserve_bytes} holds no whole block of "
                         f"{layout.block_bytes} bytes; reserve at least one block")
    base_bytes = num_base_blocks * layout.block_bytes
    return PoolPlan(layout, num_base_blocks, num_elastic_blocks, base_bytes, elastic_reserve_bytes,
                    split_into_handles(base_bytes, base_handle_bytes),
                    split_into_handles(elastic_reserve_bytes, elastic_handle_bytes))
