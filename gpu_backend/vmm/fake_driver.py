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
* ``cuMemRelease`` twice on a handle fails and is recorded in ``double_releases``;
* ``cuMemCreate`` fails with ``CUDA_ERROR_OUT_OF_MEMORY`` past ``physical_capacity_bytes``.

Bookkeeping for assertions: ``handles``, ``mappings``, ``reservations``, ``events`` (the
order of syncs and unmaps), ``leaks()``. ``fail_next(call, nth)`` makes the nth next call
of that name fail without side effects, for error-path tests.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

MIB = 1 << 20


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_ALREADY_MAPPED = 208
    CUDA_ERROR_NOT_MAPPED = 211
    CUDA_ERROR_UNKNOWN = 999


class FakeDynamicLibNotFoundError(RuntimeError):
    """Stands in for cuda.pathfinder's DynamicLibNotFoundError (also a RuntimeError)."""


class CUdeviceptr(int):
    """Address of a device allocation; the real one also converts with ``int()``."""


CUmemAllocationType = SimpleNamespace(CU_MEM_ALLOCATION_TYPE_PINNED=1)
CUmemLocationType = SimpleNamespace(CU_MEM_LOCATION_TYPE_DEVICE=1)
CUmemAccess_flags = SimpleNamespace(CU_MEM_ACCESS_FLAGS_PROT_READWRITE=3)
CUmemAllocationGranularity_flags = SimpleNamespace(
    CU_MEM_ALLOC_GRANULARITY_MINIMUM=0, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED=1)


class CUmemAllocationProp:
    def __init__(self) -> None:
        self.type = 0
        self.location = SimpleNamespace(type=0, id=0)


class CUmemAccessDesc:
    def __init__(self) -> None:
        self.flags = 0
        self.location = SimpleNamespace(type=0, id=0)


@dataclass(frozen=True)
class FakeHandle:
    handle_id: int


@dataclass
class HandleRecord:
    size_bytes: int
    num_releases: int = 0


@dataclass
class Mapping:
    size_bytes: int
    handle_id: int
    accessible: bool = False


@dataclass
class _Failure:
    call: str
    countdown: int
    result: CUresult


