"""What the step after an elastic reclaim pays, and for what (one CUDA GPU, ~1 minute).

    python benchmarks/reclaim_step.py [--model llama-3.1-8b] [--gpu h100] [--rounds 30]

On a trace that lends and reclaims often (Azure conversations: about five round trips a
second) the engine's mixed steps right after a reclaim run longer than the same steps of a
static run (docs/engine.md, "Azure conv on the Triton path"). Two things set that step apart
under async scheduling, and this times each alone:

- **exposed**: before an elastic action the engine waits for the step in flight, so the step
  after it is launched with nothing running (its host work hides behind nothing);
- **exposed, cache emptied**: release mode's lend also hands torch's cached blocks back
  (`torch.cuda.empty_cache()`, gpu_backend/engine/elastic.py), so the step after the next
  reclaim allocates its activations from the driver again.

The step: a new prompt of `--prompt` tokens beside `--decodes` decodes of 1,024 keys, eager
(the engine's mixed step), after one decode step of the same decodes (a CUDA graph). Each
round times it three ways, in turn: **async** (launched while the decode step runs, as the
engine's steady state; timed from the later of the decode step's end and its own launch),
**exposed** (the decode step collected first; timed from its launch) and **exposed, cache
emptied** (the same after `empty_cache`, whose own time is a transition's and is reported
apart). Per way: the median step time, the host's enqueue time, the device span, and the
driver allocations (`num_device_alloc`) the step made.

Writes JSON (benchmarks/results/reclaim_step_<gpu>_<model>[_prompt-N][_decodes-N].json by
default) and prints the medians and their ratios to the async step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from engine_bench import DECODE_CONTEXT, prompt_batches  # noqa: E402

from gpu_backend.engine.memory import dummy_store, kv_caches_of  # noqa: E402
from gpu_backend.engine.runner import DecodeGraphs, ModelRunner  # noqa: E402
from gpu_backend.engine.setup import load_model  # noqa: E402
from gpu_backend.engine.shapes import decode_shape, host_batch  # noqa: E402
from gpu_backend.env import device_environment, write_result  # noqa: E402
from sim.core.catalog import get_gpu, get_model  # noqa: E402
from sim.core.engine_config import EngineConfig  # noqa: E402

WAYS = ("async", "exposed", "exposed, cache emptied")
PROMPT = 205  # the mixed step's new tokens by default: Azure conv's median prompt
DECODES = 16


def device_allocs() -> int:
    """cudaMalloc calls torch's allocator has made so far."""
    return int(torch.cuda.memory_stats().get("num_device_alloc", 0))


def time_once(runner: ModelRunner, decode, mixed, way: str) -> dict:
    """One decode step, then the mixed step the `way` says; the mixed step's seconds (as the
    engine measures a step), its phases and the driver allocations it made."""
    before = runner.launch(decode)
    empty_s = 0.0
    if way == "async":
        allocs = device_allocs()
        start = time.perf_counter()
        step = runner.launch(mixed)
        before.collect()
        step.collect()
        assert before.done_t is not None and step.done_t is not None
        seconds = step.done_t - max(before.done_t, start)
    else:
        before.collect()
        if way == "exposed, cache emptied":
            t0 = time.perf_counter()
            torch.cuda.empty_cache()
            empty_s = time.perf_counter() - t0
        allocs = device_allocs()
        start = time.perf_counter()
        step = runner.launch(mixed)
        step.collect()
        assert step.done_t is not None
        seconds = step.done_t - start
    return {"step_s": seconds, "enqueue_s": step.phases.enqueue_s,
            "span_s": step.phases.device_s, "device_allocs": device_allocs() - allocs,
            "empty_cache_s": empty_s}


def summarize(samples: list[dict]) -> dict:
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=PROMPT,
                        help="the mixed step's new prompt tokens (default: Azure conv's median)")
    parser.add_argument("--decodes", type=int, default=DECODES)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("reclaim_step needs a CUDA GPU")
    spec, bs = get_model(args.model), args.block_size
    max_len = DECODE_CONTEXT + args.prompt + bs
    config = EngineConfig(spec, get_gpu(args.gpu), max_model_len=max_len, block_size=bs)
    cuda = torch.device("cuda")
    model = load_model(config, cuda, seed=0)
    num_blocks = 1 + (args.decodes + 1) * (max_len // bs + 1)
    caches = kv_caches_of(dummy_store(spec, num_blocks, bs, cuda), spec.num_layers)
    graphs = DecodeGraphs(model, caches, args.decodes, max_len, bs, cuda, (args.decodes,))
    graphs.capture()
    runner = ModelRunner(model, caches, cuda, graphs)
    decode = host_batch(decode_shape(args.decodes, DECODE_CONTEXT), bs, num_blocks)
    (mixed,) = prompt_batches(bs, num_blocks, args.prompt, args.prompt, args.decodes)

    for way in WAYS * 3:  # warm-up: kernels compiled, torch's cache filled
        time_once(runner, decode, mixed, way)
    samples: dict[str, list[dict]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):  # the ways in turn, so drift touches each alike
        for way in WAYS:
            samples[way].append(time_once(runner, decode, mixed, way))
    medians = {way: summarize(rows) for way, rows in samples.items()}
    base = medians["async"]["step_s"]
    print(f"{spec.name}, mixed step of {args.prompt} new tokens beside {args.decodes} decodes "
          f"of {DECODE_CONTEXT} keys, {args.rounds} rounds, medians:")
    print(f"{'':24s} {'step ms':>8s} {'x async':>8s} {'enqueue ms':>11s} {'span ms':>8s} "
          f"{'allocs':>7s} {'empty_cache ms':>15s}")
    for way, m in medians.items():
        print(f"{way:24s} {m['step_s'] * 1e3:8.2f} {m['step_s'] / base:8.3f} "
              f"{m['enqueue_s'] * 1e3:11.2f} {m['span_s'] * 1e3:8.2f} {m['device_allocs']:7.0f} "
              f"{m['empty_cache_s'] * 1e3:15.2f}")
    res = {"env": device_environment(), "model": spec.name, "prompt_tokens": args.prompt,
           "num_decodes": args.decodes, "decode_context": DECODE_CONTEXT,
           "rounds": args.rounds, "medians": medians, "samples": samples}
    shape = [f"prompt-{args.prompt}"] if args.prompt != PROMPT else []
    shape += [f"decodes-{args.decodes}"] if args.decodes != DECODES else []
    path = write_result(res, args.out, "reclaim_step", res["env"]["gpu"], spec.name, *shape)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
