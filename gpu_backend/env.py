"""What a GPU result is recorded with: device, driver and library versions, copy bandwidth."""

from __future__ import annotations

import datetime
import json
import platform
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path


def versions() -> dict:
    """Driver and library versions; a part that cannot be read is None, never an error.
    FlashInfer's (the flashinfer attention backend's) only where it is installed."""
    import torch
    import triton

    bindings = _package_version("cuda-bindings")
    flashinfer = _flashinfer_version()
    driver = None
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"driver": driver.splitlines()[0] if driver else None, "torch": torch.__version__,
            "triton": triton.__version__, "cuda-bindings": bindings, "cuda": torch.version.cuda,
            "python": platform.python_version(),
            **({"flashinfer": flashinfer} if flashinfer else {})}


def measured_on() -> str:
    """Today's date in UTC (ISO), as a replay records the day it ran."""
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def machine_start(boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str | None:
    """This start of the machine: its host name and the kernel's boot id. Replays that share
    it ran on one host in one boot, so their host speed is comparable; None where the boot id
    cannot be read."""
    try:
        boot = boot_id_path.read_text().strip()
    except OSError:
        return None
    return f"{platform.node()}/{boot}" if boot else None


def _flashinfer_version() -> str | None:
    """FlashInfer's version: its distribution's, else the importable package's own (a copy of
    the package put on the path without its metadata), else None where it is not installed."""
    found = _package_version("flashinfer-python")
    if found is not None:
        return found
    import importlib.util
    if importlib.util.find_spec("flashinfer") is None:
        return None
    try:
        import flashinfer
        return str(flashinfer.__version__)
    except Exception:  # noqa: BLE001 - a package that does not import has no version to record
        return None


def _package_version(name: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001 - a missing package is reported, not fatal
        return None


def device_environment() -> dict:
    import torch

    return {"gpu": torch.cuda.get_device_name(), **versions()}


def copy_bandwidth_bytes_s(num_bytes: int = 4 << 30, repeat: int = 10) -> float:
    """Device-to-device copy rate, counting bytes read and written (median of `repeat`)."""
    import torch

    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    times_ms = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times_ms.append(start.elapsed_time(end))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * num_bytes / (statistics.median(times_ms) / 1e3)


RESULTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def write_result(result: dict, out: Path | None, kind: str, *names: str) -> Path:
    """Write a benchmark's JSON to `out`, or to benchmarks/results/<kind>_<names slug>.json,
    with the date it was measured and the command that measured it."""
    result = {**result, "measured_on": datetime.date.today().isoformat(),
              "command": shlex.join(["python", *sys.argv])}
    if out is None:
        slug = re.sub(r"[^a-z0-9]+", "-", "_".join(names).lower()).strip("-")
        out = RESULTS_DIR / f"{kind}_{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return out
