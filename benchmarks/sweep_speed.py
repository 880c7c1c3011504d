"""Sweep throughput: configurations per minute on the local cores (and on Ray's local mode).

    .venv/bin/python benchmarks/sweep_speed.py [--window 0:600] [--workers N] [--no-ray]

To stay under a few minutes it sweeps 24 configurations (2 models x 2 TP x 3 chunks x
2 policies on H200) over a time window of the bundled Azure conv trace (default the first
600 s of its ~3,500 s), then extrapolates to the full trace: a full-trace configuration
costs about (full span / window span) window configurations.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

from sim.planning import Executor, SweepSpec, TraceSpec, run_sweep
from traces import load_trace
from traces.cli import parse_window


def grid(window_s: tuple[float, float]) -> SweepSpec:
    return SweepSpec(models=("llama-3.1-8b", "qwen2.5-7b"), gpus=("h200",), tps=(1, 2),
                     chunks=(2048, 8192, 32768), policies=("static", "elastic"),
                     rate_scales=(1.0,), traces=(TraceSpec("azure-conv", window_s=window_s),))


def measure(spec: SweepSpec, executor: Executor) -> tuple[float, int]:
    cases = spec.cases()
    start = time.perf_counter()
    rows = run_sweep(cases, executor)
    elapsed_s = time.perf_counter() - start
    assert len(rows) == len(cases)
    return elapsed_s, len(cases)


def report(label: str, elapsed_s: float, num_configs: int, window_share: float) -> None:
    per_min = num_configs / elapsed_s * 60
    full_100_min = 100 / (per_min * window_share)
    print(f"{label:>18}: {num_configs} configs in {elapsed_s:6.1f} s = {per_min:6.1f} configs/min "
          f"on the window; a 100-config full-trace sweep ~ {full_100_min:.1f} min")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--window", type=parse_window, default=(0.0, 600.0), metavar="START:END")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    full = load_trace("azure-conv")
    window = full.window(*args.window)
    window_share = len(window) / len(full)
    print(f"azure-conv window {args.window[0]:g}-{args.window[1]:g} s: {len(window):,} of "
          f"{len(full):,} requests ({window_share:.1%}); {args.workers} workers")
    spec = grid(args.window)
    quiet = Executor(args.workers, show_progress=False)
    report("local processes", *measure(spec, quiet), window_share)
    if args.no_ray:
        return
    if importlib.util.find_spec("ray") is None:
        print("ray is not installed: skipped the Ray local-mode run (pip install ray)")
        return
    ray_executor = Executor(args.workers, ray_address="local", show_progress=False)
    report("ray (local mode)", *measure(spec, ray_executor), window_share)


if __name__ == "__main__":
    main()
