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
    VmmError,
)
from gpu_backend.vmm.layout import GIB, MIB, KVLayout, PoolPlan, plan_pool
from gpu_backend.vmm.pool import ElasticKVPool, ElasticLocation, Reclaim
from gpu_backend.vmm.state import PoolStats

__all__ = [
    "GIB", "MIB", "ElasticBusyError", "ElasticDetachedError", "ElasticKVPool", "ElasticLocation",
    "KVLayout", "NoDriverError", "PoolClosedError", "PoolPlan", "PoolStats", "Reclaim",
    "VmmDriver", "VmmError", "plan_pool",
]
