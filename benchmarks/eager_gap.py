"""Why replays' steps run slower than the calibration profile's (one GPU, ~1 min).

    python benchmarks/eager_gap.py [--model llama-3.1-8b] [--out FILE]

The profile times each grid step back to back (warm-up, then the median of five). Replays of
the same shapes came out slower: small eager steps (a short prefill chunk beside decodes)
19-30 ms against the profile's ~13 ms, and decode steps of 33+ sequences 9-14% over the fit
(validation reports' per-class tables). Each experiment here times one step
shape under one condition the replay differs in, the rest held equal:

* eager steps (a 128-token prompt beside 32 decodes of 1,024 keys; a 256-token prompt):
  back to back (as the profile); each after a decode-graph step (a replay alternates them);
  each after 6 ms of host sleep (the host idles while a decode step runs on the GPU); each
  after 3 ms of Python that allocates (the scheduler's work between steps); each with the
  garbage collector's generation-2 pass forced before it; a new prompt length every time (a
  replay's eager steps rarely repeat a token count: shape-keyed first-call costs such as
  cuBLAS kernel choice or lazily loaded modules would show here).
* a decode step of 40 sequences of 1,100 keys: its exact-size graph on a tensor pool (as the
  profile); the 48-row graph of a replay's capture sizes (capture_sizes(256), tables 32,768
  keys wide); the pool of the elastic replays (CUDA virtual memory; static replays use a
  tensor, and elastic replays' decode steps came out 1-4 points further from the fit); a pool
  over 80% of the free memory with each sequence's blocks side by side or scattered at random;
  after 10 s of the same step back to back (a replay runs for minutes: clocks, temperature).

Prints the median of each and its ratio to the profile's condition; writes JSON.

Result (H200, driver 580.159.04, torch 2.11, triton 3.6, 2026-11-30;
benchmarks/results/eager_gap_nvidia-h200.json): the eager steps' medians moved between 13 and 26 ms with no order among the
conditions (the 128-token step back to back 22.5 ms, after a decode-graph step 13.3 ms; the
256-token prompt 25.0 ms back to back, 14.2 ms after a full GC), and the decode step stayed
within 7.65-8.36 ms under every condition. What moved was the host's speed
(benchmarks/host_noise.py), not any one condition; benchmarks/decode_gap.py then separated the
replay setup's share of the decode gap (the graph padding only).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from gpu_backend.engine.shapes import (  # noqa: E402
    decode_shape,
    engine_step,
    mixed_shape,
    prefill_shape,
    scatter_tables,
)

EAGER = {"128-token prompt + 32 decodes of 1,024": mixed_shape(128, 0, 32, 1024),
         "256-token prompt": prefill_shape(256)}
DECODE = decode_shape(40, 1100)
REPEAT = 15
SUSTAIN_S = 10.0


def timed(run, before=None, repeat: int = REPEAT) -> float:
    """Median seconds of run(), each call preceded by before() (untimed)."""
    for _ in range(2):
        if before:
            before()
        run()
    times = []
    for _ in range(repeat):
        if before:
            before()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def python_work(seconds: float = 0.003) -> None:
    """Host work like a scheduler step's: small objects made and dropped for `seconds`."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        _ = [{"id": i, "blocks": list(range(8))} for i in range(200)]


class Lab:
    """The profile's engine, and step closures on it or on other pools and graphs."""

    def __init__(self, model: str, extra_shapes: tuple = ()) -> None:
        from gpu_backend.engine.calibrate import profile_engine
        from sim.core.catalog import get_gpu, get_model
        from sim.core.engine_config import EngineConfig

        self.config = EngineConfig(model=get_model(model), gpu=get_gpu("h200"),
                                   reclaim="release")
        self.engine = profile_engine(self.config, [*EAGER.values(), DECODE, prefill_shape(2048),
                                                   *extra_shapes])
        self.runner = self.engine.runner
        self.block_size = self.engine.config.block_size

    def step(self, shape, runner=None, pool_blocks: int | None = None, scatter: bool = False):
        """A closure running `shape` (its host batch built each time, as a replay does)."""
        runner, pool_blocks = runner or self.runner, pool_blocks or self.engine.num_blocks
        mirror, out = engine_step(shape, self.block_size, pool_blocks,
                                  self.config.model.vocab_size)
        if scatter:
            scatter_tables(mirror, pool_blocks)
        return lambda: runner.execute(mirror.build(out, pool_blocks))

    def runner_on(self, caches, sizes: tuple[int, ...] | None = None, width: int | None = None):
        """A runner on `caches` with decode graphs of `sizes` (default: DECODE's batch)."""
        from gpu_backend.engine.runner import DecodeGraphs, ModelRunner

        sizes = sizes or (len(DECODE.decodes),)
        graphs = DecodeGraphs(self.runner.model, caches, max(sizes),
                              width or self.engine.config.max_model_len, self.block_size,
                              self.engine.device, sizes)
        graphs.capture()
        return ModelRunner(self.runner.model, caches, self.engine.device, graphs)


