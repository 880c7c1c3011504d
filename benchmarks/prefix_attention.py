"""Chunks over a cached prefix: the Triton prefill kernel timed alone, against the cost model.

A profile fits the attention's terms to its own grid's launches (gpu_backend.engine
.attention_profile), which hold few chunks over a long prefix. This times one layer's launch
of shapes outside that grid, one chunk of C new tokens over P cached keys for every C and P
below (and a few steps of several chunks), on the model's heads with its pool's blocks
shuffled, so a calibration's attention pricing can be judged on launches it was not fitted on.
It also times the launches of engine_bench's 16,384-token prompt at chunks of 2,048, 8,192
and 16,384 (each chunk over the prompt before it), and samples the SM clock and board power
while each shape is timed (`gpu_backend.env.ClockSampler`).

    python benchmarks/prefix_attention.py [--model llama-3.1-8b] [--out PATH]     (GPU)
    python benchmarks/prefix_attention.py --report RESULT --calibration CAL [CAL ...]   (CPU)
    python benchmarks/prefix_attention.py --report RESULT --in-step STEP_BREAKDOWN      (CPU)

`--report` prices every timed shape with each calibration (CostModel.step's attention, the
launch as one) and prints the relative error per shape, and its median, split into the
shapes with and without a prefix. `--in-step` sets the prompt's launches timed alone, summed
per chunk size, against the same prompt's attention kernels inside the engine's steps
(benchmarks/step_breakdown.py's `chunked_prompt`, CUPTI kernel records, without decode rows),
beside the SM clock each ran at where both results sampled it.
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
PROMPT = 16384  # engine_bench's and step_breakdown's prompt
PROMPT_CHUNKS = (2048, 8192, 16384)
IN_STEP_CLASS = "attention (Triton)"  # step_breakdown's kernel class of this kernel


def shapes() -> list[StepShape]:
    single = [StepShape("prefill", ((chunk, prefix),)) for chunk in CHUNKS for prefix in PREFIXES]
    return single + [StepShape("prefill", chunks) for chunks in MULTI]


def prompt_shapes(chunk: int, prompt: int = PROMPT) -> list[StepShape]:
    """The launches of a `prompt`-token prompt prefilled alone in chunks of `chunk`."""
    return [StepShape("prefill", ((min(chunk, prompt - start), start),))
            for start in range(0, prompt, chunk)]


def _timed(shapes: list[StepShape], model, reps: int) -> list[dict]:
    from gpu_backend.engine.attention_profile import time_attention
    from gpu_backend.env import ClockSampler

    rows = []
    for shape in shapes:
        with ClockSampler() as clocks:
            timed = time_attention(shape, model, reps)
        rows.append({**shape.describe(), **timed, **clocks.summary()})
        mhz = rows[-1].get("sm_clock_mhz")
        print(f"{str(shape.prefills):60s} {timed['measured_s'] * 1e3:9.3f} ms"
              + (f"  {mhz:6.0f} MHz" if mhz else ""), flush=True)
    return rows


def measure(model_name: str, reps: int) -> dict:
    from gpu_backend.env import device_environment

    model = get_model(model_name)
    return {"env": device_environment(), "model": model_name, "reps": reps,
            "what": "one layer's Triton prefill attention launch timed alone, times the layers",
            "shapes": _timed(shapes(), model, reps),
            "prompt_chunks": {str(c): _timed(prompt_shapes(c), model, reps)
                              for c in PROMPT_CHUNKS}}


def _clock(rows: list[dict]) -> str:
    mhz = [r["sm_clock_mhz"] for r in rows if r.get("sm_clock_mhz")]
    return f"{np.median(mhz):,.0f} MHz" if mhz else "-"


def in_step(result: dict, breakdown: dict) -> int:
    """The prompt's launches timed alone against its attention inside the engine's steps."""
    chunks = result.get("prompt_chunks")
    if not chunks:
        print("the result holds no prompt_chunks (timed before they were added): nothing to set "
              "against the steps")
        return 1
    if breakdown.get("model") != result["model"]:
        print(f"the step breakdown is of {breakdown.get('model')}, not {result['model']}")
        return 1
    gpus = (result["env"].get("gpu"), (breakdown.get("env") or {}).get("gpu"))
    if gpus[0] != gpus[1]:
        print(f"the step breakdown ran on {gpus[1]}, the launches alone on {gpus[0]}: "
              "set a GPU's launches against its own steps")
        return 1
    print(f"the {PROMPT:,}-token prompt's attention, timed alone ({result['env']['gpu']}, "
          f"{result.get('measured_on')}) against inside the engine's steps "
          f"({breakdown['env']['gpu']}, {breakdown.get('measured_on')}, "
          f"{breakdown.get('attention_backend')} backend)")
    print(f"  {'chunk':>6} {'alone ms':>9} {'alone clock':>12} {'in steps ms':>12} "
          f"{'launched ahead ms':>18} {'in steps / alone':>17}")
    for chunk, rows in chunks.items():
        alone_ms = 1e3 * sum(r["measured_s"] for r in rows)
        steps = [(breakdown.get(key) or {}).get(f"chunk {chunk}, 0 decodes", {}).get("classes_ms", {})
                 .get(IN_STEP_CLASS) for key in ("chunked_prompt", "chunked_prompt_launched_ahead")]
        shown = ["-" if ms is None else f"{ms:.1f}" for ms in steps]
        ratio = "-" if steps[1] is None else f"{steps[1] / alone_ms:.3f}"
        print(f"  {int(chunk):>6,} {alone_ms:9.1f} {_clock(rows):>12} {shown[0]:>12} "
              f"{shown[1]:>18} {ratio:>17}")
    return 0


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
    parser.add_argument("--in-step", type=Path, default=None, metavar="STEP_BREAKDOWN",
                        help="with --report: set the prompt's launches against "
                             "step_breakdown.py's result of the same model")
    args = parser.parse_args(argv)
    if args.report is not None:
        if not args.calibration and args.in_step is None:
            parser.error("--report needs --calibration or --in-step")
        result = json.loads(args.report.read_text())
        code = report(result, args.calibration) if args.calibration else 0
        return code or (in_step(result, json.loads(args.in_step.read_text()))
                        if args.in_step is not None else 0)
    from gpu_backend.env import write_result

    result = measure(args.model, args.reps)
    out = write_result(result, args.out, "prefix_attention", result["env"]["gpu"], args.model)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
