"""Request traces for the simulator and the GPU backend.

Real traces (Azure 2023/2024, Mooncake, BurstGPT, Vidur) stream column-wise into a
``Trace``, plain or gzip/zstd compressed; ``synthetic`` draws one from Poisson/Gamma
arrivals and length distributions. Every file problem raises ``TraceError`` naming the
file, line and field, and what to fix.
"""

from traces.bundled import BUNDLED, bundled
from traces.errors import TraceError
from traces.hashes import BlockHashes
from traces.lengths import EmpiricalLength, FixedLength, LengthDist, LognormalLength, UniformLength
from traces.loader import FORMATS, load_trace
from traces.options import add_trace_arguments, trace_from_args
from traces.request import Request
from traces.synthetic import synthetic
from traces.trace import Trace

__all__ = [
    "BUNDLED",
    "BlockHashes",
    "FORMATS",
    "EmpiricalLength",
    "FixedLength",
    "LengthDist",
    "LognormalLength",
    "Request",
    "Trace",
    "TraceError",
    "UniformLength",
    "add_trace_arguments",
    "bundled",
    "load_trace",
    "synthetic",
    "trace_from_args",
]