def eager_conditions(lab: Lab) -> dict:
    conditions = {"back to back (profile)": None, "after a decode-graph step": lab.step(DECODE),
                  "after 6 ms of host sleep": lambda: time.sleep(0.006),
                  "after 3 ms of Python work": python_work,
                  "after a full GC": lambda: gc.collect(2)}
    result = {}
    for name, shape in EAGER.items():
        run = lab.step(shape)
        result[name] = {c: timed(run, before) for c, before in conditions.items()}
        # the same step with a prompt length never run before, each time
        new_tokens, prefix = shape.prefills[0]
        fresh = iter([lab.step(replace(shape, prefills=((new_tokens + 1 + i, prefix),)))
                      for i in range(REPEAT + 2)])
        result[name]["a new prompt length each time"] = timed(lambda fresh=fresh: next(fresh)())
    return result


def decode_conditions(lab: Lab) -> dict:
    import torch

    from gpu_backend.engine.graphs import capture_sizes
    from gpu_backend.engine.memory import dummy_store, kv_caches_of, kv_layout
    from gpu_backend.vmm import ElasticKVPool

    config, device = lab.config, lab.engine.device
    layers, layout = config.model.num_layers, kv_layout(config.model, lab.block_size)
    run = lab.step(DECODE)
    times = {"exact 40-row graph, tensor pool (profile)": timed(run)}
    # a replay runs for minutes: clocks and temperatures after 10 s of steps back to back
    end = time.perf_counter() + SUSTAIN_S
    while time.perf_counter() < end:
        run()
    times[f"after {SUSTAIN_S:.0f} s of decode steps back to back"] = timed(run)
    replay = lab.runner_on(lab.runner.kv_caches, capture_sizes(256), 32768)
    times["48-row graph, 32k-key tables (replay)"] = timed(lab.step(DECODE, replay))
    # the elastic replays' pool: CUDA virtual memory (handles mapped into one range)
    with ElasticKVPool(layout, lab.engine.num_blocks, config.vmm_handle_bytes,
                       elastic_handle_bytes=config.vmm_handle_bytes, reclaim="release",
                       device_ordinal=device.index or 0) as pool:
        vmm = lab.runner_on(kv_caches_of(pool, layers))
        times["exact graph, VMM pool (elastic replays)"] = timed(lab.step(DECODE, vmm))
        del vmm
    torch.cuda.empty_cache()
    # a pool over most of the free memory, each sequence's blocks side by side or scattered
    free, _ = torch.cuda.mem_get_info(device)
    blocks = int(0.8 * free // layout.block_bytes)
    big = lab.runner_on(kv_caches_of(dummy_store(config.model, blocks, lab.block_size, device),
                                     layers))
    times[f"pool of {blocks} blocks, side by side"] = timed(lab.step(DECODE, big, blocks))
    times[f"pool of {blocks} blocks, scattered"] = timed(
        lab.step(DECODE, big, blocks, scatter=True))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("eager_gap needs a CUDA GPU")
    from gpu_backend.env import device_environment, write_result

    lab = Lab(args.model)
    result = {"env": device_environment(), "model": args.model,
              "pool_blocks": lab.engine.num_blocks, "eager": eager_conditions(lab),
              "decode": {"40 decodes of 1,100 keys": decode_conditions(lab)}}
    for group in ("eager", "decode"):
        for shape, times in result[group].items():
            base = next(iter(times.values()))
            print(shape)
            for label, seconds in times.items():
                print(f"  {label:<45} {seconds * 1e3:8.2f} ms  {seconds / base:5.2f}x")
    print(f"wrote {write_result(result, args.out, 'eager_gap', result['env']['gpu'])}")


if __name__ == "__main__":
    main()
