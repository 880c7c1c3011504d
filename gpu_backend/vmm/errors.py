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
