"""`python -m gpu_backend` on a host that cannot run it says so in one line (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
@pytest.mark.parametrize("command", [["replay", "--trace", "azure-conv", "--limit", "2"],
                                     ["profile", "--out", "calibration.json"]])
def test_no_gpu_is_one_clear_line(command, tmp_path):
    done = subprocess.run([sys.executable, "-m", "gpu_backend", *command], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "runs on an NVIDIA GPU" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
