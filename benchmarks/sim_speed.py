"""How fast is the simulator? The bundled Azure conv trace, then synthetic traces up to 1M requests.

    .venv/bin/python benchmarks/sim_speed.py [--sizes 10000,100000,1000000] [--out FILE]

1. The whole bundled Azure LLM inference conv trace (19,366 requests over an hour) through
   Llama-3.1-8B on one H200, static policy (and elastic), vLLM's default chunk: wall time and
   simulated requests per second. Target: under 5 s on a 2-core machine.
2. Scaling: synthetic traces whose prompt and output lengths are resampled from the conv
   trace and whose Poisson arrival rate is the conv trace's (~5.5 req/s), so the load per
   simulated second stays the same and 1M requests is ~50 simulated hours. CPU seconds per 1k
   requests should stay flat if the simulator is linear in trace length.

Each run is preceded by a short warm-up run (imports, first-call costs) that is not timed.
Wall and process CPU time are both recorded: on a shared machine the CPU time is the steadier.
Prints a table and writes JSON with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np
import simpy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from sim.core.catalog import get_gpu, get_model  # noqa: E402
from sim.core.elastic import Policy  # noqa: E402
from sim.core.engine_config import EngineConfig  # noqa: E402
from sim.runner import RunSpec, simulate  # noqa: E402
from traces import LengthDist, Trace, load_trace, synthetic  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "sim_speed_cpu.json"
TARGET_S = 5.0  # for the full conv trace, static policy
PEER_S = 33.0  # the best-known peer simulator on the same trace, once warm
WARMUP_REQUESTS = 500


def engine(policy: Policy) -> EngineConfig:
    return EngineConfig(model=get_model("llama-3.1-8b"), gpu=get_gpu("h200"), policy=policy)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def timed_run(label: str, trace: Trace, policy: Policy) -> dict:
    simulate(RunSpec(engine(policy)), trace.head(WARMUP_REQUESTS))
    cpu_start_s = time.process_time()
    result = simulate(RunSpec(engine(policy)), trace)
    cpu_s = time.process_time() - cpu_start_s
    s = result.summary
    row = {
        "label": label, "policy": policy.value, "num_requests": len(trace),
        "simulated_s": s["makespan_s"], "wall_s": result.wall_s, "cpu_s": cpu_s,
        "requests_per_wall_s": len(trace) / result.wall_s,
        "wall_s_per_1k_requests": result.wall_s / len(trace) * 1000,
        "cpu_s_per_1k_requests": cpu_s / len(trace) * 1000,
        "num_engine_steps": s["num_engine_steps"],
        "num_schedule_calls": sum(len(rec.timeline) for rec in result.recorders),
        "engine_steps_per_wall_s": s["num_engine_steps"] / result.wall_s,
        "num_finished": s["num_finished"], "peak_rss_mib": peak_rss_mib(),
    }
    print(f"  {label:<24} {policy.value:<8} {len(trace):>9,} requests  {result.wall_s:8.2f} s wall  {cpu_s:8.2f} s CPU",
          flush=True)
    return row


def conv_like(trace: Trace, num_requests: int, rate_per_s: float) -> Trace:
    return synthetic(num_requests, rate_per_s,
                     prompt=LengthDist.empirical(trace, "prompt_tokens"),
                     output=LengthDist.empirical(trace, "output_tokens"), seed=0)


def machine() -> dict:
    return {
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "numpy": np.__version__, "simpy": simpy.__version__,
    }


def print_table(rows: list[dict], base_per_1k_s: float) -> None:
    table = Table(title="simulator speed (Llama-3.1-8B, 1x H200, chunk 8192)")
    for name in ("trace", "policy", "requests", "simulated h", "engine steps", "wall s", "CPU s",
                 "req / s", "steps / s", "CPU s per 1k req", "vs first synthetic", "peak RSS MiB"):
        table.add_column(name, justify="left" if name in ("trace", "policy") else "right")
    for r in rows:
        ratio = r["cpu_s_per_1k_requests"] / base_per_1k_s if r["label"] != "azure-conv" else None
        table.add_row(
            r["label"], r["policy"], f"{r['num_requests']:,}", f"{r['simulated_s'] / 3600:.2f}",
            f"{r['num_engine_steps']:,}", f"{r['wall_s']:.2f}", f"{r['cpu_s']:.2f}", f"{r['requests_per_wall_s']:,.0f}",
            f"{r['engine_steps_per_wall_s']:,.0f}", f"{r['cpu_s_per_1k_requests']:.3f}",
            "-" if ratio is None else f"{ratio:.2f}x", f"{r['peak_rss_mib']:,.0f}",
        )
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000",
                        help="synthetic trace lengths, comma-separated")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    sizes = [int(v) for v in args.sizes.split(",") if v.strip()]

    load_start_s = time.perf_counter()
    conv = load_trace("azure-conv")
    load_s = time.perf_counter() - load_start_s
    rate_per_s = float(conv.describe()["rate_per_s"])
    print(f"azure-conv: {len(conv):,} requests, {rate_per_s:.2f} req/s, loaded in {load_s:.3f} s",
          flush=True)
    rows = [timed_run("azure-conv", conv, policy) for policy in (Policy.STATIC, Policy.ELASTIC)]
    for num_requests in sizes:
        rows.append(timed_run(f"synthetic {num_requests:,}", conv_like(conv, num_requests,
                                                                       rate_per_s), Policy.STATIC))
    synthetic_rows = [r for r in rows if r["label"] != "azure-conv"]
    base = synthetic_rows[0]["cpu_s_per_1k_requests"] if synthetic_rows else 1.0
    print_table(rows, base)
    static_s = rows[0]["wall_s"]
    verdict = "meets" if static_s < TARGET_S else "MISSES"
    print(f"full conv trace, static: {static_s:.2f} s ({verdict} the {TARGET_S:g} s target; "
          f"peer simulator ~{PEER_S:g} s, {PEER_S / static_s:.1f}x slower)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(), "model": "llama-3.1-8b", "gpu": "h200-141gb",
              "conv_rate_per_s": rate_per_s, "conv_load_s": load_s, "target_s": TARGET_S, "runs": rows,
              "cpu_linearity_vs_first_synthetic": {
                  r["label"]: r["cpu_s_per_1k_requests"] / base for r in synthetic_rows}}
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
