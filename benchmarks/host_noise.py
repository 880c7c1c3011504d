"""Is the host's speed what varies between a profile and a replay? (one GPU, ~1 min)

    python benchmarks/host_noise.py [--model qwen2.5-0.5b] [--rounds 60] [--out FILE]

The engine's step phases (steps.csv and the calibration's measurements: `build_s`,
`enqueue_s`, `device_s`) showed the host's enqueue time of the same step in two modes about
2x apart: an eager Llama-3.1-8B step 12-14 ms or 21-22 ms, a Qwen2.5-0.5B decode graph step
0.25 ms in replays and 0.5 ms in the profile. This times, round after round, a fixed piece of
pure Python (a CPU speed probe, no CUDA) beside one eager step and one decode-graph step, and
records the CPU each ran on, the thread's CPU time and the step phases; first with the
process free to move between CPUs, then pinned to one CPU. If the probe's time moves with the
enqueue times, the CPU itself runs slower at times (frequency, a shared core); if the probe
holds still while the enqueue times move, the cause is inside the process (allocator,
collector, CUDA driver).

Prints medians, 10th/90th percentiles and the probe-enqueue correlation; writes JSON with
every round.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from gpu_backend.engine.hostprobe import PROBE_ITERATIONS, probe  # noqa: E402
from gpu_backend.engine.shapes import (  # noqa: E402
    decode_shape,
    mixed_shape,
    prefill_shape,
)

EAGER = mixed_shape(128, 0, 32, 1024)
DECODE = decode_shape(1, 512)


_LIBC = ctypes.CDLL(None, use_errno=True)


def current_cpu() -> int:
    """The CPU this thread runs on now (glibc's sched_getcpu; -1 where unknown)."""
    try:
        return int(_LIBC.sched_getcpu())
    except AttributeError:
        return -1


def cpu_facts() -> dict:
    """What the machine says about its CPUs and their frequency policy."""
    facts: dict = {"cpu_count": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)),
                   "machine": platform.machine()}
    base = Path("/sys/devices/system/cpu/cpu0/cpufreq")
    for name in ("scaling_governor", "scaling_cur_freq", "scaling_min_freq", "scaling_max_freq"):
        path = base / name
        facts[name] = path.read_text().strip() if path.exists() else None
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    mhz = [float(line.split(":")[1]) for line in lines if line.startswith("cpu MHz")]
    facts["cpuinfo_mhz"] = {"min": min(mhz), "max": max(mhz)} if mhz else None
    model = [line.split(":")[1].strip() for line in lines if line.startswith("model name")]
    facts["model_name"] = model[0] if model else None
    facts["loadavg"] = os.getloadavg()
    return facts


def rounds(runner, steps: dict, count: int) -> list[dict]:
    """`count` rounds of: probe, each step (its host batch built as a replay builds it)."""
    records = []
    for _ in range(count):
        record = {"cpu": current_cpu(), "probe_s": probe()}
        for name, build in steps.items():
            thread_start, start = time.thread_time(), time.perf_counter()
            runner.execute(build())
            record[name] = {"wall_s": time.perf_counter() - start,
                            "thread_s": time.thread_time() - thread_start,
                            "enqueue_s": runner.phases.enqueue_s,
                            "device_s": runner.phases.device_s}
        records.append(record)
    return records


def summarize(records: list[dict], steps) -> dict:
    def stats(values) -> dict:
        a = np.asarray(values) * 1e3
        return {"median_ms": float(np.median(a)), "p10_ms": float(np.percentile(a, 10)),
                "p90_ms": float(np.percentile(a, 90))}

    probe_s = [r["probe_s"] for r in records]
    out = {"probe": stats(probe_s), "cpus": sorted({r["cpu"] for r in records})}
    for name in steps:
        enqueue = [r[name]["enqueue_s"] for r in records]
        out[name] = {key: stats([r[name][key] for r in records])
                     for key in ("wall_s", "thread_s", "enqueue_s", "device_s")}
        out[name]["probe_enqueue_correlation"] = float(np.corrcoef(probe_s, enqueue)[0, 1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("host_noise needs a CUDA GPU")
    from gpu_backend.engine.calibrate import profile_engine
    from gpu_backend.env import device_environment, write_result
    from sim.core.catalog import get_gpu, get_model
    from sim.core.engine_config import EngineConfig

    config = EngineConfig(model=get_model(args.model), gpu=get_gpu("h200"), reclaim="release")
    engine = profile_engine(config, [EAGER, DECODE, prefill_shape(256)])  # one prefill: sizes
    steps = {}
    for name, shape in (("eager 128 + 32 decodes", EAGER), ("decode graph, 1 sequence", DECODE)):
        mirror, out = engine.step(shape)
        steps[name] = (lambda mirror=mirror, out=out: mirror.build(out, engine.num_blocks))
    rounds(engine.runner, steps, 5)  # warm-up
    result = {"env": device_environment(), "model": args.model, "cpu": cpu_facts(),
              "probe_iterations": PROBE_ITERATIONS, "conditions": {}}
    free_cpus = sorted(os.sched_getaffinity(0))
    for label, cpus in (("free", free_cpus), (f"pinned to CPU {free_cpus[-1]}", [free_cpus[-1]]),
                        ("free again", free_cpus)):
        os.sched_setaffinity(0, cpus)
        records = rounds(engine.runner, steps, args.rounds)
        result["conditions"][label] = {"summary": summarize(records, steps), "rounds": records}
    os.sched_setaffinity(0, free_cpus)
    result["cpu_after"] = cpu_facts()
    print(f"CPU: {result['cpu']}")
    for label, condition in result["conditions"].items():
        s = condition["summary"]
        print(f"{label}: probe {s['probe']['median_ms']:.2f} ms "
              f"(p10 {s['probe']['p10_ms']:.2f}, p90 {s['probe']['p90_ms']:.2f}), CPUs {s['cpus']}")
        for name in steps:
            e = s[name]
            print(f"  {name:<26} enqueue {e['enqueue_s']['median_ms']:6.2f} ms "
                  f"(p10 {e['enqueue_s']['p10_ms']:6.2f}, p90 {e['enqueue_s']['p90_ms']:6.2f}) "
                  f"thread {e['thread_s']['median_ms']:6.2f} wall {e['wall_s']['median_ms']:6.2f}"
                  f"  r(probe, enqueue) {e['probe_enqueue_correlation']:+.2f}")
    print(f"median of medians: {statistics.median(c['summary']['probe']['median_ms'] for c in result['conditions'].values()):.2f} ms probe")
    print(f"wrote {write_result(result, args.out, 'host_noise', result['env']['gpu'])}")


if __name__ == "__main__":
    main()
