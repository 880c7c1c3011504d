"""`python -m gpu_backend replay|profile`: the real-GPU engine's command line.

    python -m gpu_backend replay --trace azure-conv --limit 300 --model qwen2.5-0.5b \
        --policy elastic --chunk 2048 --no-wait --out out/gpu_elastic
    python -m gpu_backend replay --trace azure-conv --engine-config run.json --no-wait --out o/
    python -m gpu_backend profile --model llama-3.1-8b --out calib_llama8b.json

The engine flags and their defaults are EngineConfig's, the simulator's own. `replay` runs one
policy per process (each builds its own memory plan and pool) and writes config.json, the
configuration it ran, beside summary.json; `profile` writes the calibration JSON the simulator
reads with `--calibration`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from gpu_backend.cli_parsers import add_profile_parser, add_refit_parser, add_replay_parser
from gpu_backend.engine.support import check_supported, missing_gpu
from gpu_backend.profile_json import read_profile
from sim.core.config_flags import CommandParser, engine_config
from sim.core.elastic import Policy
from sim.core.engine_config import EngineConfig
from sim.recording.folder import check_out_path
from traces import Trace, TraceError, trace_from_args


class NoGpu(ValueError):
    """This host cannot run the engine (said in one line, as a usage error is)."""


def gpu_config(args: argparse.Namespace) -> EngineConfig:
    """The flags' EngineConfig, refused where the GPU engine cannot run it as configured."""
    config = engine_config(args)
    if config.reclaim != "release":
        raise ValueError(f"--reclaim {config.reclaim}: the GPU engine's activations come from "
                         "torch's allocator, which only a released handle's memory reaches; "
                         "use --reclaim release (the default)")
    check_supported(config)
    missing = missing_gpu()
    if missing is not None:
        raise NoGpu(f"python -m gpu_backend {args.command} runs on an NVIDIA GPU, and "
                    f"{missing}; the simulator runs anywhere: python -m sim --help")
    return config


def piecewise_of(config: EngineConfig) -> tuple[bool, int | None]:
    """(piecewise graphs on, their token cap or None at the chunk), from the configuration's
    piecewise_graph_sizes (set by --piecewise-graphs and --piecewise-max-tokens)."""
    sizes = config.piecewise_graph_sizes
    if not sizes:
        return False, None
    return True, (max(sizes) if max(sizes) < config.chunk_tokens else None)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m gpu_backend",
                           description="Real-GPU paged-KV engine with an elastic reserve.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_replay_parser(sub)
    add_profile_parser(sub)
    add_refit_parser(sub)
    return parser


def run_refit(args: argparse.Namespace) -> int:
    from gpu_backend.engine.calibrate import merge_profiles, refit_calibration, write_calibration
    from sim.core.calibration.launches import add_attention_launches, read_result
    from sim.core.calibration.records import check_fit_records

    data = read_profile(args.calibration)
    if args.merge:
        merged = [read_profile(path) for path in args.merge]
        for path, profile in zip((args.calibration, *args.merge), (data, *merged)):
            check_fit_records(profile, str(path))  # before the medians read their times
        data = merge_profiles(data, merged, [str(path) for path in args.merge])
    for path in args.add_launches:
        data, count = add_attention_launches(data, read_result(path), str(path))
        print(f"{path}: {count} attention launches added" if count else
              f"{path}: no launch of a shape the calibration lacks; nothing added",
              file=sys.stderr)
    program, terms = ((str(path), read_profile(path)) if path is not None else None
                      for path in (args.program_from, args.attention_from))
    result = refit_calibration(data, args.copy_bandwidth, program, terms, str(args.calibration))
    write_calibration(args.out or args.calibration, result)
    print(json.dumps({"efficiency": result["efficiency"],
                      "median_abs_rel": result["fit_error"]["median_abs_rel"]}, indent=2))
    say_left_out(result)
    return 0


