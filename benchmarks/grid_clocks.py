"""The SM clock, power and energy of a profile's grid steps, beside the fit's error on each.

`python -m gpu_backend profile` reads the clock and power through NVML while each grid step
runs back to back (`gpu_backend.env.per_step_clocks`: `ahead_sm_clock_mhz`, `ahead_power_w`,
`ahead_power_capped_share`, `ahead_energy_j`). This prints them per grid step, grouped by
class of step, with the whole-step fit's error on that step (the file's `fit_error`), and the
median clock of each class: which steps the fitted rates were timed at the board's power cap,
and at what clock.

The sampled power is the board's running average (about a second on Hopper), so a short step
reads the steps before it; its power is shown from the energy counter instead, and only where
the steps ran a second or more together (the counter moves in steps too coarse for less).

    python benchmarks/grid_clocks.py PROFILE_JSON          (CPU; a profile or calibration)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_backend.env import grid_clocks  # noqa: E402
from sim.core.calibration import read_json  # noqa: E402

STEPS_PER_POINT = 8  # time_step_ahead's launches at the profile's defaults (2 + 5 + 1)
MIN_ENERGY_SPAN_S = 1.0  # the least time the steps ran together for their energy to be shown


def step_class(record: dict) -> str:
    """A grid step's class: decode, prefill (no decode rows) or mixed; for those with prefill
    tokens whether they hold 2,000 new tokens or more, and whether a chunk runs over a prefix
    of 4,096 keys or more (its attention then outweighs its share of the matmuls)."""
    if record["kind"] == "decode":
        return "decode"
    tokens = sum(c for c, _ in record["prefills"])
    over_prefix = any(p >= 4096 for _, p in record["prefills"])
    return (f"{record['kind']}, {'2,000+' if tokens >= 2000 else 'under 2,000'} tokens"
            + (", over a 4k+ prefix" if over_prefix else ""))


def rows(data: dict) -> list[dict]:
    """One row per grid step: its class and shape, period, clock, capped share, power from
    the energy counter (None where the steps ran under MIN_ENERGY_SPAN_S together) and the
    fit's error on it."""
    errors = data.get("fit_error", {}).get("per_point_rel") or []
    out = []
    for i, m in enumerate(data["measurements"]):
        mhz = m.get("ahead_sm_clock_mhz", math.nan)
        if math.isnan(mhz):
            continue
        span = m["ahead_s"] * STEPS_PER_POINT
        energy = m.get("ahead_energy_j", math.nan)
        power = (energy / m["ahead_s"] if span >= MIN_ENERGY_SPAN_S and not math.isnan(energy)
                 else None)
        out.append({"class": step_class(m), "prefills": m["prefills"],
                    "decodes": m.get("decode_groups") or [], "ahead_ms": m["ahead_s"] * 1e3,
                    "mhz": mhz, "capped": m["ahead_power_capped_share"], "power_w": power,
                    "fit_error": errors[i] if i < len(errors) else None})
    return out


def report(data: dict) -> int:
    table = rows(data)
    if not table:
        print("no grid step of this file records its clock (profiled before it was sampled, "
              "or without NVML)")
        return 1
    env = data.get("provenance", {})
    print(f"{data['model']} on {data['gpu']}, measured {env.get('measured_on')}: "
          f"{grid_clocks(data['measurements'])}")
    print(f"{'class':46s} {'step':36s} {'ms':>8s} {'MHz':>6s} {'capped':>6s} {'W':>5s} "
          f"{'fit':>7s}")
    for cls in sorted({r["class"] for r in table}):
        members = [r for r in table if r["class"] == cls]
        for r in members:
            shape = f"{r['prefills']} {r['decodes']}" if r["decodes"] else str(r["prefills"])
            power = f"{r['power_w']:5.0f}" if r["power_w"] is not None else "    -"
            error = f"{r['fit_error']:+7.1%}" if r["fit_error"] is not None else "      -"
            print(f"{cls:46s} {shape[:36]:36s} {r['ahead_ms']:8.2f} {r['mhz']:6.0f} "
                  f"{r['capped']:6.2f} {power} {error}")
        print(f"{'':46s} {'median clock of the class':36s} {'':8s} "
              f"{statistics.median(r['mhz'] for r in members):6.0f}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    args = parser.parse_args(argv)
    try:
        data = read_json(args.profile)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return report(data)


if __name__ == "__main__":
    sys.exit(main())
