"""Would another way of pricing the host make the model better? (CPU, under a minute each)

    python benchmarks/pricing_variants.py host-scaled [SLICE ...] [--out FILE]
    python benchmarks/pricing_variants.py ahead-fit [SLICE ...] [--out FILE]
    python benchmarks/pricing_variants.py ahead-gap [SLICE ...] [--out FILE]
    python benchmarks/pricing_variants.py decode-gap --decode-seqs N [SLICE ...] [--out FILE]
    python benchmarks/pricing_variants.py VARIANT --calibration FILE SLICE ... [--out FILE]

Each variant prices every run of the committed evidence (single-GPU slices; `ahead-fit` and
`ahead-gap`: the async ones) both ways, the calibration as it is and the variant, and compares
both with the measurement. No variant fits anything to the replays, so every run is data it
was not fitted on; a variant pays if the targets' errors shrink.

- `host-scaled`: every replay records a host probe (a fixed Python loop,
  `measured.host_probe` in its summary), and so does the profile that prices it. The
  calibration's host terms (`sim.core.efficiency.HOST_TERMS` and the host gap) are scaled by
  the run's probe over the profile's (`host_slower`).
- `ahead-fit`: the model prices an async step as its synchronous time less the host gap
  (`Efficiency.host_gap_s`). The profile also times every grid step launched back to back
  (`ahead_s`, the period async scheduling runs it at). The variant refits the calibration's
  grid to those periods (`gpu_backend refit` on ahead_s, no host gap taken off) and prices
  the async runs with that fit.
- `ahead-gap`: the calibration as fitted, but the host gap async scheduling takes off each step
  is the grid's median synchronous time less its back-to-back period (`measured_s - ahead_s`)
  instead of its synchronous time less its device span: what the profile's steps shed when
  launched ahead, device waits for the host inside a step included.
- `decode-gap`: the calibration as fitted, but what a decode-only step sheds under async
  scheduling (`Efficiency.decode_host_gap_s`, taken over the grid's decode steps of at most
  8 sequences) taken over those of at most `--decode-seqs` sequences; 0: none, each decode
  step hiding `host_gap_s` as every other step does.
- `--calibration FILE`: the variant is built from FILE instead of each slice's own calibration
  (its activation profile and transition costs too), e.g. a profile taken with `--replay-setup`;
  the variant `as-fitted` prices with FILE as it is. The first column stays the slice's own.

Prints, per metric, the median |error| over the runs both ways and in how many runs the
variant did better, then the runs whose host was more than 20% off the profile's, and the
slice targets (median over a slice's runs) each way misses; writes every run's errors as JSON
with --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from gpu_backend.engine.calibrate import refit_calibration  # noqa: E402
from sim.core.calibration import load_calibration, parse_calibration  # noqa: E402
from sim.core.efficiency import (  # noqa: E402
    SMALL_DECODE_SEQS,
    Efficiency,
    host_slower,
    measured_decode_gap_s,
    measured_host_gap_s,
)
from validation.compare import TARGETS as VALIDATION_TARGETS  # noqa: E402
from validation.evidence import EVIDENCE_DIR, ROOT, load_runs, read_recipe, slice_folders  # noqa: E402
from validation.pipeline import compare_run  # noqa: E402
from validation.run_config import engine_config  # noqa: E402

# the validation's targets on these metrics (each a median over a slice's runs)
TARGETS = {t.metric: t.limit for t in VALIDATION_TARGETS
           if t.metric in ("ttft_p50_s", "tpot_p50_s", "throughput_tok_s", "ttft_p99_s")}
FAR = 0.2  # a host this far from the profile's, either way, counts as moved


def ahead_fit(data: dict, source: str) -> Efficiency | None:
    """The calibration `data` refitted to its grid's back-to-back periods (None: its profile
    timed none). The periods hold the host's share already, so no host gap is taken off."""
    if not any(m.get("ahead_s") for m in data["measurements"]):
        return None
    periods = copy.deepcopy(data)
    for m in periods["measurements"]:
        if m.get("ahead_s"):
            m["measured_s"] = m["ahead_s"]
    fitted = parse_calibration(refit_calibration(periods), source).parts()[0]
    return replace(fitted, host_gap_s=0.0)


def ahead_gap(data: dict, efficiency: Efficiency) -> Efficiency | None:
    """`efficiency` with the host gap its grid's steps shed launched back to back (the median
    of `measured_s - ahead_s`; None: its profile timed none)."""
    shed = measured_host_gap_s(data["measurements"], less="ahead_s")
    return None if shed is None else replace(efficiency, host_gap_s=shed)


def decode_gap(data: dict, efficiency: Efficiency, most_seqs: int) -> Efficiency | None:
    """`efficiency` with the decode gap of its grid's decode steps of at most `most_seqs`
    sequences (None: its profile timed none launched ahead); 0: none, decode steps hiding the
    host gap as every other step."""
    if most_seqs == 0:
        return replace(efficiency, decode_host_gap_s=None)
    shed = measured_decode_gap_s(data["measurements"], most_seqs)
    return None if shed is None else replace(efficiency, decode_host_gap_s=shed)


