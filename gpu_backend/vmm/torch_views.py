"""Zero-copy torch tensors over raw device addresses of the VMM pool.

torch has no public "storage from a device pointer" call, but ``torch.as_tensor`` accepts any
object exposing ``__cuda_array_interface__`` and wraps its pointer without copying. torch asks
the driver which device owns the pointer when the tensor is made, so it must be mapped then;
afterwards the tensor is only an address, valid whenever the range is mapped again.
torch is imported lazily so the pool itself imports without it.
"""

from __future__ import annotations

from typing import Any

from gpu_backend.vmm.layout import KVLayout


class DeviceBytes:
    """``__cuda_array_interface__`` (v3) of ``size_bytes`` raw bytes at a device address."""

    def __init__(self, address: int, size_bytes: int) -> None:
        self.address = address
        self.size_bytes = size_bytes

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.size_bytes,), "typestr": "|u1", "data": (self.address, False),
                "strides": None, "version": 3, "stream": None}


def byte_tensor(address: int, size_bytes: int, device_ordinal: int) -> Any:
    """A torch uint8 tensor aliasing ``[address, address + size_bytes)`` on the device."""
    import torch

    tensor = torch.as_tensor(DeviceBytes(address, size_bytes), device=f"cuda:{device_ordinal}")
    if tensor.data_ptr() != address:
        raise RuntimeError(f"torch copied the pool memory ({tensor.data_ptr():#x} != {address:#x})")
    return tensor


def layer_view(pool_bytes: Any, layout: KVLayout, num_blocks: int, layer: int, kv_index: int) -> Any:
    """K (``kv_index`` 0) or V (1) cache of one layer: ``[num_blocks, block_size, heads, head_dim]``.

    The pool is ``[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]``; the view's
    block stride is a whole block (all layers), so ``k_cache(layer)[block_id]`` indexes the pool
    directly and a paged kernel needs only the block table and this stride.
    """
    import torch

    if not 0 <= layer < layout.num_layers:
        raise IndexError(f"layer {layer} out of range [0, {layout.num_layers})")
    typed = pool_bytes.view(getattr(torch, layout.dtype))
    heads, dim = layout.num_kv_heads, layout.head_dim
    return torch.as_strided(
        typed,
        size=(num_blocks, layout.block_size, heads, dim),
        stride=(layout.block_elements, heads * dim, dim, 1),
        storage_offset=(layer * 2 + kv_index) * layout.plane_elements,
    )


class TensorCache:
    """Views built once and reused: the pool's addresses never change, so neither do they."""

    def __init__(self, layout: KVLayout, num_blocks: int, device_ordinal: int) -> None:
        self.layout = layout
        self.num_blocks = num_blocks
        self.device_ordinal = device_ordinal
        self._pool_bytes: Any = None
        self._layers: dict[tuple[int, int], Any] = {}
        self._arena: Any = None

    def layer(self, kv_address: int, kv_size_bytes: int, layer: int, kv_index: int) -> Any:
        if self._pool_bytes is None:
            self._pool_bytes = byte_tensor(kv_address, kv_size_bytes, self.device_ordinal)
        key = (layer, kv_index)
        if key not in self._layers:
            self._layers[key] = layer_view(self._pool_bytes, self.layout, self.num_blocks,
                                           layer, kv_index)
        return self._layers[key]

    def arena(self, address: int, size_bytes: int) -> Any:
        if self._arena is None:
            self._arena = byte_tensor(address, size_bytes, self.device_ordinal)
        return self._arena

    def clear(self) -> None:
        self._pool_bytes = self._arena = None
        self._layers.clear()
