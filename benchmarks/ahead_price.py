"""The cost model's async price of each calibration's grid steps against their back-to-back
periods (CPU, seconds).

    python benchmarks/ahead_price.py [CALIBRATION ...] [--out FILE]

A profile times each grid step twice: alone (`measured_s`, what the fit sees) and launched back
to back, each launched before the one before it is collected (`ahead_s`, the period async
scheduling runs a stream of that step at). This prices every grid step that has an `ahead_s`
as the simulator prices a step launched ahead under async scheduling (the calibration's
efficiency, `host_hidden`), and prints the median error and median |error| against `ahead_s`
over the eager steps (those with eager launches) and over all of them. A stream of identical
eager steps hides less of a launch than the replays' mixes do (an eager step behind a decode
graph), so this bounds the async price from one side; the replays judge it
(`python -m validation rebuild`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a plain checkout

from gpu_backend.engine.calibrate import scheduler_output  # noqa: E402
from gpu_backend.engine.shapes import StepShape  # noqa: E402
from sim.core.calibration import parse_calibration, read_json  # noqa: E402
from sim.core.calibration.profile_fit import grid_cost_args  # noqa: E402


def ahead_errors(path: Path) -> dict | None:
    """The async price's errors against the grid's back-to-back periods; None where the
    calibration's profile timed none."""
    data = read_json(path)
    timed = [m for m in data["measurements"] if m.get("ahead_s")]
    if not timed:
        return None
    efficiency = parse_calibration(data, str(path)).parts()[0]
    args = grid_cost_args(data)._replace(host_hidden=True)  # priced as launched ahead
    cost = args.cost_model(efficiency, data.get("piecewise_sizes") or ())
    eager, errors = [], []
    for m in timed:
        step = cost.step(scheduler_output(StepShape.from_record(m)))
        eager.append(step.launch_s > 0)
        errors.append(step.total_s / m["ahead_s"] - 1.0)
    error, is_eager = np.array(errors), np.array(eager)

    def summary(sample: np.ndarray) -> dict:
        return {"steps": int(len(sample)),
                "median_error": float(np.median(sample)) if len(sample) else None,
                "median_abs_error": float(np.median(np.abs(sample))) if len(sample) else None}

    return {"calibration": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
            "eager": summary(error[is_eager]), "all": summary(error)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("calibrations", nargs="*", type=Path,
                        help="calibration files (default: every one under calibration/)")
    parser.add_argument("--out", type=Path, help="write the rows as JSON")
    args = parser.parse_args(argv)
    paths = args.calibrations or sorted((ROOT / "calibration").glob("*/*.json"))
    rows = []
    print("calibration | eager steps: n, median error, median |error| | all steps: n, "
          "median |error|")
    for path in paths:
        if not path.is_file():
            print(f"error: {path}: no such calibration file", file=sys.stderr)
            return 2
        try:
            found = ahead_errors(path)
        except ValueError as exc:  # not a calibration: the reader names the file and field
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if found is None:
            print(f"{path.name}: its profile timed no step back to back (no ahead_s)")
            continue
        rows.append(found)
        e, a = found["eager"], found["all"]
        eager = ("-" if e["steps"] == 0 else
                 f"{e['steps']}, {100 * e['median_error']:+.1f}%, "
                 f"{100 * e['median_abs_error']:.1f}%")
        print(f"{found['calibration']} | {eager} | {a['steps']}, "
              f"{100 * a['median_abs_error']:.1f}%")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
