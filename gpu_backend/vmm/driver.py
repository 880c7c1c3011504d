"""Thin, checked wrapper over the CUDA driver's virtual-memory calls.

Every call in ``cuda.bindings.driver`` returns a tuple whose first element is a
``CUresult``. :class:`VmmDriver` checks it and raises :class:`VmmError` naming the
call, so the pool never handles raw result codes. The wrapped object is any module
with the same call signatures: the real ``cuda.bindings.driver`` (default) or
:mod:`gpu_backend.vmm.fake_driver` in tests.

Why the context dance: the driver binds a context per CPU thread. The pool shares
the device's *primary* context with PyTorch (the runtime API uses it too), retains it
once (``cuDevicePrimaryCtxRetain``) and makes it current (``cuCtxSetCurrent``) the
first time each thread calls in, tracked in a ``threading.local``.

Pointers cross this interface as plain ``int`` addresses; handles are opaque.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from gpu_backend.vmm.errors import NoDriverError, VmmError
from gpu_backend.vmm.signals import defer_signals

_NO_DRIVER_HINT = (
    "no NVIDIA driver is present on this machine (libcuda could not be loaded); "
    "the elastic KV pool needs a CUDA GPU, use gpu_backend.vmm.fake_driver for tests"
)


def load_cuda_driver() -> ModuleType:
    """Return ``cuda.bindings.driver`` or raise :class:`NoDriverError` if cuda-python is missing."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise NoDriverError("import cuda.bindings.driver", "ImportError",
                            f"cuda-python is not installed ({exc})") from exc
    return driver


