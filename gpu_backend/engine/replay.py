"""Replay a trace through the GPU engine and write the simulator's outputs plus measurements.

Arrival semantics match the simulator's: a request arriving at or before the end of a step
is seen by the next `schedule()`; when nothing is running the clock jumps (virtual) or
sleeps (wall) to the next arrival.

Outputs (same names and columns as `python -m sim --out`): summary.json, requests_<label>.csv,
timeline_<label>.csv (plus a trailing `reserve_mapped_bytes` column), and steps.csv, one row
per engine step for the validation layer's step-by-step comparison; and config.json, the
EngineConfig the replay ran (`ran_config`), which validation reads back.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
from collections.abc import Callable, Sequence
from dataclasses import astuple
from pathlib import Path

import numpy as np

from gpu_backend.engine.clocks import VirtualClock, WallClock
from gpu_backend.engine.elastic import TRANSITION_COLUMNS
from gpu_backend.engine.engine import STEP_COLUMNS, GpuEngine
from gpu_backend.engine.hostprobe import HostProbe
from sim.core.engine_config import EngineConfig
from sim.core.request import RequestState
from sim.recording.metrics import Slo, summarize
from sim.recording.outputs import (
    config_fields,
    run_label,
    slug,
    write_request_csv,
    write_timeline_csv,
)
from traces import Request

ProgressFn = Callable[[float, int, int], None]  # (now_s, num_submitted, num_steps)
CONFIG_FILE = "config.json"  # the EngineConfig a replay ran, beside its summary.json


def replay(engine: GpuEngine, requests: Sequence[Request], *, wait: bool,
           progress: ProgressFn | None = None, progress_every: int = 500,
           host_probe: HostProbe | None = None) -> float:
    """Drive the engine over `requests` (sorted by arrival); returns the final clock time.

    The objects made during setup (model, graphs, pools) are frozen out of the garbage
    collector first, as serving engines do, so that no full collection over them lands inside
    a timed step. (Eager, launch-bound prefill steps of Qwen2.5-0.5B replays have 20-100 ms
    outliers; with the freeze they still had 30-50 ms ones, so the collector is not all of it.)
    `host_probe` (virtual clock only: on the wall clock its loop would delay the engine) times
    the host's speed between steps now and then.
    """
    if wait and host_probe is not None:
        raise ValueError("a host probe runs between steps on the virtual clock only (--no-wait)")
    gc.collect()
    gc.freeze()
    try:
        return _drive(engine, requests, wait, progress, progress_every, host_probe)
    finally:
        gc.unfreeze()


def _drive(engine: GpuEngine, requests: Sequence[Request], wait: bool,
           progress: ProgressFn | None, progress_every: int,
           host_probe: HostProbe | None = None) -> float:
    first_s = requests[0].arrival_s if requests else 0.0
    clock = WallClock(first_s) if wait else VirtualClock(first_s)
    index, num_steps = 0, 0
    while index < len(requests) or engine.has_unfinished():
        now_s = clock.now()
        while index < len(requests) and requests[index].arrival_s <= now_s:
            submit(engine, requests[index])
            index += 1
        if not engine.has_unfinished():
            if index < len(requests):
                clock.advance_to(requests[index].arrival_s)
            continue
        engine.step(clock)
        num_steps += 1
        if host_probe is not None:
            host_probe.maybe()
        if progress is not None and num_steps % progress_every == 0:
            progress(clock.now(), index, num_steps)
    return clock.now()


def submit(engine: GpuEngine, req: Request) -> bool:
    """Queue a trace request on the engine; False if the scheduler rejected it (the engine
    fixes its prompt ids from its block hashes)."""
    return engine.add_request(RequestState(req.request_id, req.arrival_s, req.prompt_tokens,
                                           req.output_tokens, req.block_hashes))


def engine_summary(engine: GpuEngine, measured: dict, slo: Slo | None = None) -> dict:
    summary = summarize([engine.recorder], slo or Slo())
    summary.update(config_fields(engine.core))  # the simulator's configuration columns
    el = engine.elastic
    summary["measured"] = {
        **measured,
        "kv_blocks": engine.core.plan.num_kv_blocks,
        "kv_tokens": engine.core.plan.kv_capacity_tokens,
        "kv_elastic_blocks": engine.core.layout.num_elastic_blocks,
        "attach_latency_s": _stats(el.attach_latencies_s),
        "detach_latency_s": _stats(el.detach_latencies_s),
        # detaches run while the step in flight still ran (EngineConfig.detach_behind_step)
        "num_detach_behind_step": sum(t.behind_step for t in el.transitions),
        "migration_latency_s": _stats(el.migration_latencies_s),
        "num_real_oom": engine.num_real_oom,
        "num_graph_steps": getattr(engine.runner, "num_graph_steps", 0),
        "num_eager_steps": getattr(engine.runner, "num_eager_steps", 0),
        "num_piecewise_steps": getattr(engine.runner, "num_piecewise_steps", 0),
        "num_compiling_steps_retimed": getattr(engine.runner, "num_compiling_steps", 0),
        "kernels": kernel_flags(),
    }
    summary["executor"] = "gpu"
    return summary


def kernel_flags() -> dict[str, bool | int]:
    """Which engine kernels ran (the env switches of the A/B and fallback runs)."""
    from gpu_backend.engine.setup import fused_layers_enabled
    from gpu_backend.kernels.attention import DECODE_SPLIT_PLAN, DECODE_TARGET_WAVES

    return {"fused_layers": fused_layers_enabled(), "decode_split_plan": DECODE_SPLIT_PLAN,
            "decode_target_waves": DECODE_TARGET_WAVES}


def _stats(values: list[float]) -> dict:
    if not values:
        return {"count": 0, "mean": None, "p50": None, "max": None}
    array = np.array(values)
    return {"count": len(values), "mean": float(array.mean()),
            "p50": float(np.median(array)), "max": float(array.max())}


def write_outputs(out_dir: Path, engine: GpuEngine, summary: dict, trace_source: str,
                  num_trace_requests: int, config: EngineConfig | None = None) -> None:
    """summary.json, the run's CSVs and steps.csv; with `config` (`ran_config`), config.json:
    the configuration validation reads back with EngineConfig.from_json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"trace": trace_source, "num_trace_requests": num_trace_requests, "runs": [summary]}
    (out_dir / "summary.json").write_text(json.dumps(doc, indent=2))
    if config is not None:
        (out_dir / CONFIG_FILE).write_text(config.to_json())
    name = slug(run_label(engine.core.config))
    write_request_csv(out_dir / f"requests_{name}.csv", engine.recorder.requests)
    mapped = [s[STEP_COLUMNS.index("mapped_elastic_bytes")] for s in engine.steps]
    write_timeline_csv(out_dir / f"timeline_{name}.csv", [engine.recorder],
                       extra={"reserve_mapped_bytes": np.array(mapped, dtype=np.float64)})
    with (out_dir / "steps.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(STEP_COLUMNS)
        writer.writerows(engine.steps)
    if engine.elastic.transitions:  # each transition with its phases (ElasticExecutor)
        with (out_dir / "transitions.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(TRANSITION_COLUMNS)
            writer.writerows(astuple(t) for t in engine.elastic.transitions)


def ran_config(config: EngineConfig, measured: dict) -> EngineConfig:
    """The configuration a replay ran: the one it was given, with the decode and piecewise
    CUDA graph sizes the engine captured (`measured`), which the simulator pads steps to."""
    return config.with_(cuda_graph_sizes=tuple(sorted(measured.get("graph_sizes") or ())),
                        piecewise_graph_sizes=tuple(sorted(measured.get("piecewise_sizes") or ())))


def replay_fields(args: argparse.Namespace, config: EngineConfig) -> dict:
    """The trace slice `python -m validation compare` replays (its configuration is in
    config.json), and the settings a repeat must share, as summary columns."""
    return {
        "trace_path": args.trace, "trace_format": args.format, "limit": args.limit,
        "window_s": list(args.window) if args.window else None, "rate_scale": args.rate_scale,
        "seed": args.seed, "gpu_memory_utilization": config.gpu_memory_utilization,
        "max_model_len": config.max_model_len, "reclaim": config.reclaim,
        "enable_prefix_caching": config.enable_prefix_caching,
    }


def wall_clock_compiles(summary: dict) -> str | None:
    """The warning for a wall-clock replay during which kernels compiled (None otherwise):
    each such step is timed again without its compile, but arrivals kept coming while it
    compiled, so the requests behind it queued for the compiler."""
    measured = summary.get("measured") or {}
    count = measured.get("num_compiling_steps_retimed") or 0
    if measured.get("clock") != "wall" or not count:
        return None
    return (f"warning: {count} steps compiled kernels during this wall-clock replay; each is "
            "timed again without its compile, but requests kept arriving while it compiled "
            "and queued behind it, so early latencies include the compiler. Replay with "
            "--no-wait (the virtual clock `python -m validation run` uses), or again now that "
            "the kernel cache is warm")


def print_headline(summary: dict) -> None:
    print(json.dumps({k: summary[k] for k in ("num_finished", "num_requests", "throughput_tok_s",
                                              "num_preemptions", "num_oom", "num_attach")}))
