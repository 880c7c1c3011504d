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

and then the reclaim itself, on a real release-mode ElasticKVPool holding `--reserve-mib` of
reserve (lent before each round, after torch's cache is emptied, as the engine's lend does):

- **reclaimed, waiting**: the decode step collected, the reserve detached (the pool
  synchronizes, unmaps and releases), then the mixed step launched: the engine with
  `--no-detach-behind-step`. Its time is the detach's plus the step's;
- **reclaimed behind the step**: the reserve detached without waiting while the decode step
  runs (it holds no elastic block), then the mixed step launched behind it: the engine's
  default. Timed from before the detach, as the engine times it.

The step: a new prompt of `--prompt` tokens beside `--decodes` decodes of 1,024 keys, eager
(the engine's mixed step), after one decode step of the same decodes (a CUDA graph). Each
round times it three ways, in turn: **async** (launched while the decode step runs, as the
engine's steady state; timed from the later of the decode step's end and its own launch),
**exposed** (the decode step collected first; timed from its launch) and **exposed, cache
emptied** (the same after `empty_cache`, whose own time is a transition's and is reported
apart). Per way: the median step time, the host's enqueue time, the device span, and the
driver allocations (`num_device_alloc`) the step made; and the decode step's own time, from
its launch to its end on the device (`decode_s`): with the reserve detached behind it, how
long the unmap held it back (the replays' decode steps with a detach behind them ran
0.50-1.17 of its time longer on Llama-3.1-8B, `benchmarks/detach_behind.py`).

Writes JSON (benchmarks/results/reclaim_step_<gpu>_<model>[-prompt-N][-decodes-N][-reserve-N].json by
default) and prints the medians and their ratios to the async step (`total_s`: the detach's
time where the engine's clock adds it, plus the step's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from engine_bench import DECODE_CONTEXT, prompt_batches  # noqa: E402

from gpu_backend.engine.inputs import HostBatch  # noqa: E402
from gpu_backend.engine.memory import dummy_store, kv_caches_of, kv_layout  # noqa: E402
from gpu_backend.engine.runner import DecodeGraphs, ModelRunner  # noqa: E402
from gpu_backend.engine.setup import load_model  # noqa: E402
from gpu_backend.engine.shapes import decode_shape, host_batch  # noqa: E402
from gpu_backend.env import device_environment, write_result  # noqa: E402
from gpu_backend.vmm import MIB, ElasticKVPool  # noqa: E402
from sim.core.catalog import ModelSpec, get_gpu, get_model  # noqa: E402
from sim.core.engine_config import EngineConfig  # noqa: E402

WAYS = ("async", "exposed", "exposed, cache emptied", "reclaimed, waiting",
        "reclaimed behind the step")
PROMPT = 205  # the mixed step's new tokens by default: Azure conv's median prompt
DECODES = 16
RESERVE_MIB = 1024  # the reserve lent and taken back each round by default


def device_allocs() -> int:
    """cudaMalloc calls torch's allocator has made so far."""
    return int(torch.cuda.memory_stats().get("num_device_alloc", 0))


def time_once(runner: ModelRunner, decode, mixed, way: str, pool: ElasticKVPool) -> dict:
    """One decode step, then the mixed step the `way` says; the mixed step's seconds (as the
    engine measures a step), its phases, the driver allocations it made, and the detach's
    seconds where the way reclaims."""
    if way.startswith("reclaimed"):
        return time_reclaim(runner, decode, mixed, pool, behind=way.endswith("step"))
    decode_start = time.perf_counter()
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
    assert before.done_t is not None
    return {"step_s": seconds, "enqueue_s": step.phases.enqueue_s,
            "span_s": step.phases.device_s, "device_allocs": device_allocs() - allocs,
            "empty_cache_s": empty_s, "detach_s": 0.0, "total_s": seconds,
            "decode_s": before.done_t - decode_start}


def time_reclaim(runner: ModelRunner, decode, mixed, pool: ElasticKVPool,
                 behind: bool) -> dict:
    """The reserve lent (torch's cache emptied, the pool attached), one decode step, then the
    reserve taken back and the mixed step launched: behind the decode step, or after it."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda.empty_cache()
    empty_s = time.perf_counter() - t0
    pool.attach()
    decode_start = time.perf_counter()
    before = runner.launch(decode)
    if not behind:
        before.collect()
    allocs = device_allocs()
    start = time.perf_counter()
    pool.detach(sync=not behind)
    detach_s = time.perf_counter() - start
    launched = time.perf_counter()
    step = runner.launch(mixed)
    before.collect()
    step.collect()
    assert before.done_t is not None and step.done_t is not None
    if behind:  # timed from before the detach, from the decode step's end at the earliest
        seconds = step.done_t - max(before.done_t, start)
        total = seconds
    else:  # the engine's clock adds the detach, then times the step from its launch
        seconds = step.done_t - launched
        total = detach_s + seconds
    return {"step_s": seconds, "enqueue_s": step.phases.enqueue_s,
            "span_s": step.phases.device_s, "device_allocs": device_allocs() - allocs,
            "empty_cache_s": empty_s, "detach_s": detach_s, "total_s": total,
            "decode_s": before.done_t - decode_start}


def summarize(samples: list[dict]) -> dict:
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


@dataclass(frozen=True)
class Rig:
    """The model and its decode graph over a KV pool for the decodes and the prompt, the two
    steps' host batches, and a release-mode elastic reserve of its own."""

    spec: ModelSpec
    runner: ModelRunner
    decode: HostBatch
    mixed: HostBatch
    pool: ElasticKVPool


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=PROMPT,
                        help="the mixed step's new prompt tokens (default: Azure conv's median)")
    parser.add_argument("--decodes", type=int, default=DECODES)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--reserve-mib", type=int, default=RESERVE_MIB,
                        help="the elastic reserve lent and taken back each round, MiB")
    parser.add_argument("--handle-mib", type=int, default=512,
                        help="its handles' size, MiB (the engine's --vmm-handle-mib)")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def build_rig(args: argparse.Namespace) -> Rig:
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
    # a reserve of its own beside the runner's KV (no table points into it), release mode
    pool = ElasticKVPool(kv_layout(spec, bs), 1, args.reserve_mib * MIB,
                         elastic_handle_bytes=args.handle_mib * MIB, reclaim="release")
    return Rig(spec, runner, decode, mixed, pool)


