"""Exceptions raised by the CUDA virtual-memory KV pool."""

from __future__ import annotations


class VmmError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the CUresult."""

    def __init__(self, call: str, result_name: str, detail: str = "") -> None:
        self.call = call
        self.result_name = result_name
        message = f"{call} failed with {result_name}"
        super().__init__(f"{message}: {detail}" if detail else message)


class NoDriverError(VmmError):
    """No NVIDIA driver (libcuda) or no cuda-python on this machine."""


class ElasticBusyError(RuntimeError):
    """``detach()`` was asked while blocks in the elastic range are still allocated."""


class ElasticDetachedError(RuntimeError):
    """An elastic block was used while the elastic range is detached (unmapped)."""


class PoolClosedError(RuntimeError):
    """The pool was used after ``close()``."""


class PoolCloseError(VmmError):
    """``close()`` could not give everything back; ``held`` lists what the pool still holds.

    Calling ``close()`` again retries exactly those; ``call`` and ``result_name`` are the
    first failure's.
    """

    def __init__(self, first: Exception | None, held: tuple[str, ...]) -> None:
        self.call = getattr(first, "call", "close")
        self.result_name = getattr(first, "result_name", type(first).__name__)
        self.held = held
        cause = f" ({first})" if first is not None else ""
        RuntimeError.__init__(self, f"close() could not release everything{cause}; still held: "
                                    f"{'; '.join(held)}; call close() again to retry")
