"""A plain-tensor KV store with the ElasticKVPool interface, and whole-block copies.

`PlainKVStore` holds every block in one torch tensor laid out exactly as the VMM pool
(`[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]`, see vmm/layout.py). The
engine uses it for the static policy (no elastic range) and for CPU tests; attach/detach only
track state, and a detach poisons the elastic blocks (NaN) so a test catches a table that
kept pointing there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from gpu_backend.vmm.layout import KVLayout, split_into_handles


class PlainKVStore:
    def __init__(self, layout: KVLayout, num_base_blocks: int, num_elastic_blocks: int = 0, *,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
                 elastic_handle_bytes: int | None = None, start_attached: bool = False) -> None:
        self.layout = layout
        self.num_base_blocks = num_base_blocks
        self.num_blocks = num_base_blocks + num_elastic_blocks
        shape = (self.num_blocks, layout.num_layers, 2, layout.block_size, layout.num_kv_heads,
                 layout.head_dim)
        self.buffer = torch.zeros(shape, dtype=dtype, device=device)
        elastic_bytes = num_elastic_blocks * layout.block_bytes
        self.elastic_handle_sizes = split_into_handles(
            elastic_bytes, elastic_handle_bytes or max(elastic_bytes, 1))
        self.num_mapped_handles = len(self.elastic_handle_sizes) if start_attached else 0

    @property
    def attached(self) -> bool:
        return self.num_mapped_handles > 0

    def k_cache(self, layer: int) -> Tensor:
        return self.buffer[:, layer, 0]  # [num_blocks, block_size, num_kv_heads, head_dim]

    def v_cache(self, layer: int) -> Tensor:
        return self.buffer[:, layer, 1]

    def attach(self, num_handles: int | None = None) -> None:
        total = len(self.elastic_handle_sizes)
        num = total if num_handles is None else num_handles
        if not 0 <= num <= total:
            raise ValueError(f"can map 0..{total} elastic handles, not {num}")
        self.num_mapped_handles = max(self.num_mapped_handles, num)

    def detach(self, sync: bool = True) -> None:
        """Poison the elastic blocks (NaN) and forget them. `sync` is the pool's (a tensor
        needs none: the poison is queued behind every kernel already launched)."""
        if self.buffer.is_floating_point():
            self.buffer[self.num_base_blocks:] = float("nan")
        self.num_mapped_handles = 0

    def close(self) -> None:
        self.buffer = self.buffer[:0]


def block_rows(store) -> Tensor:
    """[num_blocks, block_elements] view of the whole pool (all layers of a block in a row)."""
    k0 = store.k_cache(0)
    elements = store.layout.block_elements
    return torch.as_strided(k0, (k0.shape[0], elements), (elements, 1), 0)


def copy_blocks(store, pairs: Sequence[tuple[int, int]]) -> None:
    """Copy whole blocks (every layer, K and V) from src to dst device ids."""
    if not pairs:
        return
    rows = block_rows(store)
    device = rows.device
    src = torch.tensor([s for s, _ in pairs], dtype=torch.int64, device=device)
    dst = torch.tensor([d for _, d in pairs], dtype=torch.int64, device=device)
    rows.index_copy_(0, dst, rows.index_select(0, src))


def mapped_device_blocks(store) -> int:
    """Device blocks backed by memory now: base + elastic blocks inside the mapped handles."""
    sizes = _handle_sizes(store)
    mapped = _num_mapped(store)
    mapped_bytes = sum(sizes[:mapped])
    num_elastic = _num_blocks(store) - _num_base(store)
    return _num_base(store) + min(num_elastic, mapped_bytes // store.layout.block_bytes)


def mapped_elastic_bytes(store) -> int:
    return sum(_handle_sizes(store)[:_num_mapped(store)])


def _handle_sizes(store) -> tuple[int, ...]:
    if isinstance(store, PlainKVStore):
        return store.elastic_handle_sizes
    return store.plan.elastic_handle_sizes


def _num_base(store) -> int:
    return store.num_base_blocks if isinstance(store, PlainKVStore) else store.plan.num_base_blocks


def _num_blocks(store) -> int:
    return store.num_blocks if isinstance(store, PlainKVStore) else store.plan.num_blocks


def mapped_handles(store) -> int:
    """The reserve's handles mapped now (a pool without partial attach: all or none)."""
    return _num_mapped(store)


def _num_mapped(store) -> int:
    if isinstance(store, PlainKVStore):
        return store.num_mapped_handles
    mapped = getattr(store, "num_mapped_handles", None)  # set by a pool with partial attach
    if mapped is not None:
        return mapped
    return len(store.plan.elastic_handle_sizes) if store.attached else 0
