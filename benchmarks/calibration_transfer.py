"""How far a calibration carries to a model it was not measured on (docs/calibration.md).

Prices one model's GPU replays twice, with the same simulator: with the model's own
calibration, and with another model's calibration carried to its shapes
(sim.core.calibration.transfer), and prints each one's error against the replays in TTFT
p50, TPOT p50 and throughput, and how far the transferred prices sit from the own ones.
`--host-from-own` carries the device terms alone: the host terms (step overhead, launches),
the engine's piecewise sizes and the VMM costs come from the own calibration, as for a model
whose engine was profiled on the target host but whose kernels were not.

Usage: python benchmarks/calibration_transfer.py --source CAL --own CAL [--host-from-own]
       SLICE [SLICE ...] [--out PATH]
SLICE: a validation/evidence/<slice> folder (slice.json, runs/), or a folder of replays.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.core.calibration import describe, load_calibration, transfer  # noqa: E402
from validation.evidence import RECIPE, read_recipe  # noqa: E402
from validation.pipeline import validate  # noqa: E402
from validation.runs import check_calibration_graphs, find_runs, load_run  # noqa: E402

METRICS = ("ttft_p50_s", "tpot_p50_s", "throughput_tok_s")


def slice_runs(folder: Path):
    """(replays, the trace slice they ran or None: the one their summaries record)."""
    recipe = read_recipe(folder) if (folder / RECIPE).is_file() else None
    runs_dir = folder / "runs" if recipe is not None else folder
    runs = sorted((load_run(f) for f in find_runs(runs_dir)), key=lambda r: (r.chunk, r.policy))
    return runs, None if recipe is None else recipe.trace_slice


def priced(runs, trace_slice, calibration) -> dict[str, dict[str, dict]]:
    """Per run label, per metric: the replay's value and this calibration's prediction."""
    check_calibration_graphs(calibration, runs)
    efficiency, profile, vmm_costs = calibration.parts()
    v = validate(runs, efficiency, profile, describe(calibration), slice_override=trace_slice,
                 fit=False, vmm_costs=vmm_costs, log=lambda _: None)
    return {r.label: {m: r.metrics[m] for m in METRICS} for r in v.runs}


def compare_slice(folder: Path, own, moved) -> list[dict]:
    runs, trace_slice = slice_runs(folder)
    mine, theirs = priced(runs, trace_slice, own), priced(runs, trace_slice, moved)
    rows = []
    for label, metrics in mine.items():
        for metric, row in metrics.items():
            measured, predicted = row["measured"], row["predicted"]
            carried = theirs[label][metric]["predicted"]
            rows.append({"slice": folder.name, "run": label, "metric": metric,
                         "measured": measured, "own": predicted, "transferred": carried,
                         "own_error": predicted / measured - 1.0,
                         "transferred_error": carried / measured - 1.0,
                         "transferred_vs_own": carried / predicted - 1.0})
    return rows


def summary(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per metric: median |error| of each calibration over the runs, and of the transfer
    against the own calibration's prices."""
    out = {}
    for metric in METRICS:
        picked = [r for r in rows if r["metric"] == metric]
        out[metric] = {key: statistics.median(abs(r[key]) for r in picked)
                       for key in ("own_error", "transferred_error", "transferred_vs_own")}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slices", type=Path, nargs="+")
    parser.add_argument("--source", type=Path, required=True, help="the calibration to carry")
    parser.add_argument("--own", type=Path, required=True, help="the replays' model's own")
    parser.add_argument("--host-from-own", action="store_true",
                        help="carry the device terms alone; host terms from --own")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON")
    args = parser.parse_args(argv)
    own = load_calibration(args.own)
    moved = transfer(load_calibration(args.source), own.provenance.model,
                     host_from=own if args.host_from_own else None)
    print(f"own: {describe(own)}\ntransferred: {describe(moved)}")
    rows = [row for folder in args.slices for row in compare_slice(folder, own, moved)]
    print(f"{'slice':<42} {'run':<20} {'metric':<17} {'measured':>10} {'own':>8} "
          f"{'transf.':>8} {'vs own':>8}")
    for r in rows:
        print(f"{r['slice']:<42} {r['run']:<20} {r['metric']:<17} {r['measured']:>10.4g} "
              f"{r['own_error']:>+8.1%} {r['transferred_error']:>+8.1%} "
              f"{r['transferred_vs_own']:>+8.1%}")
    medians = summary(rows)
    for metric, values in medians.items():
        print(f"median |error| {metric}: own {values['own_error']:.1%}, transferred "
              f"{values['transferred_error']:.1%}; transferred vs own "
              f"{values['transferred_vs_own']:.1%}")
    if args.out is not None:
        args.out.write_text(json.dumps({"own": describe(own), "transferred": describe(moved),
                                        "rows": rows, "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
