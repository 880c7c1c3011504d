"""What a GPU result is recorded with: device, driver and library versions, copy bandwidth,
the SM clock and power while it ran."""

from __future__ import annotations

import datetime
import json
import math
import platform
import re
import shlex
import statistics
import subprocess
import sys
import threading
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


# NVML's clock-event reasons (nvmlClocksEventReason*): why the SM clock sits below its maximum
POWER_CAP_REASON = 0x4  # software power cap
THERMAL_REASONS = 0x20 | 0x40  # software and hardware thermal slowdown


def clock_summary(samples: list[tuple[float, float, int]]) -> dict:
    """Samples of (SM clock MHz, board power W, NVML clock-event reasons) as their mean
    clock and power, the lowest clock, and the shares of samples held back by the power cap
    and by heat. Empty where there are none."""
    if not samples:
        return {}
    mhz = [m for m, _, _ in samples]
    return {"sm_clock_mhz": statistics.fmean(mhz), "sm_clock_min_mhz": min(mhz),
            "power_w": statistics.fmean(w for _, w, _ in samples),
            "power_capped_share": sum(bool(r & POWER_CAP_REASON) for *_, r in samples)
            / len(samples),
            "thermal_share": sum(bool(r & THERMAL_REASONS) for *_, r in samples) / len(samples),
            "clock_samples": len(samples)}


class ClockSampler:
    """The GPU's SM clock, board power and clock-event reasons, read through NVML (the
    nvidia-ml-py package, the `gpu` extra) on a thread every `period_s` while the block runs:
    `with ClockSampler() as clocks: ...`, then `clocks.summary()` (`clock_summary`). Where
    NVML cannot be read (no package, no driver) or a read fails, `summary()` says why under
    `clocks_not_sampled` (beside the samples read before a failed read).

    The board's energy counter is read as the block starts and ends: `summary()`'s
    `energy_j` is what the board drew meanwhile, where the GPU has the counter (Volta and
    later). Both read power coarsely over a short block: the sampled power is the board's
    running average (about a second on Hopper), and the counter moves in steps (on an H100
    blocks of about 50 ms read 0 J to twice the power cap); over a second or more the two
    agree."""

    def __init__(self, index: int = 0, period_s: float = 0.005) -> None:
        self.index, self.period_s = index, period_s
        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = self._handle = None
        self.error: str | None = None
        self.energy_j: float | None = None
        self._energy_mj: int | None = None

    def __enter__(self) -> ClockSampler:
        initialized = None
        try:
            import pynvml
            pynvml.nvmlInit()
            initialized = pynvml
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception as exc:  # noqa: BLE001 - no NVML: the block runs unsampled
            self.error = f"NVML unavailable ({type(exc).__name__}: {exc})"
            if initialized is not None:  # no device handle: NVML is not left open
                initialized.nvmlShutdown()
            return self
        self._energy_mj = self._read_energy_mj()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _read_energy_mj(self) -> int | None:
        """The board's energy counter (mJ since the driver loaded), None where it has none."""
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - no counter on this board: no energy, still clocks
            return None

    def _run(self) -> None:
        nvml, handle = self._nvml, self._handle
        reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)  # its older name
        while not self._stop.wait(self.period_s):
            try:
                self.samples.append((float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
                                     nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
                                     int(reasons(handle))))
            except Exception as exc:  # noqa: BLE001 - a failed read ends the sampling, not the run
                self.error = f"an NVML read failed ({type(exc).__name__}: {exc})"
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self._energy_mj is not None and (end := self._read_energy_mj()) is not None:
                self.energy_j = (end - self._energy_mj) / 1e3
            self._nvml.nvmlShutdown()  # type: ignore[union-attr]

    def summary(self) -> dict:
        return {**clock_summary(self.samples),
                **({"energy_j": self.energy_j} if self.energy_j is not None else {}),
                **({"clocks_not_sampled": self.error} if self.error else {})}


STEP_CLOCK_KEYS = ("sm_clock_mhz", "power_w", "power_capped_share", "energy_j")


def per_step_clocks(summary: dict, steps: int, prefix: str = "ahead_") -> dict[str, float]:
    """A sampled block of `steps` like steps (`ClockSampler.summary`) as one step's record:
    its mean SM clock, mean sampled power and share of samples held back by the power cap,
    and its energy over `steps` (J per step), each under `prefix`; NaN where it was not read
    (no NVML, no energy counter), so every point of a grid has the same keys."""
    energy = summary.get("energy_j")
    values = {**summary, "energy_j": energy / steps if energy is not None else None}
    return {prefix + key: (math.nan if values.get(key) is None else float(values[key]))
            for key in STEP_CLOCK_KEYS}


def grid_clocks(points: list[dict], prefix: str = "ahead_") -> str | None:
    """One line on a timed grid's clocks (`per_step_clocks` records): how many points were
    held back by the power cap (half their samples or more) and the SM clock's range, or
    None where no point was sampled."""
    sampled = [p for p in points if not math.isnan(p.get(prefix + "sm_clock_mhz", math.nan))]
    if not sampled:
        return None
    capped = sum(p[prefix + "power_capped_share"] >= 0.5 for p in sampled)
    mhz = [p[prefix + "sm_clock_mhz"] for p in sampled]
    return (f"{capped} of {len(sampled)} grid steps ran at the power cap; SM clock "
            f"{min(mhz):,.0f}-{max(mhz):,.0f} MHz")


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