class VmmDriver:
    """Checked driver calls for one device, bound to its primary context."""

    def __init__(self, cuda: Any = None, device_ordinal: int = 0) -> None:
        self.cuda = load_cuda_driver() if cuda is None else cuda
        self.device_ordinal = device_ordinal
        self._tls = threading.local()
        self._context_retained = False
        try:
            with defer_signals():
                self._open()
        except BaseException:
            with defer_signals(), contextlib.suppress(Exception):
                self.release_context()  # the failure is the error to report
            raise

    def _open(self) -> None:
        """Initialise the driver, retain the primary context, make it current, read the
        granularity (the context reference is recorded the moment it is taken)."""
        self._init_driver()
        self.device = self._check("cuDeviceGet", self.cuda.cuDeviceGet(self.device_ordinal))
        self.context = self._check("cuDevicePrimaryCtxRetain",
                                   self.cuda.cuDevicePrimaryCtxRetain(self.device))
        self._context_retained = True
        self.ensure_context()
        self.granularity_bytes = int(self._check(
            "cuMemGetAllocationGranularity",
            self.cuda.cuMemGetAllocationGranularity(
                self._allocation_prop(),
                self.cuda.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))

    # -- plumbing -------------------------------------------------------------------------

    def _init_driver(self) -> None:
        try:
            result = self.cuda.cuInit(0)
        except (RuntimeError, OSError) as exc:  # DynamicLibNotFoundError is a RuntimeError
            raise NoDriverError("cuInit", type(exc).__name__, _NO_DRIVER_HINT) from exc
        name = self._result_name(result[0])
        if int(result[0]) != 0:
            if name in ("CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_NOT_INITIALIZED"):
                raise NoDriverError("cuInit", name, "no CUDA device is visible")
            raise VmmError("cuInit", name)

    def _result_name(self, result: Any) -> str:
        try:
            err, name = self.cuda.cuGetErrorName(result)
        except Exception:  # noqa: BLE001 - naming the error must never mask it
            return f"CUresult {int(result)}"
        if int(err) != 0:
            return f"CUresult {int(result)}"
        return name.decode() if isinstance(name, bytes) else str(name)

    def _check(self, call: str, result: tuple, detail: str = "") -> Any:
        """Raise VmmError unless ``result[0]`` is CUDA_SUCCESS; return the payload."""
        if int(result[0]) != 0:
            raise VmmError(call, self._result_name(result[0]), detail)
        if len(result) == 1:
            return None
        return result[1] if len(result) == 2 else result[1:]

    def ensure_context(self) -> None:
        """Make the retained primary context current in the calling thread (once per thread)."""
        if getattr(self._tls, "context_set", False):
            return
        self._check("cuCtxSetCurrent", self.cuda.cuCtxSetCurrent(self.context))
        self._tls.context_set = True

    def _allocation_prop(self) -> Any:
        prop = self.cuda.CUmemAllocationProp()
        prop.type = self.cuda.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = self.cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.device_ordinal
        return prop

    def _ptr(self, address: int) -> Any:
        return self.cuda.CUdeviceptr(address)

    # -- the calls the pool uses -------------------------------------------------------------

    def create(self, size_bytes: int) -> Any:
        self.ensure_context()
        return self._check("cuMemCreate", self.cuda.cuMemCreate(size_bytes, self._allocation_prop(), 0),
                           f"size {size_bytes} bytes")

    def release(self, handle: Any) -> None:
        self.ensure_context()
        self._check("cuMemRelease", self.cuda.cuMemRelease(handle))

    def reserve(self, size_bytes: int, alignment_bytes: int = 0) -> int:
        self.ensure_context()
        ptr = self._check("cuMemAddressReserve",
                          self.cuda.cuMemAddressReserve(size_bytes, alignment_bytes, 0, 0),
                          f"size {size_bytes} bytes")
        return int(ptr)

    def free_range(self, address: int, size_bytes: int) -> None:
        self.ensure_context()
        self._check("cuMemAddressFree", self.cuda.cuMemAddressFree(self._ptr(address), size_bytes))

    def map(self, address: int, size_bytes: int, handle: Any) -> None:
        self.ensure_context()
        self._check("cuMemMap", self.cuda.cuMemMap(self._ptr(address), size_bytes, 0, handle, 0),
                    f"address {address:#x}, size {size_bytes} bytes")

    def unmap(self, address: int, size_bytes: int) -> None:
        self.ensure_context()
        self._check("cuMemUnmap", self.cuda.cuMemUnmap(self._ptr(address), size_bytes),
                    f"address {address:#x}, size {size_bytes} bytes")

    def set_access(self, address: int, size_bytes: int) -> None:
        """Grant read/write access from this device to ``[address, address + size_bytes)``."""
        self.ensure_context()
        desc = self.cuda.CUmemAccessDesc()
        desc.location.type = self.cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.device_ordinal
        desc.flags = self.cuda.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._check("cuMemSetAccess", self.cuda.cuMemSetAccess(self._ptr(address), size_bytes, [desc], 1),
                    f"address {address:#x}, size {size_bytes} bytes")

    def synchronize(self, streams: Sequence[Any] = ()) -> None:
        """Wait for queued work: the given streams, or the whole context when none are given.

        Unmap does not wait for kernels still reading the range, so every unmap goes
        through here first.
        """
        self.ensure_context()
        if not streams:
            self._check("cuCtxSynchronize", self.cuda.cuCtxSynchronize())
        for stream in streams:
            self._check("cuStreamSynchronize", self.cuda.cuStreamSynchronize(stream))

    @property
    def holds_context(self) -> bool:
        """True until :meth:`release_context` succeeded."""
        return self._context_retained

    def release_context(self) -> None:
        """Drop this wrapper's reference on the primary context (idempotent; a failed
        release is retried by the next call)."""
        if self._context_retained:
            self._check("cuDevicePrimaryCtxRelease", self.cuda.cuDevicePrimaryCtxRelease(self.device))
            self._context_retained = False

    # -- what the driver reports (reconciling the pool's record after a failure) ------------

    def retain_mapped(self, address: int) -> Any | None:
        """The handle mapped at ``address`` with one more reference on it (the caller releases
        it), or None when nothing is mapped there; VmmError when the driver cannot say.

        The driver guarantees the handle value is the one that was mapped, so ``int()`` of it
        equals ``int()`` of the pool's own handle. Only CUDA_ERROR_INVALID_VALUE, the documented
        answer for an unmapped address, counts as "nothing mapped".
        """
        self.ensure_context()
        result = self.cuda.cuMemRetainAllocationHandle(self._ptr(address))
        if int(result[0]) != 0 and self._result_name(result[0]) == "CUDA_ERROR_INVALID_VALUE":
            return None
        return self._check("cuMemRetainAllocationHandle", result, f"address {address:#x}")

    def is_accessible(self, address: int) -> bool:
        """True when this device may read and write the mapped memory at ``address``."""
        self.ensure_context()
        location = self.cuda.CUmemLocation()
        location.type = self.cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        location.id = self.device_ordinal
        flags = self._check("cuMemGetAccess", self.cuda.cuMemGetAccess(location, self._ptr(address)),
                            f"address {address:#x}")
        readwrite = self.cuda.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return int(flags) == int(readwrite)

    # -- facts for reports -----------------------------------------------------------------

    def driver_version(self) -> int:
        return int(self._check("cuDriverGetVersion", self.cuda.cuDriverGetVersion()))

    def device_name(self) -> str:
        raw = self._check("cuDeviceGetName", self.cuda.cuDeviceGetName(256, self.device))
        return raw.split(b"\0", 1)[0].decode() if isinstance(raw, bytes) else str(raw)
