"""Ctrl-C while `python -m sim --out DIR` saves a finished run keeps that run whole."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time


def test_ctrl_c_while_a_finished_run_is_saved_keeps_its_summary(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "sim", "--trace", "azure-conv", "--limit", "400",
               "--policy", "static,elastic", "--chunk", "2048", "--out", str(out), "--plot",
               "--no-progress"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (out / "timeline_static_chunk_2048.png").exists():  # the save has begun
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.002)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    summary = json.loads((out / "summary.json").read_text())
    assert [run["policy"] for run in summary["runs"]][:1] == ["static"]
    assert "interrupted: 1 of 2 runs finished (static/chunk=2048)" in err
    assert (out / "latency_cdfs.png").exists()