def say_left_out(result: dict) -> None:
    """Name on stderr the grid steps the fit left out: measured faster than their roofline at
    the datasheet peaks (sim.core.calibration.profile_fit.beyond_roofline), or needing more KV
    blocks than the profile's pool held (outgrew_pool)."""
    errors, measured = result["fit_error"], result["measurements"]
    why = {"beyond_roofline": "measured faster than the datasheet roofline, as one whose KV "
                              "outgrows the profile's pool and re-reads cached blocks",
           "outgrew_pool": "KV beyond the profile's pool, larger than the steps replays run"}
    for key, reason in why.items():
        left = errors.get(key) or []
        if left:
            print(f"left out of the fit, {reason} ({len(left)} of {len(measured)} grid steps): "
                  + "; ".join(describe_step(i, measured[i]) for i in left), file=sys.stderr)


def describe_step(i: int, m: dict) -> str:
    groups = m.get("decode_groups") or []
    what = (" + ".join(f"{n} x {c}" for n, c in groups) + " decode tokens of context"
            if m["kind"] == "decode" else f"{m['kind']} {m['prefills']}")
    return f"#{i} {what}: {1e3 * m['measured_s']:.1f} ms"


def run_replay(args: argparse.Namespace) -> int:
    # the engine's modules load torch and Triton: a host without them is told so first
    from gpu_backend.engine.hostprobe import HostProbe
    from gpu_backend.engine.replay import replay
    from gpu_backend.engine.setup import build_gpu_engine

    trace = trace_from_args(args)
    config = gpu_config(args)
    piecewise, cap = piecewise_of(config)
    if config.tensor_parallel_size > 1:
        return _run_tp_replay(args, config, piecewise)
    setup_start = time.perf_counter()
    setup = build_gpu_engine(config, **_engine_options(args, config, piecewise, cap))
    setup_s = time.perf_counter() - setup_start
    _print_setup(setup.engine, setup_s)
    import torch

    torch.cuda.reset_peak_memory_stats()  # the replay's peak, not the setup's profiling
    wall_start = time.perf_counter()
    probe = HostProbe() if args.no_wait else None
    replay(setup.engine, trace.requests(), wait=not args.no_wait, progress=print_progress,
           host_probe=probe)
    measured = measured_fields(setup, probe, setup_s, time.perf_counter() - wall_start,
                               "wall" if not args.no_wait else "virtual")
    measured["attention_backend"] = config.attention_backend
    _report_replay(args, config, trace, setup.engine, measured)
    return 0


def _run_tp_replay(args: argparse.Namespace, config: EngineConfig, piecewise: bool) -> int:
    """The replay on tensor_parallel_size GPUs, refused for the single-GPU options."""
    if piecewise:
        raise ValueError("--piecewise-graphs runs on one GPU only: drop it or --tp")
    if config.attention_backend != "triton":
        raise ValueError(f"--attention-backend {config.attention_backend} runs on one GPU "
                         "only: drop it or --tp")
    from gpu_backend.tp.launch import run_tp_replay

    return run_tp_replay(args, config)


def _engine_options(args: argparse.Namespace, config: EngineConfig, piecewise: bool,
                    cap: int | None) -> dict:
    """build_gpu_engine's keywords besides the configuration, from the replay's flags."""
    return dict(seed=args.seed, use_graphs=not args.no_graphs,
                torch_cap=args.torch_cap, max_kv_blocks=args.max_kv_blocks,
                **headroom_of(args),
                piecewise=piecewise, piecewise_max_tokens=cap,
                attention_backend=config.attention_backend)


def _print_setup(engine, setup_s: float) -> None:
    print(f"setup {setup_s:.1f} s: KV {engine.core.plan.num_kv_blocks} blocks "
          f"(+{engine.core.layout.num_elastic_blocks} elastic), reserve "
          f"{engine.core.plan.activation_reserve_bytes / 2**30:.2f} GiB", flush=True)


def _report_replay(args: argparse.Namespace, config: EngineConfig, trace: Trace, engine,
                   measured: dict) -> None:
    """The replay's summary: its headline printed, then its files written under --out."""
    from gpu_backend.engine.replay import (
        engine_summary,
        print_headline,
        ran_config,
        replay_fields,
        wall_clock_compiles,
        write_outputs,
    )

    summary = engine_summary(engine, measured)
    summary.update(replay_fields(args, config))
    print_headline(summary)
    warning = wall_clock_compiles(summary)
    if warning is not None:
        print(warning, file=sys.stderr)
    if args.out is not None:
        write_outputs(args.out, engine, summary, trace.source, len(trace),
                      config=ran_config(config, measured))


