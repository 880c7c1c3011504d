"""Chunks over a cached prefix: the Triton prefill kernel timed alone, against the cost model.

A profile fits the attention's terms to its own grid's launches (gpu_backend.engine
.attention_profile), which hold few chunks over a long prefix. This times one layer's launch
of shapes outside that grid, one chunk of C new tokens over P cached keys for every C and P
below (and a few steps of several chunks), on the model's heads with its pool's blocks
shuffled, so a calibration's attention pricing can be judged on launches it was not fitted on.

    python benchmarks/prefix_attention.py [--model llama-3.1-8b] [--out PATH]     (GPU)
    python benchmarks/prefix_attention.py --report RESULT --calibration CAL [CAL ...]   (CPU)

`--report` prices every timed shape with each calibration (CostModel.step's attention, the
launch as one) and prints the relative error per shape, and its median, split into the
shapes with and without a prefix.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_backend.engine.shapes import StepShape, scheduler_output  # noqa: E402
from sim.core.calibration import load_calibration  # noqa: E402
from sim.core.catalog import get_gpu, get_model  # noqa: E402
from sim.core.cost_model import CostModel  # noqa: E402

CHUNKS = (256, 512, 1024, 2048, 4096)
PREFIXES = (0, 1024, 4096, 8192, 16384, 24576)
# steps of several chunks, as a busy engine packs them: (new, prefix) per sequence
MULTI = (((1024, 8192), (1024, 0)), ((512, 16384), (1536, 2048)),
         ((256, 4096), (256, 8192), (256, 12288), (256, 16384)),
         ((2048, 12288), (2048, 4096)))


def shapes() -> list[StepShape]:
    single = [StepShape("prefill", ((chunk, prefix),)) for chunk in CHUNKS for prefix in PREFIXES]
    return single + [StepShape("prefill", chunks) for chunks in MULTI]


def measure(model_name: str, reps: int) -> dict:
    from gpu_backend.engine.attention_profile import time_attention
    from gpu_backend.env import device_environment

    model = get_model(model_name)
    rows = []
    for shape in shapes():
        timed = time_attention(shape, model, reps)
        rows.append({**shape.describe(), **timed})
        print(f"{str(shape.prefills):60s} {timed['measured_s'] * 1e3:9.3f} ms", flush=True)
    return {"env": device_environment(), "model": model_name, "reps": reps,
            "what": "one layer's Triton prefill attention launch timed alone, times the layers",
            "shapes": rows}


def report(result: dict, calibrations: list[str]) -> int:
    rows = result["shapes"]
    outputs = [scheduler_output(StepShape.from_record(r)) for r in rows]
    measured = np.array([r["measured_s"] for r in rows])
    prefixed = np.array([any(p for _, p in r["prefills"]) for r in rows])
    print(f"{result['model']} on {result['env']['gpu']}, measured {result.get('measured_on')}: "
          f"{len(rows)} launches ({int(prefixed.sum())} with a prefix)")
    for path in calibrations:
        calibration = load_calibration(Path(path))
        data = calibration.data
        if data["model"] != result["model"]:
            print(f"{path}: a {data['model']} calibration, not {result['model']}: skipped")
            continue
        cost = CostModel(get_model(data["model"]), get_gpu(data["gpu_preset"]), 1,
                         calibration.parts()[0], attention_backend="triton")
        priced = np.array([cost.step(o).attention_s for o in outputs])
        error = priced / measured - 1.0
        print(f"\n{path}: median |error| {np.median(np.abs(error)):.1%} "
              f"(with a prefix {np.median(np.abs(error[prefixed])):.1%}, "
              f"without {np.median(np.abs(error[~prefixed])):.1%}); "
              f"sum of priced over measured {priced.sum() / measured.sum() - 1:+.1%}")
        for row, p, e in zip(rows, priced, error):
            print(f"  {str(row['prefills']):60s} {row['measured_s'] * 1e3:9.3f} ms  "
                  f"priced {p * 1e3:9.3f}  {e:+6.1%}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None, metavar="RESULT",
                        help="price a saved result's shapes (CPU)")
    parser.add_argument("--calibration", nargs="+", default=[])
    args = parser.parse_args(argv)
    if args.report is not None:
        if not args.calibration:
            parser.error("--report needs --calibration")
        return report(json.loads(args.report.read_text()), args.calibration)
    from gpu_backend.env import write_result

    result = measure(args.model, args.reps)
    out = write_result(result, args.out, "prefix_attention", result["env"]["gpu"], args.model)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
