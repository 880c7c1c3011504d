"""How fast do traces load? One million rows of each large format, plus the bundled traces.

    .venv/bin/python benchmarks/trace_load.py [--rows 1000000]

Writes a synthetic Azure-2024-style CSV (``2024-05-10 00:00:00.009930+00:00``, some rows
without a fraction) and a Mooncake-style JSONL into a temporary directory, then times
``load_trace`` on each and prints rows per second.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
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


def time_load(label: str, path: Path | str) -> None:
    start_s = time.perf_counter()
    trace = load_trace(path)
    elapsed_s = time.perf_counter() - start_s
    size_mib = Path(path if Path(path).is_file() else BUNDLED[str(path)]).stat().st_size / 2**20
    print(f"{label:<28} {len(trace):>10,} rows {size_mib:8.1f} MiB {elapsed_s:8.3f} s "
          f"{len(trace) / elapsed_s:>14,.0f} rows/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        azure_path, mooncake_path = Path(tmp) / "azure2024.csv", Path(tmp) / "mooncake.jsonl"
        write_azure_2024(azure_path, args.rows, rng)
        write_mooncake(mooncake_path, args.rows, rng)
        time_load("azure-2024 style CSV", azure_path)
        time_load("mooncake style JSONL", mooncake_path)
    for name in BUNDLED:
        time_load(f"bundled {name}", name)


if __name__ == "__main__":
    main()
