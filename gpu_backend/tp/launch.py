"""`python -m gpu_backend replay --tp N`: one process per GPU, rank 0 writes the outputs.

Every rank loads the same requests, builds its shard engine (tp/setup.py) and replays the
trace on the virtual clock (the ranks agree on every step's duration, so their schedules
stay identical). Rank 0 writes what the single-GPU replay writes (summary.json with
tensor_parallel_size = N, config.json, requests/timeline CSVs, steps.csv) plus, under
measured.tp_ranks, each rank's own memory: weights, activation peaks, non-torch bytes, the
KV blocks it alone would have had, and the agreed per-GPU pool and reserve share.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

import torch

from gpu_backend.engine.replay import (
    engine_summary,
    print_headline,
    ran_config,
    replay,
    replay_fields,
    write_outputs,
)
from gpu_backend.env import machine_start, measured_on, versions
from gpu_backend.tp.engine import TpEngine
from gpu_backend.tp.group import TpGroup, spawn_ranks
from sim.core.engine_config import EngineConfig


def run_tp_replay(args: argparse.Namespace, config: EngineConfig) -> int:
    tp = config.tensor_parallel_size
    if not args.no_wait:
        raise ValueError("--tp needs --no-wait: the ranks share a virtual clock")
    if not torch.cuda.is_available():
        raise ValueError("--tp needs CUDA GPUs (the CPU path is tests/test_tp_engine.py)")
    if torch.cuda.device_count() < tp:
        raise ValueError(f"--tp {tp} needs {tp} GPUs; {torch.cuda.device_count()} visible")
    from traces import trace_from_args

    trace = trace_from_args(args)
    spawn_ranks(replay_rank, tp, args, config, trace.requests(), trace.source)
    return 0


def replay_rank(group: TpGroup, args: argparse.Namespace, config: EngineConfig,
                requests: list, source: str) -> None:
    from gpu_backend.tp.setup import build_tp_gpu_engine

    setup_start = time.perf_counter()
    setup = build_tp_gpu_engine(config, group, seed=args.seed, use_graphs=not args.no_graphs,
                                max_kv_blocks=args.max_kv_blocks)
    setup_s = group.max_float(time.perf_counter() - setup_start)
    engine, m = setup.engine, setup.measurement
    if group.is_first:
        print(f"setup {setup_s:.1f} s (TP {group.world_size}): KV "
              f"{engine.core.plan.num_kv_blocks} blocks per GPU "
              f"(+{engine.core.layout.num_elastic_blocks} elastic), reserve "
              f"{engine.core.plan.activation_reserve_bytes / 2**30:.2f} GiB per GPU", flush=True)

    def progress(now_s: float, submitted: int, steps: int) -> None:
        print(f"  t={now_s:8.2f} s  submitted {submitted}  steps {steps}", flush=True)

    wall_start = time.perf_counter()
    replay(engine, requests, wait=False, progress=progress if group.is_first else None)
    measured = {
        "measured_on": measured_on(), "machine_start": machine_start(),
        "setup_s": setup_s, "replay_wall_s": time.perf_counter() - wall_start,
        "clock": "virtual", "gpu_name": torch.cuda.get_device_name(group.device),
        "versions": versions(),
        "weights_bytes": m.weights_bytes,
        "activation_peaks": {str(k): v for k, v in m.activation_peaks.items()},
        "activation_profile": asdict(m.profile), "non_torch_bytes": m.non_torch_bytes,
        "graph_bytes": m.graph_bytes,
        "graph_capture_s": setup.graphs.capture_s if setup.graphs else None,
        "graph_sizes": list(setup.graphs.sizes) if setup.graphs else None,
        "total_bytes": m.total_bytes, "torch_cap_bytes": None,
    }
    finish_rank(group, engine, setup.rank_memory, measured, args, config, source,
                len(requests))


def finish_rank(group: TpGroup, engine: TpEngine, rank_memory: dict, measured: dict,
                args: argparse.Namespace, config: EngineConfig, source: str,
                num_requests: int) -> dict | None:
    """Gather every rank's memory record; rank 0 prints and writes the outputs."""
    ranks = group.gather_objects({**rank_memory, "num_real_oom": engine.num_real_oom})
    if not group.is_first:
        return None
    measured = {**measured, "tensor_parallel_size": group.world_size, "tp_ranks": ranks,
                "tp_activation_peak_bytes_max": max(
                    max(r["activation_peaks"].values(), default=0) for r in ranks)}
    summary = engine_summary(engine, measured)
    summary.update(replay_fields(args, config))
    print_headline(summary)
    if args.out is not None:
        write_outputs(Path(args.out), engine, summary, source, num_requests,
                      config=ran_config(config, measured))
    return summary
