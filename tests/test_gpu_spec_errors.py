"""A GPU spec file (`--gpu FILE`) with a figure no GPU has, or one in the wrong unit: refused
by `python -m sim` and `python -m sim memory` with one line naming the file and the field,
and exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"name": "my-gpu", "memory_bytes": "85899345920", "peak_bf16_flops": "989.4e12",
        "memory_bandwidth_bytes_s": "3.35e+12", "interconnect_bytes_s": "450e9"}
COMMANDS = {
    "run": ["--trace", "azure-conv", "--limit", "5", "--calibration", "none", "--no-progress"],
    "memory": ["memory"],
}


def run_with_gpu(tmp_path: Path, command: str, **changes: str) -> subprocess.CompletedProcess:
    path = tmp_path / "my_gpu.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in {**GOOD, **changes}.items()))
    args = COMMANDS[command]
    argv = [*args[:1], "--gpu", str(path), *args[1:]] if command == "memory" else [
        "--gpu", str(path), *args]
    return subprocess.run([sys.executable, "-m", "sim", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_good_spec_file_runs(tmp_path, command):
    done = run_with_gpu(tmp_path, command, vmm_granularity_bytes="4194304")
    assert done.returncode == 0, done.stderr


def test_a_spec_file_gpu_runs_on_the_roofline_or_a_named_calibration(tmp_path):
    """No calibration is shipped for a GPU read from a file: a plain run prices with the
    datasheet roofline and says so; one given a calibration takes it, measured elsewhere."""
    path = tmp_path / "my_gpu.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in GOOD.items()))
    base = [sys.executable, "-m", "sim", "--gpu", str(path), "--trace", "azure-conv", "--limit",
            "5", "--no-progress"]
    plain = subprocess.run(base, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    assert "pricing: uncalibrated: datasheet roofline" in plain.stdout
    named = subprocess.run([*base, "--calibration", "calibration/h200/llama-3.1-8b.json"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert named.returncode == 0, named.stderr
    assert "pricing: calibration/h200/llama-3.1-8b.json (NVIDIA H200, llama-3.1-8b" in named.stdout


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("changes, says", [
    ({"vmm_granularity_bytes": "3"},
     "vmm_granularity_bytes 3: give a positive multiple of 2097152 (2 MiB"),
    ({"vmm_granularity_bytes": "3145728"}, "vmm_granularity_bytes 3145728: give a positive"),
    ({"memory_bytes": "1e40"}, "memory_bytes 1e+40 is outside what a GPU holds (1 GiB to 4 TiB)"),
    ({"memory_bytes": "1000"},
     "memory_bytes 1000 is outside what a GPU holds (1 GiB to 4 TiB): give bytes, e.g. "
     "1073741824000 for 1000 GiB"),
    ({"peak_bf16_flops": "989"},
     "peak_bf16_flops 989 FLOP/s is below any GPU's (1e+12 FLOP/s): give FLOP/s, e.g. 9.89e+14 "
     "for 989 TFLOP/s"),
    ({"memory_bandwidth_bytes_s": "3350"},
     "memory_bandwidth_bytes_s 3350 bytes/s is below any GPU's (1e+10 bytes/s): give bytes/s, "
     "e.g. 3.35e+12 for 3350 GB/s"),
    ({"interconnect_bytes_s": "450"}, "interconnect_bytes_s 450 bytes/s is below any GPU's"),
], ids=["granularity-3", "granularity-3mib", "memory-1e40", "memory-1000", "flops-in-tflops",
        "bandwidth-in-gbs", "link-in-gbs"])
def test_an_implausible_figure_is_refused_naming_the_file_and_field(tmp_path, command, changes,
                                                                   says):
    done = run_with_gpu(tmp_path, command, **changes)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"{tmp_path / 'my_gpu.yaml'}: GPU 'my-gpu': " in line and says in line, line