@dataclass
class FakeCudaDriver:
    """A fake ``cuda.bindings.driver`` for one device; see the module docstring."""

    granularity_bytes: int = 2 * MIB
    physical_capacity_bytes: int | None = None
    no_driver: bool = False
    device_name: bytes = b"Fake GPU"
    handles: dict[int, HandleRecord] = field(default_factory=dict)
    mappings: dict[int, Mapping] = field(default_factory=dict)
    reservations: dict[int, int] = field(default_factory=dict)
    double_releases: list[int] = field(default_factory=list)
    call_counts: Counter = field(default_factory=Counter)
    events: list[tuple[str, int]] = field(default_factory=list)
    primary_ctx_refs: int = 0

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._next_va = 0x7F00_0000_0000
        self._failures: list[_Failure] = []
        self._tls = threading.local()
        for name in ("CUresult", "CUdeviceptr", "CUmemAllocationProp", "CUmemAccessDesc",
                     "CUmemAllocationType", "CUmemLocationType", "CUmemAccess_flags",
                     "CUmemAllocationGranularity_flags"):
            setattr(self, name, globals()[name])

    # -- test controls ----------------------------------------------------------------------

    def fail_next(self, call: str, nth: int = 1,
                  result: CUresult = CUresult.CUDA_ERROR_OUT_OF_MEMORY) -> None:
        """Make the ``nth`` next call of ``call`` (e.g. "cuMemMap") return ``result``."""
        self._failures.append(_Failure(call, nth, result))

    def clear_failures(self) -> None:
        self._failures.clear()

    def live_handle_ids(self) -> set[int]:
        return {hid for hid, rec in self.handles.items() if rec.num_releases == 0}

    def physical_bytes_in_use(self) -> int:
        """Handles keep memory until released *and* unmapped, as on the real driver."""
        mapped = {m.handle_id for m in self.mappings.values()}
        return sum(rec.size_bytes for hid, rec in self.handles.items()
                   if rec.num_releases == 0 or hid in mapped)

    def snapshot(self) -> tuple:
        """Everything observable: mappings with access, live handles, reservations."""
        mappings = tuple(sorted((start, m.size_bytes, m.handle_id, m.accessible)
                                for start, m in self.mappings.items()))
        return mappings, frozenset(self.live_handle_ids()), tuple(sorted(self.reservations.items()))

    def handle_at(self, address: int) -> int | None:
        """Id of the handle mapped at ``address``, or None when nothing is mapped there."""
        for start, mapping in self.mappings.items():
            if start <= address < start + mapping.size_bytes:
                return mapping.handle_id
        return None

    def is_accessible(self, address: int, size_bytes: int) -> bool:
        """True when every byte of the range is mapped with read/write access."""
        end, cursor = address + size_bytes, address
        for start in sorted(self.mappings):
            mapping = self.mappings[start]
            if start <= cursor < start + mapping.size_bytes:
                if not mapping.accessible:
                    return False
                cursor = start + mapping.size_bytes
                if cursor >= end:
                    return True
        return cursor >= end

    def leaks(self) -> list[str]:
        leaks = [f"handle {hid} ({rec.size_bytes} bytes) never released"
                 for hid, rec in self.handles.items() if rec.num_releases == 0]
        leaks += [f"mapping at {start:#x} never unmapped" for start in self.mappings]
        leaks += [f"range at {start:#x} never freed" for start in self.reservations]
        leaks += [f"handle {hid} released twice" for hid in self.double_releases]
        if self.primary_ctx_refs:
            leaks.append(f"primary context retained {self.primary_ctx_refs} time(s) too many")
        return leaks

    # -- helpers ----------------------------------------------------------------------------

    def _enter(self, call: str, needs_context: bool = True) -> CUresult:
        self.call_counts[call] += 1
        for failure in self._failures:
            if failure.call == call:
                failure.countdown -= 1
                if failure.countdown == 0:
                    self._failures.remove(failure)
                    return failure.result
        if needs_context and not getattr(self._tls, "ctx", None):
            return CUresult.CUDA_ERROR_INVALID_CONTEXT
        return CUresult.CUDA_SUCCESS

    def _aligned(self, *values: int) -> bool:
        return all(int(v) % self.granularity_bytes == 0 for v in values)

    def _reservation_of(self, address: int, size_bytes: int) -> int | None:
        for start, size in self.reservations.items():
            if start <= address and address + size_bytes <= start + size:
                return start
        return None

    def _overlaps_mapping(self, address: int, size_bytes: int) -> bool:
        return any(start < address + size_bytes and address < start + m.size_bytes
                   for start, m in self.mappings.items())

    # -- context and device calls -----------------------------------------------------------

    def cuInit(self, flags: int) -> tuple:
        if self.no_driver:
            raise FakeDynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only '
                                              "be found via system search.")
        return (self._enter("cuInit", needs_context=False),)

    def cuDeviceGet(self, ordinal: int) -> tuple:
        err = self._enter("cuDeviceGet", needs_context=False)
        return (err if err or ordinal == 0 else CUresult.CUDA_ERROR_INVALID_VALUE, ordinal)

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple:
        err = self._enter("cuDevicePrimaryCtxRetain", needs_context=False)
        if not err:
            self.primary_ctx_refs += 1
        return (err, f"primary-ctx-{dev}")

    def cuDevicePrimaryCtxRelease(self, dev: int) -> tuple:
        err = self._enter("cuDevicePrimaryCtxRelease", needs_context=False)
        if not err:
            self.primary_ctx_refs -= 1
        return (err,)

    def cuCtxSetCurrent(self, ctx: Any) -> tuple:
        err = self._enter("cuCtxSetCurrent", needs_context=False)
        if not err:
            self._tls.ctx = ctx
        return (err,)

    def cuCtxSynchronize(self) -> tuple:
        err = self._enter("cuCtxSynchronize")
        if not err:
            self.events.append(("sync", 0))
        return (err,)

    def cuStreamSynchronize(self, stream: Any) -> tuple:
        err = self._enter("cuStreamSynchronize")
        if not err:
            self.events.append(("sync", int(stream)))
        return (err,)

    def cuGetErrorName(self, error: Any) -> tuple:
        return (CUresult.CUDA_SUCCESS, CUresult(int(error)).name.encode())

    def cuDriverGetVersion(self) -> tuple:
        return (self._enter("cuDriverGetVersion", needs_context=False), 13000)

    def cuDeviceGetName(self, length: int, dev: int) -> tuple:
        return (self._enter("cuDeviceGetName", needs_context=False), self.device_name[:length])

    # -- virtual memory calls ---------------------------------------------------------------

    def cuMemGetAllocationGranularity(self, prop: Any, option: Any) -> tuple:
        return (self._enter("cuMemGetAllocationGranularity"), self.granularity_bytes)

    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple:
        err = self._enter("cuMemCreate")
        if err:
            return (err, None)
        if size <= 0 or not self._aligned(size):
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        capacity = self.physical_capacity_bytes
        if capacity is not None and self.physical_bytes_in_use() + size > capacity:
            return (CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        handle_id = next(self._ids)
        self.handles[handle_id] = HandleRecord(size)
        return (CUresult.CUDA_SUCCESS, FakeHandle(handle_id))

    def cuMemRelease(self, handle: FakeHandle) -> tuple:
        err = self._enter("cuMemRelease")
        record = self.handles.get(handle.handle_id)
        if err or record is None:
            return (err or CUresult.CUDA_ERROR_INVALID_VALUE,)
        if record.num_releases:
            self.double_releases.append(handle.handle_id)
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        record.num_releases += 1
        return (CUresult.CUDA_SUCCESS,)

    def cuMemAddressReserve(self, size: int, alignment: int, addr: Any, flags: int) -> tuple:
        err = self._enter("cuMemAddressReserve")
        if err or size <= 0 or not self._aligned(size):
            return (err or CUresult.CUDA_ERROR_INVALID_VALUE, CUdeviceptr(0))
        align = max(int(alignment), self.granularity_bytes)
        start = -(-self._next_va // align) * align
        self._next_va = start + size + self.granularity_bytes  # leave a guard gap
        self.reservations[start] = size
        return (CUresult.CUDA_SUCCESS, CUdeviceptr(start))

    def cuMemAddressFree(self, ptr: Any, size: int) -> tuple:
        err = self._enter("cuMemAddressFree")
        start = int(ptr)
        if err or self.reservations.get(start) != size or self._overlaps_mapping(start, size):
            return (err or CUresult.CUDA_ERROR_INVALID_VALUE,)
        del self.reservations[start]
        return (CUresult.CUDA_SUCCESS,)

    def cuMemMap(self, ptr: Any, size: int, offset: int, handle: FakeHandle, flags: int) -> tuple:
        err = self._enter("cuMemMap")
        address = int(ptr)
        record = self.handles.get(handle.handle_id)
        if err:
            return (err,)
        if (record is None or record.num_releases or not self._aligned(address, size, offset)
                or offset + size > record.size_bytes
                or self._reservation_of(address, size) is None):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        if self._overlaps_mapping(address, size):
            return (CUresult.CUDA_ERROR_ALREADY_MAPPED,)
        self.mappings[address] = Mapping(size, handle.handle_id)
        return (CUresult.CUDA_SUCCESS,)

    def cuMemUnmap(self, ptr: Any, size: int) -> tuple:
        err = self._enter("cuMemUnmap")
        address = int(ptr)
        if err:
            return (err,)
        covered = [s for s, m in self.mappings.items() if address <= s < address + size]
        if not covered or sum(self.mappings[s].size_bytes for s in covered) != size \
                or min(covered) != address:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        for start in covered:
            del self.mappings[start]
        self.events.append(("unmap", address))
        return (CUresult.CUDA_SUCCESS,)

    def cuMemSetAccess(self, ptr: Any, size: int, desc: list, count: int) -> tuple:
        err = self._enter("cuMemSetAccess")
        address = int(ptr)
        if err:
            return (err,)
        inside = [m for s, m in self.mappings.items() if address <= s < address + size]
        if count != len(desc) or sum(m.size_bytes for m in inside) != size:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        for mapping in inside:
            mapping.accessible = True
        return (CUresult.CUDA_SUCCESS,)
