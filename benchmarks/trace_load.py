"""How fast do traces load, and how much memory does a load take at its peak?

    .venv/bin/python benchmarks/trace_load.py [--rows 1000000] [--repeats 3]

Writes a synthetic Azure-2024-style CSV (``2024-05-10 00:00:00.009930+00:00``, some rows
without a fraction) and a Mooncake-style JSONL into a temporary directory, then loads
each of them and each bundled trace. Per file it prints the best wall and CPU times of
``--repeats`` loads (CPU time is the steadier on a shared machine), rows per second, and,
from one more load under ``tracemalloc``, the peak of memory allocated during the load and
its ratio to the file size (streaming keeps it under ~3x). The timed loads run without
``tracemalloc``, which slows allocation.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout
from traces import BUNDLED, load_trace  # noqa: E402

START_US = 1_715_299_200_000_000  # 2024-05-10 00:00:00 UTC


def write_azure_2024(path: Path, num_rows: int, rng: np.random.Generator) -> None:
    arrival_us = START_US + np.cumsum(rng.integers(0, 20_000, size=num_rows))
    arrival_us[::10] -= arrival_us[::10] % 1_000_000  # every 10th row on a whole second
    arrival_us.sort()
    stamps = np.datetime_as_string(arrival_us.astype("datetime64[us]"), unit="us")
    stamps = np.char.replace(stamps, "T", " ")
    stamps = np.where(arrival_us % 1_000_000 == 0, stamps.astype("U19"), stamps)
    prompts = rng.integers(1, 8_000, size=num_rows)
    outputs = rng.integers(1, 1_000, size=num_rows)
    lines = [f"{s}+00:00,{p},{o}" for s, p, o in zip(stamps.tolist(), prompts.tolist(),
                                                     outputs.tolist(), strict=True)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(lines) + "\n")


def write_mooncake(path: Path, num_rows: int, rng: np.random.Generator) -> None:
    arrival_ms = np.cumsum(rng.integers(0, 5, size=num_rows))
    prompts = rng.integers(1, 8_000, size=num_rows)
    outputs = rng.integers(1, 1_000, size=num_rows)
    next_hash = 0
    with path.open("w") as file:
        for ms, prompt, output in zip(arrival_ms.tolist(), prompts.tolist(), outputs.tolist(),
                                      strict=True):
            num_blocks = -(-prompt // 512)
            hashes = list(range(next_hash, next_hash + num_blocks))
            next_hash += num_blocks
            record = {"timestamp": ms, "input_length": prompt, "output_length": output,
                      "hash_ids": hashes}
            file.write(json.dumps(record) + "\n")


def measure_load(label: str, path: Path | str, repeats: int) -> None:
    file_path = Path(path) if Path(path).is_file() else BUNDLED[str(path)]
    size_bytes = file_path.stat().st_size
    elapsed_s, cpu_s = [], []
    for _ in range(repeats):
        start_s, start_cpu_s = time.perf_counter(), time.process_time()
        trace = load_trace(path)
        elapsed_s.append(time.perf_counter() - start_s)
        cpu_s.append(time.process_time() - start_cpu_s)
        del trace
    best_s = min(elapsed_s)
    tracemalloc.start()
    trace = load_trace(path)
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"{label:<26} {len(trace):>10,} rows {size_bytes / 2**20:8.2f} MiB "
          f"{best_s:8.3f} s (cpu {min(cpu_s):6.3f} s) {len(trace) / best_s:>12,.0f} rows/s "
          f"peak {peak_bytes / 2**20:8.2f} MiB = {peak_bytes / size_bytes:5.2f}x file")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3, help="timed loads per file (best kept)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        azure_path, mooncake_path = Path(tmp) / "azure2024.csv", Path(tmp) / "mooncake.jsonl"
        write_azure_2024(azure_path, args.rows, rng)
        write_mooncake(mooncake_path, args.rows, rng)
        measure_load("azure-2024 style CSV", azure_path, args.repeats)
        measure_load("mooncake style JSONL", mooncake_path, args.repeats)
    for name in BUNDLED:
        measure_load(f"bundled {name}", name, args.repeats)


if __name__ == "__main__":
    main()