def time_ways(rig: Rig, rounds: int) -> dict[str, list[dict]]:
    """Each way's samples over `rounds` rounds, after three warm-up rounds; the pool closed
    at the end."""
    try:
        for way in WAYS * 3:  # warm-up: kernels compiled, torch's cache filled
            time_once(rig.runner, rig.decode, rig.mixed, way, rig.pool)
        samples: dict[str, list[dict]] = {way: [] for way in WAYS}
        for _ in range(rounds):  # the ways in turn, so drift touches each alike
            for way in WAYS:
                samples[way].append(time_once(rig.runner, rig.decode, rig.mixed, way, rig.pool))
    finally:
        rig.pool.close()
    return samples


def print_medians(name: str, args: argparse.Namespace, medians: dict[str, dict]) -> None:
    """Each way's medians beside its total's ratio to the async step, and how much longer
    the decode step in flight ran with the detach behind it."""
    base = medians["async"]["step_s"]
    print(f"{name}, mixed step of {args.prompt} new tokens beside {args.decodes} decodes "
          f"of {DECODE_CONTEXT} keys, {args.rounds} rounds, medians:")
    print(f"{'':26s} {'step ms':>8s} {'total ms':>9s} {'x async':>8s} {'enqueue ms':>11s} "
          f"{'span ms':>8s} {'allocs':>7s} {'empty_cache ms':>15s} {'detach ms':>10s} "
          f"{'decode ms':>10s}")
    for way, m in medians.items():
        print(f"{way:26s} {m['step_s'] * 1e3:8.2f} {m['total_s'] * 1e3:9.2f} "
              f"{m['total_s'] / base:8.3f} {m['enqueue_s'] * 1e3:11.2f} "
              f"{m['span_s'] * 1e3:8.2f} {m['device_allocs']:7.0f} "
              f"{m['empty_cache_s'] * 1e3:15.2f} {m['detach_s'] * 1e3:10.2f} "
              f"{m['decode_s'] * 1e3:10.2f}")
    held = medians["reclaimed behind the step"]["decode_s"] - medians["async"]["decode_s"]
    print(f"the decode step in flight with the detach behind it: {held * 1e3:+.3f} ms against "
          f"the async way's, {held / medians['reclaimed behind the step']['detach_s']:.2f} of "
          "the detach's median time")


def save_result(name: str, args: argparse.Namespace, medians: dict, samples: dict) -> Path:
    """The result, named by the shape's flags that differ from their defaults."""
    res = {"env": device_environment(), "model": name, "prompt_tokens": args.prompt,
           "num_decodes": args.decodes, "decode_context": DECODE_CONTEXT,
           "rounds": args.rounds, "reserve_bytes": args.reserve_mib * MIB,
           "handle_bytes": args.handle_mib * MIB, "medians": medians, "samples": samples}
    shape = [f"prompt-{args.prompt}"] if args.prompt != PROMPT else []
    shape += [f"decodes-{args.decodes}"] if args.decodes != DECODES else []
    shape += [f"reserve-{args.reserve_mib}"] if args.reserve_mib != RESERVE_MIB else []
    return write_result(res, args.out, "reclaim_step", res["env"]["gpu"], name, *shape)


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("reclaim_step needs a CUDA GPU")
    rig = build_rig(args)
    samples = time_ways(rig, args.rounds)
    medians = {way: summarize(rows) for way, rows in samples.items()}
    print_medians(rig.spec.name, args, medians)
    path = save_result(rig.spec.name, args, medians, samples)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
