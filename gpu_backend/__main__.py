"""`python -m gpu_backend replay|profile`: the real-GPU engine's command line.

    python -m gpu_backend replay --trace azure-conv --limit 300 --model qwen2.5-0.5b \
        --policy elastic --chunk 2048 --no-wait --out out/gpu_elastic
    python -m gpu_backend profile --model llama-3.1-8b --out calib_llama8b.json

`replay` runs one policy per process (each builds its own memory plan and pool); `profile`
writes the calibration JSON the simulator reads with `--calibration`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from sim.core.catalog import MIB, get_gpu, get_model
from sim.core.elastic import DrainStrategy, Policy
from sim.core.engine_config import EngineConfig
from traces import TraceError, add_trace_arguments, trace_from_args


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default="qwen2.5-0.5b", help="preset name or a config.json path")
    g.add_argument("--gpu", default="h200", help="GPU preset for peak rates (memory is measured)")
    g.add_argument("--max-num-batched-tokens", "--chunk", type=int, default=None, dest="chunk")
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--vmm-handle-mib", type=int, default=512)


def add_piecewise_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--piecewise-graphs", action="store_true", help=what)
    parser.add_argument("--piecewise-max-tokens", type=int, default=None, metavar="N",
                        help="with --piecewise-graphs: capture up to N tokens only (default: the "
                             "chunk); a longer step runs fully eager, as vLLM's default cap of "
                             "512 does")


def piecewise_cap(args: argparse.Namespace) -> int | None:
    """--piecewise-max-tokens, checked: only with --piecewise-graphs, at least 1."""
    cap = args.piecewise_max_tokens
    if cap is not None and not args.piecewise_graphs:
        raise ValueError("--piecewise-max-tokens caps the piecewise graphs: add --piecewise-graphs")
    if cap is not None and cap < 1:
        raise ValueError(f"--piecewise-max-tokens {cap}: give 1 or more tokens")
    return cap


def engine_config(args: argparse.Namespace, policy: Policy) -> EngineConfig:
    return EngineConfig(
        model=get_model(args.model), gpu=get_gpu(args.gpu), max_num_batched_tokens=args.chunk,
        tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),
        max_num_seqs=args.max_num_seqs, gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len, block_size=args.block_size, policy=policy,
        drain=DrainStrategy.parse(getattr(args, "drain", "preempt")),
        vmm_handle_bytes=args.vmm_handle_mib * MIB, reclaim="release")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpu_backend",
                                     description="Real-GPU paged-KV engine with an elastic reserve.")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="replay a trace through the engine (one policy)")
    add_trace_arguments(rp)
    add_engine_arguments(rp)
    rp.add_argument("--policy", default="static", choices=[p.value for p in Policy])
    rp.add_argument("--drain", default="preempt", choices=[d.value for d in DrainStrategy],
                    help="preempt (default here: the path measured on the H200) or migrate "
                         "(the simulator's default; block copies tested on CPU only)")
    rp.add_argument("--no-wait", action="store_true",
                    help="virtual clock: advance by measured step times, skip idle gaps")
    rp.add_argument("--no-graphs", action="store_true", help="run decode steps eagerly")
    add_piecewise_arguments(rp, "steps with prefill tokens replay piecewise CUDA graphs (the "
                                "layers between attentions) captured at padded token counts")
    rp.add_argument("--torch-cap", default="auto", choices=["auto", "on", "off"],
                    help="cap torch's allocator at the unlent reserve (auto: overcommit only)")
    rp.add_argument("--max-kv-blocks", type=int, default=None,
                    help="cap the base KV pool (memory pressure on a large GPU)")
    rp.add_argument("--tensor-parallel-size", "--tp", type=int, default=1,
                    dest="tensor_parallel_size",
                    help="GPUs per model (one process each, NCCL; needs --no-wait)")
    rp.add_argument("--out", type=Path, default=None)
    pp = sub.add_parser("profile", help="measure step times and fit the cost model")
    add_engine_arguments(pp)
    pp.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    pp.add_argument("--quick", action="store_true", help="a small grid (tests, smoke runs)")
    pp.add_argument("--passes", type=int, default=2,
                    help="time the grid this many times, every other pass in reverse order, and "
                         "keep each point's median (a drift of the host's speed cancels)")
    pp.add_argument("--replay-setup", action="store_true",
                    help="time the grid as a replay runs its steps: graphs of the replay's "
                         "capture sizes, tables --max-model-len wide, a pool over 60%% of free "
                         "memory with blocks scattered")
    add_piecewise_arguments(pp, "time steps with prefill tokens through piecewise CUDA graphs, "
                                "as a replay with --piecewise-graphs runs them")
    pp.add_argument("--no-attention-profile", action="store_true",
                    help="skip timing each prefill launch's attention on its own (the attention's "
                         "terms are then fitted on the whole steps, as before 2026-11-30's ninth "
                         "session)")
    pp.add_argument("--out", type=Path, default=None)
    fp = sub.add_parser("refit", help="fit a calibration's stored measurements again (no GPU)")
    fp.add_argument("calibration", type=Path)
    fp.add_argument("--out", type=Path, default=None, help="default: overwrite the input")
    fp.add_argument("--merge", type=Path, nargs="+", default=[], metavar="CALIBRATION",
                    help="profiles of the same grid taken at other times: each point's timings "
                         "become the median over all of them before the fit")
    fp.add_argument("--program-from", type=Path, default=None, metavar="CALIBRATION",
                    help="hold attention_program (one attention program's speed) at this "
                         "calibration's (same GPU, a model of the same head_dim): for a grid "
                         "without the chunk-beside-long-decode-rows steps that tell it")
    fp.add_argument("--copy-bandwidth", type=float, default=None, metavar="BYTES_S",
                    help="measured device-to-device copy bandwidth that pins weight streaming "
                         "(default: the calibration's own copy_bandwidth_bytes_s, if any)")
    return parser


def run_refit(args: argparse.Namespace) -> int:
    from gpu_backend.engine.calibrate import merge_profiles, refit_calibration, write_calibration

    data = read_json(args.calibration)
    if args.merge:
        data = merge_profiles(data, [read_json(path) for path in args.merge],
                              [str(path) for path in args.merge])
    program = ((str(args.program_from), read_json(args.program_from))
               if args.program_from is not None else None)
    result = refit_calibration(data, args.copy_bandwidth, program)
    write_calibration(args.out or args.calibration, result)
    print(json.dumps({"efficiency": result["efficiency"],
                      "median_abs_rel": result["fit_error"]["median_abs_rel"]}, indent=2))
    return 0


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read calibration JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("measurements"), list):
        raise ValueError(f"{path}: not a calibration (no \"measurements\" list); give a JSON "
                         "written by `python -m gpu_backend profile`")
    return data


def run_replay(args: argparse.Namespace) -> int:
    import torch

    from gpu_backend.engine.hostprobe import HostProbe
    from gpu_backend.engine.replay import (
        engine_summary,
        print_headline,
        replay,
        replay_fields,
        write_outputs,
    )
    from gpu_backend.engine.setup import build_gpu_engine
    from gpu_backend.env import versions

    trace = trace_from_args(args)
    config = engine_config(args, Policy.parse(args.policy))
    if config.tensor_parallel_size > 1:
        if args.piecewise_graphs:
            raise ValueError("--piecewise-graphs runs on one GPU only: drop it or --tp")
        from gpu_backend.tp.launch import run_tp_replay

        return run_tp_replay(args, config)
    setup_start = time.perf_counter()
    setup = build_gpu_engine(config, seed=args.seed, use_graphs=not args.no_graphs,
                             torch_cap=args.torch_cap, max_kv_blocks=args.max_kv_blocks,
                             piecewise=args.piecewise_graphs,
                             piecewise_max_tokens=piecewise_cap(args))
    setup_s = time.perf_counter() - setup_start
    engine, m = setup.engine, setup.measurement
    print(f"setup {setup_s:.1f} s: KV {engine.core.plan.num_kv_blocks} blocks "
          f"(+{engine.core.layout.num_elastic_blocks} elastic), reserve "
          f"{engine.core.plan.activation_reserve_bytes / 2**30:.2f} GiB", flush=True)

    def progress(now_s: float, submitted: int, steps: int) -> None:
        print(f"  t={now_s:8.2f} s  submitted {submitted}  steps {steps}", flush=True)

    wall_start = time.perf_counter()
    probe = HostProbe() if args.no_wait else None
    replay(engine, trace.requests(), wait=not args.no_wait, progress=progress, host_probe=probe)
    measured = {
        # the host's speed during the replay (a fixed Python loop; gpu_backend.engine.hostprobe)
        "host_probe": probe.summary() if probe is not None else None,
        "setup_s": setup_s, "replay_wall_s": time.perf_counter() - wall_start,
        "clock": "wall" if not args.no_wait else "virtual",
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
    }
    summary = engine_summary(engine, measured)
    summary.update(replay_fields(args, config))
    print_headline(summary)
    if args.out is not None:
        write_outputs(args.out, engine, summary, trace.source, len(trace))
    return 0


def run_profile(args: argparse.Namespace) -> int:
    from gpu_backend.engine.calibrate import calibrate, write_calibration

    config = engine_config(args, Policy.STATIC)
    result = calibrate(config, seed=args.seed, quick=args.quick, replay_setup=args.replay_setup,
                       passes=args.passes, piecewise=args.piecewise_graphs,
                       piecewise_max_tokens=piecewise_cap(args),
                       attention=not args.no_attention_profile)
    out = args.out or Path(f"calibration_{config.model.name}.json")
    write_calibration(out, result)
    print(json.dumps({"efficiency": result["efficiency"], "fit_error": result["fit_error"]},
                     indent=2))
    return 0


GPU_PACKAGES = ("torch", "triton", "cuda", "cuda.bindings")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
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
