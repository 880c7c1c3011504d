"""The cost model against engine_bench's chunk-size curves: data no calibration is fitted on.

    .venv/bin/python benchmarks/chunk_curve_model.py [--result FILE] [--calibration FILE]
        [--attention-backend auto] [--async-scheduling]

engine_bench.py times a prompt prefilled chunk by chunk, alone and beside decode rows, on
each attention backend (`chunk_curve`, `chunk_curve_<backend>`). This prices the same steps
with `CostModel.step` (each chunk over the prefix before it, the decodes at engine_bench's
context) under a calibration, and prints measured and predicted TTFT per point, their ratio,
and the chunk penalty (TTFT at each chunk over the largest chunk's) both ways. With
`--async-scheduling`, the curve timed with each step launched ahead (`chunk_curve_async`,
engine_bench --async-scheduling) against the cost model's async pricing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from gpu_backend.engine.shapes import prompt_shapes, scheduler_output  # noqa: E402
from sim.core.calibration import load_calibration  # noqa: E402
from sim.core.catalog import get_gpu, get_model  # noqa: E402
from sim.core.cost_model import CostModel  # noqa: E402
from sim.core.split_shapes import ATTENTION_BACKENDS  # noqa: E402

RESULT = Path("benchmarks/results/engine_nvidia-h200-llama-3-1-8b-attention-triton-split-auto.json")
DECODE_CONTEXT = 1024  # engine_bench_cases.DECODE_CONTEXT: the decode rows' context


def predicted_ttft(cost: CostModel, prompt: int, chunk: int, num_decodes: int) -> float:
    """Sum of the step times of `prompt` prefilled `chunk` tokens a step
    (engine_bench_cases.ttft)."""
    return sum(cost.step(scheduler_output(shape)).total_s
               for shape in prompt_shapes(prompt, chunk, num_decodes, DECODE_CONTEXT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result", type=Path, default=RESULT, help="engine_bench result JSON")
    parser.add_argument("--calibration", default="calibration/h200/llama-3.1-8b-auto.json")
    parser.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS)
    parser.add_argument("--async-scheduling", action="store_true",
                        help="the curve timed launched ahead, priced as async scheduling")
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text())
    key = "chunk_curve_async" if args.async_scheduling else "chunk_curve"
    if args.attention_backend != result.get("attention_backends", ["triton"])[0]:
        key = f"{key}_{args.attention_backend}"  # engine_bench names the first backend's plain
    if key not in result:
        print(f"error: {args.result} has no {key}", file=sys.stderr)
        return 2
    calibration = load_calibration(args.calibration)
    cost = CostModel(get_model(result["model"]), get_gpu(calibration.provenance.gpu_preset
                                                          or "h200"),
                     1, calibration.efficiency, attention_backend=args.attention_backend,
                     host_hidden=args.async_scheduling,
                     # the split the curve ran with; a result without it ran one launch
                     mixed_split_min_keys=result.get("mixed_split_min_keys", 0))
    rows = result[key]
    print(f"{args.result.name} {key}, priced with {args.calibration}")
    print(f"{'prompt':>7} {'decodes':>7} {'chunk':>6} {'measured s':>11} {'model s':>9} "
          f"{'model/meas':>10} {'penalty meas':>12} {'penalty model':>13}")
    for num_decodes in sorted({r["num_decodes"] for r in rows}):
        curve = [r for r in rows if r["num_decodes"] == num_decodes]
        largest = max(curve, key=lambda r: r["chunk"])
        base = predicted_ttft(cost, largest["prompt"], largest["chunk"], num_decodes)
        for r in curve:
            model = predicted_ttft(cost, r["prompt"], r["chunk"], num_decodes)
            print(f"{r['prompt']:>7} {num_decodes:>7} {r['chunk']:>6} {r['ttft_s']:>11.4f} "
                  f"{model:>9.4f} {model / r['ttft_s']:>10.3f} "
                  f"{r['ttft_s'] / largest['ttft_s'] - 1:>+12.1%} {model / base - 1:>+13.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
