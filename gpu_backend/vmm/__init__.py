"""Elastic KV-cache allocator on CUDA virtual memory (cuda-python, no C++ extension).

``ElasticKVPool`` reserves one virtual range for base + elastic KV blocks and attaches or
detaches the elastic reserve on demand; ``VmmDriver`` checks every driver call;
``fake_driver.FakeCudaDriver`` stands in for the driver in tests without a GPU.
"""

from gpu_backend.vmm.driver import VmmDriver
from gpu_backend.vmm.errors import (
    ElasticBusyError,
    ElasticDetachedError,
    NoDriverError,
    PoolClosedError,
    PoolCloseError,
    VmmError,
)
from gpu_backend.vmm.layout import GIB, MIB, KVLayout, PoolPlan, plan_pool
from gpu_backend.vmm.pool import ElasticKVPool, ElasticLocation, Reclaim
from gpu_backend.vmm.signals import defer_signals
from gpu_backend.vmm.state import MappedRange, PoolStats, Region

__all__ = [
    "GIB", "MIB", "ElasticBusyError", "ElasticDetachedError", "ElasticKVPool", "ElasticLocation",
    "KVLayout", "MappedRange", "NoDriverError", "PoolCloseError", "PoolClosedError", "PoolPlan",
    "PoolStats", "Reclaim", "Region", "VmmDriver", "VmmError", "defer_signals", "plan_pool",
]