ASYNC_VARIANTS = ("ahead-fit", "ahead-gap", "decode-gap")


def async_variant(variant: str, data: dict, efficiency: Efficiency,
                  source: str, decode_seqs: int = SMALL_DECODE_SEQS) -> Efficiency | None:
    """The efficiency an async-only variant prices with (None: the calibration lacks the
    back-to-back periods it needs)."""
    if variant == "ahead-fit":
        return ahead_fit(data, source)
    if variant == "decode-gap":
        return decode_gap(data, efficiency, decode_seqs)
    return ahead_gap(data, efficiency)


def slice_errors(folder: Path, variant: str, calibration_path: Path | None = None,
                 decode_seqs: int = SMALL_DECODE_SEQS) -> list[dict]:
    """Each run of the slice in `folder` the variant applies to: its host probe ratio and each
    metric's relative error, as priced (the slice's calibration) and with the variant (of
    `calibration_path`'s calibration where given, its activation profile and transition costs
    too; else of the slice's own)."""
    recipe = read_recipe(folder)
    shipped = load_calibration(ROOT / recipe.calibration)
    base = shipped if calibration_path is None else load_calibration(calibration_path)
    source = recipe.calibration if calibration_path is None else str(calibration_path)
    profile_probe = (base.data.get("host_probe") or {}).get("median_s")
    async_only = variant in ASYNC_VARIANTS
    refitted = (async_variant(variant, base.data, base.efficiency, source, decode_seqs)
                if async_only else base.efficiency)
    if refitted is None:
        return []
    rows = []
    for run in load_runs(folder):
        if async_only and not engine_config(run.summary).async_scheduling:
            continue
        probe = ((run.summary.get("measured") or {}).get("host_probe") or {}).get("median_s")
        ratio = probe / profile_probe if probe and profile_probe else None
        if variant == "host-scaled" and ratio is None:
            continue
        other = host_slower(refitted, ratio) if variant == "host-scaled" else refitted
        as_is = price(run, shipped.parts(), recipe)
        varied = price(run, (other, *base.parts()[1:]), recipe)
        rows.append({"slice": folder.name, "run": run.label, "host_ratio": ratio,
                     **{m: [as_is[m], varied[m]] for m in TARGETS}})
    return rows


def price(run, parts: tuple, recipe) -> dict[str, float]:
    """Each target metric's relative error of `run` priced by (efficiency, activation
    profile, transition costs)."""
    efficiency, profile, vmm_costs = parts
    metrics = compare_run(run, efficiency, profile, recipe.trace_slice, None, vmm_costs,
                          sensitivity=False).metrics
    return {m: metrics[m]["relative_error"] for m in TARGETS}


def summarize(rows: list[dict]) -> None:
    def med(sample: list[dict], metric: str, which: int) -> float:
        return 100 * statistics.median(abs(r[metric][which]) for r in sample)

    far = [r for r in rows if r["host_ratio"] is not None and abs(r["host_ratio"] - 1.0) > FAR]
    print(f"{len(rows)} runs; {len(far)} with the host more than {FAR:.0%} off the profile's")
    print("metric | median |error| as priced -> variant, variant better in | host moved: "
          "as priced -> variant")
    for m in TARGETS:
        better = sum(abs(r[m][1]) < abs(r[m][0]) for r in rows)
        moved = f"{med(far, m, 0):.2f}% -> {med(far, m, 1):.2f}%" if far else "-"
        print(f"{m} | {med(rows, m, 0):.2f}% -> {med(rows, m, 1):.2f}%, {better} of "
              f"{len(rows)} | {moved}")
    slices = sorted({r["slice"] for r in rows})
    missed = [0, 0]
    for name in slices:
        runs = [r for r in rows if r["slice"] == name]
        for m, limit in TARGETS.items():
            for which in (0, 1):
                missed[which] += statistics.median(abs(r[m][which]) for r in runs) > limit
    print(f"slice targets missed (median over a slice's runs, {len(slices)} slices x "
          f"{len(TARGETS)}): as priced {missed[0]}, variant {missed[1]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=("host-scaled", *ASYNC_VARIANTS, "as-fitted"))
    parser.add_argument("slices", nargs="*", help="evidence slices (default: every single-GPU one)")
    parser.add_argument("--calibration", type=Path,
                        help="build the variant from this calibration instead of each slice's "
                             "own (as-fitted: price with it as it is)")
    parser.add_argument("--out", type=Path, help="write every run's errors here (JSON)")
    parser.add_argument("--decode-seqs", type=int, default=SMALL_DECODE_SEQS, metavar="N",
                        help="decode-gap: the largest decode batch whose shed it takes "
                             f"(default {SMALL_DECODE_SEQS}, as the model)")
    args = parser.parse_intermixed_args(argv)
    names = args.slices or [f.name for f in slice_folders() if "x2_" not in f.name]
    rows = []
    for name in names:
        found = slice_errors(EVIDENCE_DIR / name, args.variant, args.calibration,
                             args.decode_seqs)
        rows += found
        print(f"{name}: {len(found)} runs", file=sys.stderr)
    if not rows:
        print("no run to compare", file=sys.stderr)
        return 1
    summarize(rows)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