def headroom_of(args: argparse.Namespace) -> dict:
    """build_gpu_engine's keyword for --torch-cap-headroom-gib, when given."""
    if args.torch_cap_headroom_gib is None:
        return {}
    return {"torch_cap_headroom_bytes": int(args.torch_cap_headroom_gib * 2**30)}


def print_progress(now_s: float, submitted: int, steps: int) -> None:
    print(f"  t={now_s:8.2f} s  submitted {submitted}  steps {steps}", flush=True)


def measured_fields(setup, probe, setup_s: float, replay_wall_s: float, clock: str) -> dict:
    """What a single-GPU replay measured besides its steps: setup, memory, graphs, host."""
    import torch

    from gpu_backend.env import machine_start, measured_on, versions

    m = setup.measurement
    return {
        "measured_on": measured_on(),  # the day it ran (UTC): `validation adopt` dates a slice
        # the host's speed during the replay (a fixed Python loop; gpu_backend.engine.hostprobe)
        "host_probe": probe.summary() if probe is not None else None,
        # which start of the machine ran it: replays on different starts compare two hosts
        "machine_start": machine_start(),
        "setup_s": setup_s, "replay_wall_s": replay_wall_s, "clock": clock,
        "gpu_name": torch.cuda.get_device_name(), "versions": versions(),
        "weights_bytes": m.weights_bytes if m else None,
        "activation_peaks": {str(k): v for k, v in (m.activation_peaks if m else {}).items()},
        "activation_profile": asdict(m.profile) if m else None,
        "non_torch_bytes": m.non_torch_bytes if m else None,
        "graph_bytes": m.graph_bytes if m else None,
        "graph_capture_s": setup.graphs.capture_s if setup.graphs else None,
        # decode batches of B sequences run the graph of the smallest size >= B (padded rows)
        "graph_sizes": list(setup.graphs.sizes) if setup.graphs else None,
        # steps with prefill tokens of T tokens run the piecewise graphs of the smallest size >= T
        "piecewise_sizes": list(setup.piecewise.sizes) if setup.piecewise else None,
        "piecewise_capture_s": setup.piecewise.capture_s if setup.piecewise else None,
        "total_bytes": m.total_bytes if m else None,
        "torch_cap_bytes": setup.budget.cap_bytes if setup.budget else None,
        # the replay's own peak (setup's profiling peaks are reset before the first step)
        "peak_torch_reserved_bytes": torch.cuda.max_memory_reserved(),
    }


def run_profile(args: argparse.Namespace) -> int:
    from gpu_backend.engine.calibrate import calibrate, write_calibration
    from gpu_backend.env import grid_clocks

    config = gpu_config(args).with_(policy=Policy.STATIC)
    if config.tensor_parallel_size > 1:
        raise ValueError("the profile runs on one GPU: drop --tensor-parallel-size")
    piecewise, cap = piecewise_of(config)
    result = calibrate(config, seed=args.seed, quick=args.quick, replay_setup=args.replay_setup,
                       passes=args.passes, piecewise=piecewise, piecewise_max_tokens=cap,
                       attention=not args.no_attention_profile,
                       attention_backend=config.attention_backend,
                       sample_clocks=not args.no_sample_clocks)
    out = args.out or Path(f"calibration_{config.model.name}.json")
    write_calibration(out, result)
    print(json.dumps({"efficiency": result["efficiency"], "fit_error": result["fit_error"]},
                     indent=2))
    clocks = grid_clocks(result["measurements"])
    if clocks:
        print(clocks)
    say_left_out(result)
    return 0


GPU_PACKAGES = ("torch", "triton", "cuda", "cuda.bindings")


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.out is not None:
            check_out_path(args.out, "--out", folder=args.command == "replay")
        if args.command == "replay":
            return run_replay(args)
        if args.command == "refit":
            return run_refit(args)
        return run_profile(args)
    except (TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name not in GPU_PACKAGES:
            raise
        print(f"error: the GPU backend needs {exc.name}, which is not installed: "
              "pip install -e '.[gpu]' on a machine with an NVIDIA GPU", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
