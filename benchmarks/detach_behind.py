"""What a detach behind the step in flight costs that step, read from the evidence's replays
(CPU, seconds).

    python benchmarks/detach_behind.py [SLICE ...] [--out FILE]

Under async scheduling the GPU engine takes the reserve back while the step in flight still
runs when that step holds no elastic block (`EngineConfig.detach_behind_step`): the unmap runs
on the host, behind the step. For every elastic run of the async slices (or the slices named),
this sets each decode step that had such a detach behind it (the transition recorded before
the next step, `transitions.csv.gz`'s `behind_step`) against a least-squares line through the
run's other decode steps (seconds over 1, sequences and context tokens; steps next to any
transition left out), and prints the steps' mean and median excess over the line beside the
detaches' mean time, and the excess as a share of it. A share near 1 means the unmap held the
device back as long as it took; near 0, that it hid behind the step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a plain checkout

from validation.evidence import EVIDENCE_DIR, slice_folders  # noqa: E402
from validation.results import engine_of  # noqa: E402
from validation.run_csvs import first_file, read_csv_columns  # noqa: E402


def run_excess(run: Path) -> dict | None:
    """The decode steps with a detach behind them in one elastic run folder, against the
    run's other decode steps; None where none had one."""
    steps = read_csv_columns(first_file(run, "steps.csv"))
    transitions = read_csv_columns(first_file(run, "transitions.csv"))
    if steps is None or transitions is None or "behind_step" not in transitions:
        return None
    ids = transitions["step_id"].astype(int)
    detach = transitions["kind"] == "detach"
    behind = detach & (transitions["behind_step"] == 1)
    step_id = steps["step_id"].astype(int)
    decode = steps["num_prefill_tokens"] == 0
    before = np.isin(step_id, ids[behind] - 1) & decode  # the step each ran behind
    if not before.any():
        return None
    others = decode & ~np.isin(step_id, np.concatenate((ids, ids - 1)))
    design = np.column_stack([np.ones(len(step_id)), steps["num_seqs"],
                              steps["decode_context_tokens"]])
    coef = np.linalg.lstsq(design[others], steps["measured_s"][others], rcond=None)[0]
    excess = steps["measured_s"][before] - design[before] @ coef
    detach_s = transitions["total_s"][behind]
    return {"steps": int(before.sum()), "excess_mean_ms": 1e3 * float(excess.mean()),
            "excess_median_ms": 1e3 * float(np.median(excess)),
            "detach_mean_ms": 1e3 * float(detach_s.mean()),
            "share": float(excess.mean() / detach_s.mean())}


def async_slices() -> list[str]:
    return [folder.name for folder in slice_folders() if "async" in engine_of(folder)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slices", nargs="*", help="evidence slice names (default: every async one)")
    parser.add_argument("--out", type=Path, help="write the rows as JSON")
    args = parser.parse_args(argv)
    names = args.slices or async_slices()
    rows = []
    print("slice | run | steps | excess mean / median ms | detach mean ms | share")
    for name in names:
        folder = EVIDENCE_DIR / name
        if not (folder / "runs").is_dir():
            print(f"error: {folder}: no such evidence slice (its runs/ folder is missing)",
                  file=sys.stderr)
            return 2
        for run in sorted((folder / "runs").glob("elastic_chunk_*")):
            found = run_excess(run)
            if found is None:
                continue
            rows.append({"slice": name, "run": run.name, **found})
            print(f"{name} | {run.name} | {found['steps']} | {found['excess_mean_ms']:.3f} / "
                  f"{found['excess_median_ms']:.3f} | {found['detach_mean_ms']:.3f} | "
                  f"{found['share']:.2f}")
    if not rows:
        print("no elastic run of these slices detached behind a step in flight")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
