"""State and test controls of the fake CUDA driver, and stand-ins for the driver's types.

See :mod:`gpu_backend.vmm.fake_driver` for the calls themselves and the rules they enforce.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

MIB = 1 << 20
READWRITE = 3


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
CUmemAccess_flags = SimpleNamespace(CU_MEM_ACCESS_FLAGS_PROT_NONE=0,
                                    CU_MEM_ACCESS_FLAGS_PROT_READWRITE=READWRITE)
CUmemAllocationGranularity_flags = SimpleNamespace(
    CU_MEM_ALLOC_GRANULARITY_MINIMUM=0, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED=1)


class CUmemLocation:
    def __init__(self) -> None:
        self.type = 0
        self.id = 0


class CUmemAllocationProp:
    def __init__(self) -> None:
        self.type = 0
        self.location = CUmemLocation()


class CUmemAccessDesc:
    def __init__(self) -> None:
        self.flags = 0
        self.location = CUmemLocation()


@dataclass(frozen=True)
class FakeHandle:
    """An allocation handle; like the real one, ``int()`` gives its value."""

    handle_id: int

    def __int__(self) -> int:
        return self.handle_id


@dataclass
class HandleRecord:
    size_bytes: int
    num_refs: int = 1
    num_releases: int = 0


@dataclass
class Mapping:
    size_bytes: int
    handle_id: int
    accessible: bool = False


@dataclass
class _Fault:
    call: str | None  # None: any call
    countdown: int
    result: CUresult
    after_effect: bool


Hook = Callable[[str], None]


@dataclass
class FakeDeviceState:
    """Handles, mappings and reservations of one fake device, plus faults and hooks to come."""

    granularity_bytes: int = 2 * MIB
    physical_capacity_bytes: int | None = None
    no_driver: bool = False
    device_name: bytes = b"Fake GPU"
    handles: dict[int, HandleRecord] = field(default_factory=dict)
    mappings: dict[int, Mapping] = field(default_factory=dict)
    reservations: dict[int, int] = field(default_factory=dict)
    double_releases: list[int] = field(default_factory=list)
    call_counts: Counter = field(default_factory=Counter)
    call_log: list[str] = field(default_factory=list)
    events: list[tuple[str, int]] = field(default_factory=list)
    primary_ctx_refs: int = 0

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._next_va = 0x7F00_0000_0000
        self._faults: list[_Fault] = []
        self._hooks: defaultdict[int, list[Hook]] = defaultdict(list)
        self._every_call: list[Hook] = []
        self._tls = threading.local()

    # -- test controls ----------------------------------------------------------------------

    def fail_next(self, call: str, nth: int = 1,
                  result: CUresult = CUresult.CUDA_ERROR_OUT_OF_MEMORY,
                  after_effect: bool = False) -> None:
        """Make the ``nth`` next call of ``call`` (e.g. "cuMemMap") return ``result``."""
        self._faults.append(_Fault(call, nth, result, after_effect))

    def fail_at(self, nth: int, result: CUresult = CUresult.CUDA_ERROR_OUT_OF_MEMORY,
                after_effect: bool = False) -> None:
        """Make the ``nth`` next driver call, whatever its name, return ``result``."""
        self._faults.append(_Fault(None, nth, result, after_effect))

    def clear_failures(self) -> None:
        self._faults.clear()

    def at_call(self, nth: int, hook: Hook) -> None:
        """Run ``hook(call_name)`` inside the ``nth`` next call, after its effect."""
        self._hooks[len(self.call_log) + nth].append(hook)

    def on_every_call(self, hook: Hook) -> None:
        """Run ``hook(call_name)`` inside every call from now on (e.g. to make calls slow)."""
        self._every_call.append(hook)

    def live_handle_ids(self) -> set[int]:
        return {hid for hid, rec in self.handles.items() if rec.num_refs > 0}

    def physical_bytes_in_use(self) -> int:
        """Handles keep memory until released *and* unmapped, as on the real driver."""
        mapped = {m.handle_id for m in self.mappings.values()}
        return sum(rec.size_bytes for hid, rec in self.handles.items()
                   if rec.num_refs > 0 or hid in mapped)

    def snapshot(self) -> tuple:
        """Everything observable: mappings with access, live handles, reservations."""
        mappings = tuple(sorted((start, m.size_bytes, m.handle_id, m.accessible)
                                for start, m in self.mappings.items()))
        return mappings, frozenset(self.live_handle_ids()), tuple(sorted(self.reservations.items()))

    def handle_at(self, address: int) -> int | None:
        """Id of the handle mapped at ``address``, or None when nothing is mapped there."""
        start = self._mapping_at(address)
        return None if start is None else self.mappings[start].handle_id

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
        leaks = [f"handle {hid} ({rec.size_bytes} bytes) never released ({rec.num_refs} ref(s))"
                 for hid, rec in self.handles.items() if rec.num_refs > 0]
        leaks += [f"mapping at {start:#x} never unmapped" for start in self.mappings]
        leaks += [f"range at {start:#x} never freed" for start in self.reservations]
        leaks += [f"handle {hid} released twice" for hid in self.double_releases]
        if self.primary_ctx_refs:
            leaks.append(f"primary context retained {self.primary_ctx_refs} time(s) too many")
        return leaks

    # -- helpers ----------------------------------------------------------------------------

    def _take_fault(self, call: str) -> _Fault | None:
        """The fault due at this call; another one due too stays for the next matching call."""
        due = None
        for fault in list(self._faults):
            if fault.call in (None, call):
                fault.countdown -= 1
                if fault.countdown == 0 and due is None:
                    self._faults.remove(fault)
                    due = fault
                elif fault.countdown == 0:
                    fault.countdown = 1
        return due

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

    def _mapping_at(self, address: int) -> int | None:
        for start, mapping in self.mappings.items():
            if start <= address < start + mapping.size_bytes:
                return start
