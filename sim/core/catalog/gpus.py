"""GPU presets and user GPU spec files: the device figures every memory and cost model uses.

``memory_bytes`` is what the runtime reports as total (``torch.cuda.mem_get_info()[1]``, the
total in PyTorch's out-of-memory messages), a few hundred MiB below nvidia-smi's figure.
Compute, bandwidth and link figures are from the vendors' datasheets; links are quoted there
bidirectional, and we store half (one direction).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from sim.core.catalog.units import GIB, MIB
from sim.core.elastic import GRANULE_BYTES


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int  # total as cudaMemGetInfo / torch report it (less than nvidia-smi shows)
    peak_bf16_flops: float  # dense tensor-core FLOP/s
    memory_bandwidth_bytes_s: float
    interconnect_bytes_s: float  # per-GPU unidirectional NVLink (or PCIe) bandwidth
    vmm_granularity_bytes: int = 2 * MIB
    # streaming multiprocessors (compute units on AMD): whether an attention launch fills the
    # GPU or splits its keys (CostModel's split_launch_s); 0: unknown, no split priced
    num_sms: int = 0

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0:
            raise ValueError(f"GPU {self.name!r}: memory_bytes must be positive")
        for rate in RATE_FLOORS:
            if not getattr(self, rate) > 0:
                raise ValueError(f"GPU {self.name!r}: {rate} must be positive")
        if self.num_sms < 0:
            raise ValueError(f"GPU {self.name!r}: num_sms must be >= 0 (0: unknown)")
        _check_plausible(self)


# What GPUs span (22 to 192 GiB, 121 to 2,250 TFLOP/s, 300 GB/s to 8 TB/s of memory, links
# of 32 GB/s and up, one direction) lies far inside these bounds: a figure outside them is in
# the wrong unit (GiB, TFLOP/s, GB/s) or a slip, and would price every run absurdly.
MIN_MEMORY_BYTES = GIB
MAX_MEMORY_BYTES = 4096 * GIB
# rate -> (floor, its unit, the unit a datasheet quotes, how many of the first make one)
RATE_FLOORS = {"peak_bf16_flops": (1e12, "FLOP/s", "TFLOP/s", 1e12),
               "memory_bandwidth_bytes_s": (1e10, "bytes/s", "GB/s", 1e9),
               "interconnect_bytes_s": (1e9, "bytes/s", "GB/s", 1e9)}


def _check_plausible(gpu: GpuSpec) -> None:
    """Refuse figures no GPU has, saying the unit each is given in."""
    name, memory = gpu.name, gpu.memory_bytes
    if not MIN_MEMORY_BYTES <= memory <= MAX_MEMORY_BYTES:
        shown = memory if 1 <= memory <= 4096 else 80
        hint = f", e.g. {shown * GIB} for {shown} GiB"
        raise ValueError(f"GPU {name!r}: memory_bytes {memory:g} is outside what a GPU holds "
                         f"(1 GiB to 4 TiB): give bytes{hint}")
    for rate, (floor, unit, quoted, scale) in RATE_FLOORS.items():
        value = getattr(gpu, rate)
        if value < floor:
            hint = f", e.g. {value * scale:g} for {value:g} {quoted}" if value < 1e5 else ""
            raise ValueError(f"GPU {name!r}: {rate} {value:g} {unit} is below any GPU's "
                             f"({floor:g} {unit}): give {unit}{hint}")
    granularity = gpu.vmm_granularity_bytes
    if granularity < GRANULE_BYTES or granularity % GRANULE_BYTES:
        raise ValueError(f"GPU {name!r}: vmm_granularity_bytes {granularity}: give a positive "
                         f"multiple of {GRANULE_BYTES} (2 MiB, CUDA's VMM granularity), which "
                         "the elastic reserve's handles are cut in")


GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        # L4 datasheet: 121 TFLOPS bf16 dense (242 sparse), GDDR6 300 GB/s, PCIe Gen4 x16
        # 64 GB/s bidir, 58 SMs. 22.03 GiB: the total in PyTorch OOM messages on L4.
        GpuSpec("l4", int(22.03 * GIB), 121e12, 300e9, 32e9, num_sms=58),
        # A10G (AWS G5) has no datasheet of its own; the A10 datasheet: 125 TFLOPS bf16 dense,
        # GDDR6 600 GB/s, PCIe Gen4 x16; 80 SMs (A10: 72). 22.06 GiB: PyTorch on an A10G.
        GpuSpec("a10g", int(22.06 * GIB), 125e12, 600e9, 32e9, num_sms=80),
        # L40S datasheet: 362 TFLOPS bf16 dense (733 sparse), GDDR6 864 GB/s, no NVLink:
        # PCIe Gen4 x16, 64 GB/s bidir. 44.40 GiB: PyTorch OOM messages on L40S (approximate).
        GpuSpec("l40s", int(44.40 * GIB), 362e12, 864e9, 32e9, num_sms=142),
        # A100 datasheet (SXM): 312 TFLOPS bf16 dense, HBM2 1,555 GB/s, NVLink3 600 GB/s bidir.
        # 39.59 GiB: the total PyTorch prints in OOM messages on A100-SXM4-40GB.
        GpuSpec("a100-40gb", int(39.59 * GIB), 312e12, 1555e9, 300e9, num_sms=108),
        # A100 80GB datasheet (SXM): HBM2e 2,039 GB/s. 79.35 GiB: PyTorch OOM messages.
        GpuSpec("a100-80gb", int(79.35 * GIB), 312e12, 2039e9, 300e9, num_sms=108),
        # H100 SXM datasheet: 989 TFLOPS bf16 dense (1,979 with sparsity), HBM3 3.35 TB/s,
        # NVLink4 900 GB/s bidir. 79.18 GiB: total in vLLM memory-profiling logs on H100.
        GpuSpec("h100-80gb", int(79.18 * GIB), 989.4e12, 3.35e12, 450e9, num_sms=132),
        # H200 datasheet: same compute as H100, HBM3e 4.8 TB/s, NVLink4 900 GB/s bidir.
        # 150,109,880,320 B = 139.80 GiB: measured with torch.cuda.mem_get_info on an H200
        # (nvidia-smi shows 143,771 MiB).
        GpuSpec("h200-141gb", 150_109_880_320, 989.4e12, 4.8e12, 450e9, num_sms=132),
        # H20 (NVIDIA's H20 product brief): 148 TFLOPS bf16 dense (296 sparse), HBM3 96 GB at
        # 4.0 TB/s, NVLink 900 GB/s bidir, 78 SMs. nvidia-smi shows 97,871 MiB; 95.11 GiB is
        # that less the ~0.47 GiB the driver keeps on an H100 (81,559 MiB vs 79.18 GiB).
        GpuSpec("h20", int(95.11 * GIB), 148e12, 4.0e12, 450e9, num_sms=78),
        # HGX B200 datasheet (per GPU): 2.25 PFLOPS bf16 dense (4.5 sparse), HBM3e 8 TB/s,
        # NVLink5 1.8 TB/s bidir. 178.35 GiB: PyTorch OOM messages on B200.
        GpuSpec("b200", int(178.35 * GIB), 2.25e15, 8e12, 900e9, num_sms=148),
        # AMD Instinct MI300X datasheet: 1,307.4 TFLOPS bf16 dense (2,614.9 sparse), HBM3
        # 192 GB at 5.3 TB/s, 304 CUs, 7 Infinity Fabric links of 128 GB/s bidir (896 GB/s).
        # 191.98 GiB: the total in PyTorch (ROCm) OOM messages on MI300X.
        GpuSpec("mi300x", int(191.98 * GIB), 1307.4e12, 5.3e12, 448e9, num_sms=304),
    )
}
GPU_ALIASES: dict[str, str] = {
    "a100": "a100-80gb",
    "a100-40g": "a100-40gb",
    "a100-80g": "a100-80gb",
    "h100": "h100-80gb",
    "h100-sxm": "h100-80gb",
    "h200": "h200-141gb",
    "h200-141g": "h200-141gb",
    "h20-96gb": "h20",
    "mi300x-192gb": "mi300x",
}

GPU_FILE_SUFFIXES = (".yaml", ".yml", ".json")
_REQUIRED_GPU_KEYS = ("name", "memory_bytes", "peak_bf16_flops", "memory_bandwidth_bytes_s",
                      "interconnect_bytes_s")
_INT_GPU_KEYS = ("memory_bytes", "vmm_granularity_bytes", "num_sms")


def get_gpu(name_or_path: str | Path) -> GpuSpec:
    """A GPU preset by name or alias (case-insensitive), or a user GPU spec file
    (``.yaml``/``.yml``/``.json`` with GpuSpec's fields)."""
    text = str(name_or_path)
    if text.strip().lower().endswith(GPU_FILE_SUFFIXES):
        return gpu_from_file(Path(text).expanduser())
    key = text.strip().lower()
    key = GPU_ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    known = ", ".join(sorted(GPUS) + sorted(GPU_ALIASES))
    raise ValueError(
        f"unknown GPU {text!r}; known: {known}; or give a .yaml/.json file with the fields "
        f"{', '.join(_REQUIRED_GPU_KEYS)}"
    )


def gpu_from_file(path: Path) -> GpuSpec:
    """Read a GpuSpec from YAML or JSON; every error names the file and the key to fix."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read GPU spec {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise ValueError(f"{path} is not valid {kind}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of GpuSpec fields")
    known = {f.name for f in fields(GpuSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; GpuSpec fields: {sorted(known)}")
    missing = [key for key in _REQUIRED_GPU_KEYS if key not in data]
    if missing:
        raise ValueError(f"{path}: missing key(s) {missing}")
    values: dict[str, Any] = {key: _gpu_value(path, key, value) for key, value in data.items()}
    try:
        return GpuSpec(**values)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _gpu_value(path: Path, key: str, value: object) -> str | int | float:
    """One field, type-checked. Numeric strings are accepted: YAML reads ``989.4e12`` (no sign
    in the exponent) as a string."""
    if key == "name":
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{path}: key 'name' must be a non-empty string, got {value!r}")
        return value
    number: float
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{path}: key {key!r} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{path}: key {key!r} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{path}: key {key!r} must be finite, got {value!r}")
    if key in _INT_GPU_KEYS:
        if number != int(number):
            raise ValueError(f"{path}: key {key!r} must be a whole number, got {value!r}")
        return int(number)
    return number
