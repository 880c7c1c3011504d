"""Would pricing each replay's host speed make the model better? (CPU, a few minutes)

    python benchmarks/host_scaling.py [SLICE ...] [--out FILE]

Every replay records a host probe (a fixed Python loop, `measured.host_probe` in its summary)
and so does the profile that prices it (`host_probe` in the calibration). This simulates every
single-GPU run of the committed evidence twice: with its calibration as it is, and with the
calibration's host terms (`sim.core.efficiency.HOST_TERMS` and the host gap) scaled by the
run's probe over the profile's (`host_slower`). The scaling has no fitted parameter, so every
run is data it was not fitted on. It pays if the targets' errors shrink.

Prints, per metric, the median |error| over all runs and over the runs whose host was more than
20% off the profile's, and in how many of those the scaling helped; writes every run's errors
as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from sim.core.calibration import load_calibration  # noqa: E402
from sim.core.efficiency import host_slower  # noqa: E402
from validation.evidence import EVIDENCE_DIR, ROOT, load_runs, read_recipe  # noqa: E402
from validation.pipeline import compare_run  # noqa: E402

METRICS = ("ttft_p50_s", "tpot_p50_s", "throughput_tok_s", "ttft_p99_s")
FAR = 0.2  # a host this far from the profile's, either way, counts as moved


def run_errors(folder: Path) -> list[dict]:
    """Each run of the slice in `folder`: its probe ratio and each metric's relative error
    (as priced, with the host terms scaled). None where a probe is missing."""
    recipe = read_recipe(folder)
    calibration = load_calibration(ROOT / recipe.calibration)
    efficiency, profile, vmm_costs = calibration.parts()
    profile_probe = (calibration.data.get("host_probe") or {}).get("median_s")
    rows = []
    for run in load_runs(folder):
        probe = ((run.summary.get("measured") or {}).get("host_probe") or {}).get("median_s")
        if not (profile_probe and probe):
            continue
        ratio = probe / profile_probe
        as_is = compare_run(run, efficiency, profile, recipe.trace_slice, None, vmm_costs,
                            sensitivity=False)
        scaled = compare_run(run, host_slower(efficiency, ratio), profile, recipe.trace_slice,
                             None, vmm_costs, sensitivity=False)
        rows.append({"slice": folder.name, "run": run.label, "host_ratio": ratio,
                     **{m: [as_is.metrics[m]["relative_error"],
                            scaled.metrics[m]["relative_error"]] for m in METRICS}})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slices", nargs="*", help="evidence slices (default: every single-GPU one)")
    parser.add_argument("--out", type=Path, help="write every run's errors here (JSON)")
    args = parser.parse_args(argv)
    names = args.slices or sorted(p.name for p in EVIDENCE_DIR.iterdir()
                                  if (p / "slice.json").is_file() and "x2_" not in p.name)
    rows = []
    for name in names:
        rows += run_errors(EVIDENCE_DIR / name)
        print(f"{name}: {sum(r['slice'] == name for r in rows)} runs", file=sys.stderr)
    far = [r for r in rows if abs(r["host_ratio"] - 1.0) > FAR]
    print(f"{len(rows)} runs; {len(far)} with the host more than {FAR:.0%} off the profile's")
    print("metric | median |error| as priced -> host-scaled | host moved: as priced -> scaled, "
          "scaled better in")
    for m in METRICS:
        def med(sample: list[dict], which: int, metric: str = m) -> float:
            return 100 * statistics.median(abs(r[metric][which]) for r in sample)
        better = sum(abs(r[m][1]) < abs(r[m][0]) for r in far)
        print(f"{m} | {med(rows, 0):.2f}% -> {med(rows, 1):.2f}% | "
              f"{med(far, 0):.2f}% -> {med(far, 1):.2f}%, {better} of {len(far)}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
