"""In-process fake of the CUDA driver's virtual-memory calls, for tests without a GPU.

:class:`FakeCudaDriver` has the attributes of ``cuda.bindings.driver`` that the pool uses,
with the same call signatures and the same return convention (a tuple whose first
element is a ``CUresult``), and it enforces the rules the real driver enforces or that
would crash a real process:

* sizes and addresses are multiples of the granularity; a mapping lies inside one
  reservation, never overlaps another mapping, and fits its handle;
* ``cuMemUnmap`` covers whole mappings only; ``cuMemAddressFree`` needs the range unmapped;
* ``cuMemSetAccess`` only on fully mapped ranges; memory calls need a current context in
  the calling thread (``cuCtxSetCurrent``);
* a handle holds references: one from ``cuMemCreate``, one more per
  ``cuMemRetainAllocationHandle``; ``cuMemRelease`` past the last one fails and is recorded
  in ``double_releases``; ``cuMemCreate`` fails with ``CUDA_ERROR_OUT_OF_MEMORY`` past
  ``physical_capacity_bytes``.

Bookkeeping for assertions: ``handles``, ``mappings``, ``reservations``, ``events`` (the
order of syncs and unmaps), ``call_log`` (every call's name, in order), ``leaks()``.

Faults and hooks, counted in calls from now (1 = the next call): ``fail_next(call, nth)``
fails the nth next call of that name, ``fail_at(n)`` the nth next call of any name, either
without side effects or, with ``after_effect=True``, after acting (a driver that did the work
and still reported an error). ``at_call(n, hook)`` runs ``hook(call_name)`` inside the nth next
call, after its effect and before it returns, where a signal arriving during the real C call
would be handled; ``on_every_call(hook)`` runs it inside every call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_backend.vmm.fake_state import (  # noqa: F401 - attributes of the fake module
    MIB,
    READWRITE,
    CUdeviceptr,
    CUmemAccess_flags,
    CUmemAccessDesc,
    CUmemAllocationGranularity_flags,
    CUmemAllocationProp,
    CUmemAllocationType,
    CUmemLocation,
    CUmemLocationType,
    CUresult,
    FakeDeviceState,
    FakeDynamicLibNotFoundError,
    FakeHandle,
    HandleRecord,
    Mapping,
)

_TYPES = ("CUresult", "CUdeviceptr", "CUmemAllocationProp", "CUmemAccessDesc", "CUmemLocation",
          "CUmemAllocationType", "CUmemLocationType", "CUmemAccess_flags",
          "CUmemAllocationGranularity_flags")


def _driver_call(num_payload: int, needs_context: bool = True) -> Callable:
    """Route a fake call through :meth:`FakeCudaDriver._call` (counting, faults, hooks)."""
    def wrap(impl: Callable[..., tuple]) -> Callable[..., tuple]:
        @functools.wraps(impl)
        def call(self: FakeCudaDriver, *args: Any) -> tuple:
            return self._call(impl.__name__, num_payload, needs_context, lambda: impl(self, *args))
        return call
    return wrap


@dataclass
class FakeCudaDriver(FakeDeviceState):
    """A fake ``cuda.bindings.driver`` for one device; see the module docstring."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in _TYPES:
            setattr(self, name, globals()[name])

    def _call(self, call: str, num_payload: int, needs_context: bool,
              act: Callable[[], tuple]) -> tuple:
        self.call_counts[call] += 1
        self.call_log.append(call)
        hooks = self._hooks.pop(len(self.call_log), []) + self._every_call
        fault = self._take_fault(call)
        if fault is not None and not fault.after_effect:
            result: tuple = (fault.result,) + (None,) * num_payload
        elif needs_context and not getattr(self._tls, "ctx", None):
            result = (CUresult.CUDA_ERROR_INVALID_CONTEXT,) + (None,) * num_payload
        else:
            result = act()
            if fault is not None and result[0] == CUresult.CUDA_SUCCESS:
                result = (fault.result,) + (None,) * num_payload
        for hook in hooks:
            hook(call)
        return result

    # -- context and device ----------------------------------------------------------------

    def cuInit(self, flags: int) -> tuple:
        if self.no_driver:
            raise FakeDynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only '
                                              "be found via system search.")
        return self._call("cuInit", 0, False, lambda: (CUresult.CUDA_SUCCESS,))

    @_driver_call(1, needs_context=False)
    def cuDeviceGet(self, ordinal: int) -> tuple:
        return (CUresult.CUDA_SUCCESS if ordinal == 0 else CUresult.CUDA_ERROR_INVALID_VALUE, ordinal)

    @_driver_call(1, needs_context=False)
    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple:
        self.primary_ctx_refs += 1
        return (CUresult.CUDA_SUCCESS, f"primary-ctx-{dev}")

    @_driver_call(0, needs_context=False)
    def cuDevicePrimaryCtxRelease(self, dev: int) -> tuple:
        self.primary_ctx_refs -= 1
        return (CUresult.CUDA_SUCCESS,)

    @_driver_call(0, needs_context=False)
    def cuCtxSetCurrent(self, ctx: Any) -> tuple:
        self._tls.ctx = ctx
        return (CUresult.CUDA_SUCCESS,)

    @_driver_call(0)
    def cuCtxSynchronize(self) -> tuple:
        self.events.append(("sync", 0))
        return (CUresult.CUDA_SUCCESS,)

    @_driver_call(0)
    def cuStreamSynchronize(self, stream: Any) -> tuple:
        self.events.append(("sync", int(stream)))
        return (CUresult.CUDA_SUCCESS,)

    def cuGetErrorName(self, error: Any) -> tuple:
        return (CUresult.CUDA_SUCCESS, CUresult(int(error)).name.encode())

    @_driver_call(1, needs_context=False)
    def cuDriverGetVersion(self) -> tuple:
        return (CUresult.CUDA_SUCCESS, 13000)

    @_driver_call(1, needs_context=False)
    def cuDeviceGetName(self, length: int, dev: int) -> tuple:
        return (CUresult.CUDA_SUCCESS, self.device_name[:length])

    # -- virtual memory calls ---------------------------------------------------------------

    @_driver_call(1)
    def cuMemGetAllocationGranularity(self, prop: Any, option: Any) -> tuple:
        return (CUresult.CUDA_SUCCESS, self.granularity_bytes)

    @_driver_call(1)
    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple:
        if size <= 0 or not self._aligned(size):
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        capacity = self.physical_capacity_bytes
        if capacity is not None and self.physical_bytes_in_use() + size > capacity:
            return (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        handle_id = next(self._ids)
        self.handles[handle_id] = HandleRecord(size)
        return (CUresult.CUDA_SUCCESS, FakeHandle(handle_id))

    @_driver_call(0)
    def cuMemRelease(self, handle: FakeHandle) -> tuple:
        record = self.handles.get(handle.handle_id)
        if record is None:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        if record.num_refs == 0:
            self.double_releases.append(handle.handle_id)
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        record.num_refs -= 1
        record.num_releases += 1
        return (CUresult.CUDA_SUCCESS,)

    @_driver_call(1)
    def cuMemRetainAllocationHandle(self, ptr: Any) -> tuple:
        start = self._mapping_at(int(ptr))
        if start is None:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        handle_id = self.mappings[start].handle_id
        self.handles[handle_id].num_refs += 1
        return (CUresult.CUDA_SUCCESS, FakeHandle(handle_id))

    @_driver_call(1)
    def cuMemGetAccess(self, location: Any, ptr: Any) -> tuple:
        start = self._mapping_at(int(ptr))
        if start is None:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        return (CUresult.CUDA_SUCCESS, READWRITE if self.mappings[start].accessible else 0)

    @_driver_call(1)
    def cuMemAddressReserve(self, size: int, alignment: int, addr: Any, flags: int) -> tuple:
        if size <= 0 or not self._aligned(size):
            return (CUresult.CUDA_ERROR_INVALID_VALUE, CUdeviceptr(0))
        align = max(int(alignment), self.granularity_bytes)
        start = -(-self._next_va // align) * align
        self._next_va = start + size + self.granularity_bytes  # leave a guard gap
        self.reservations[start] = size
        return (CUresult.CUDA_SUCCESS, CUdeviceptr(start))

    @_driver_call(0)
    def cuMemAddressFree(self, ptr: Any, size: int) -> tuple:
        start = int(ptr)
        if self.reservations.get(start) != size or self._overlaps_mapping(start, size):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        del self.reservations[start]
        return (CUresult.CUDA_SUCCESS,)

    @_driver_call(0)
    def cuMemMap(self, ptr: Any, size: int, offset: int, handle: FakeHandle, flags: int) -> tuple:
        address = int(ptr)
        record = self.handles.get(handle.handle_id)
        if (record is None or record.num_refs == 0 or not self._aligned(address, size, offset)
                or offset + size > record.size_bytes
                or self._reservation_of(address, size) is None):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        if self._overlaps_mapping(address, size):
            return (CUresult.CUDA_ERROR_ALREADY_MAPPED,)
        self.mappings[address] = Mapping(size, handle.handle_id)
        return (CUresult.CUDA_SUCCESS,)

    @_driver_call(0)
    def cuMemUnmap(self, ptr: Any, size: int) -> tuple:
        address = int(ptr)
        covered = [s for s, m in self.mappings.items() if address <= s < address + size]
        if not covered or sum(self.mappings[s].size_bytes for s in covered) != size \
                or min(covered) != address:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        for start in covered:
            del self.mappings[start]
        self.events.append(("unmap", address))
        return (CUresult.CUDA_SUCCESS,)

    @_driver_call(0)
    def cuMemSetAccess(self, ptr: Any, size: int, desc: list, count: int) -> tuple:
        address = int(ptr)
        inside = [m for s, m in self.mappings.items() if address <= s < address + size]
        if count != len(desc) or sum(m.size_bytes for m in inside) != size:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        for mapping in inside:
            mapping.accessible = True
        return (CUresult.CUDA_SUCCESS,)
