"""Why replays' decode steps of 17-48 sequences run 7-9% over the profile's (one GPU, ~1 min).

    python benchmarks/decode_gap.py [--model llama-3.1-8b] [--rounds 3] [--long] [--out FILE]

The replays' steps.csv phases put the gap on the device span, not on the host (H200,
2026-11-30: Azure conv decode steps of 17-32 sequences 6.33 ms on the device for 24k keys, the profile's 32 x 1,024 uniform point 6.26 ms for 33k), and it holds at
low skew and whatever the time since the last prefill. What differs between the two is how the
engine is set up: the profile captures one graph per grid batch size with tables as wide as
the grid's longest sequence, on a pool just big enough for the grid, each sequence's blocks
side by side; a replay captures `capture_sizes(256)` (a batch runs padded to the next size)
with tables max_model_len wide (32,768 keys in the validation slices, 131,072 in the Azure
conv run), on a pool over most of the memory whose blocks the scheduler hands out scattered.

Each condition runs the same decode steps (uniform 32 and 48 x 1,024; 24, 32 and 40 sequences
of 200-2,000 keys, seeded), in rounds, conditions interleaved within a round so that a drift
of the machine hits all alike:
  A  the profile's setup (exact graphs, narrow tables, small pool, blocks side by side)
  B  the replays' graphs: capture_sizes(256), tables 32,768 keys wide
  C  B on a pool over 60% of free memory, blocks scattered at random
  D  capture_sizes(256), tables 131,072 keys wide (the model's full length)
`--long` runs Mooncake's decode steps instead: 9-32 sequences of 2,000-30,000 keys (seeded),
each step's KV under 270k tokens, so that it fits condition C's pool on an 80 GB GPU.
Prints each step's median per condition and its ratio to A; writes JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eager_gap import Lab, timed  # noqa: E402

from gpu_backend.engine.shapes import decode_shape, spread_decode_shape  # noqa: E402

SHAPES = {"uniform 32 x 1,024": decode_shape(32, 1024), "uniform 48 x 1,024": decode_shape(48, 1024),
          "24 of 200-2,000": spread_decode_shape(24, 200, 2000, seed=1),
          "32 of 200-2,000": spread_decode_shape(32, 200, 2000, seed=2),
          "40 of 200-2,000": spread_decode_shape(40, 200, 2000, seed=3)}
LONG_SHAPES = {"9 of 8,000-30,000": spread_decode_shape(9, 8000, 30000, seed=11),
               "16 of 6,000-24,000": spread_decode_shape(16, 6000, 24000, seed=12),
               "24 of 4,000-16,000": spread_decode_shape(24, 4000, 16000, seed=13),
               "32 of 2,000-14,000": spread_decode_shape(32, 2000, 14000, seed=14)}


def conditions(lab: Lab, shapes: dict) -> dict:
    """name -> (runner, pool blocks, scatter)."""
    import torch

    from gpu_backend.engine.graphs import capture_sizes
    from gpu_backend.engine.memory import dummy_store, kv_caches_of, kv_layout

    caches = lab.runner.kv_caches
    exact = tuple(sorted({len(s.decodes) for s in shapes.values()}))
    out = {"A profile": (lab.runner_on(caches, exact), None, False),
           "B replay graphs (32k tables)": (lab.runner_on(caches, capture_sizes(256), 32768),
                                            None, False)}
    free, _ = torch.cuda.mem_get_info(lab.engine.device)
    layout = kv_layout(lab.config.model, lab.block_size)
    blocks = int(0.6 * free // layout.block_bytes)
    big = kv_caches_of(dummy_store(lab.config.model, blocks, lab.block_size, lab.engine.device),
                       lab.config.model.num_layers)
    out["C B + big scattered pool"] = (lab.runner_on(big, capture_sizes(256), 32768), blocks, True)
    out["D replay graphs (128k tables)"] = (lab.runner_on(caches, capture_sizes(256), 131072),
                                            None, False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--long", action="store_true",
                        help="Mooncake's long-context decode steps instead of Azure conv's")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    shapes = LONG_SHAPES if args.long else SHAPES
    import torch

    if not torch.cuda.is_available():
        sys.exit("decode_gap needs a CUDA GPU")
    from gpu_backend.env import device_environment, write_result

    lab = Lab(args.model, extra_shapes=tuple(shapes.values()))
    setups = conditions(lab, shapes)
    steps = {(shape, cond): lab.step(shapes[shape], runner, blocks, scatter)
             for shape in shapes for cond, (runner, blocks, scatter) in setups.items()}
    times: dict[str, dict[str, list[float]]] = {s: {c: [] for c in setups} for s in shapes}
    for _ in range(args.rounds):
        for shape in shapes:
            for cond in setups:
                times[shape][cond].append(timed(steps[shape, cond]))
    result = {"env": device_environment(), "model": args.model, "rounds": args.rounds,
              "shapes": {s: list(shapes[s].decodes) for s in shapes}, "times_s": times}
    for shape, by_cond in times.items():
        base = statistics.median(by_cond["A profile"])
        print(shape)
        for cond, values in by_cond.items():
            median = statistics.median(values)
            print(f"  {cond:<32} {median * 1e3:7.3f} ms  {median / base:5.3f}x  "
                  f"(rounds {', '.join(f'{v * 1e3:.3f}' for v in values)})")
    name = "decode_gap_long" if args.long else "decode_gap"
    print(f"wrote {write_result(result, args.out, name, result['env']['gpu'])}")


if __name__ == "__main__":
    main()
