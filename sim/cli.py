"""`python -m sim --trace FILE`: run policies x chunk sizes over one trace and compare them.

    python -m sim --trace azure-conv
    python -m sim --trace azure-code --policy all --chunk 2048,8192,32768 --out out/ --plot
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from sim.core.calibration import (
    choose_calibration,
    engine_kinds_of,
    parts_of,
    piecewise_mismatch,
    pricing,
    pricing_line,
    uncalibrated_warning,
)
from sim.core.catalog import MIB, get_gpu, get_model
from sim.core.cost_model import Efficiency, host_slower, piecewise_sizes_for
from sim.core.elastic import DrainStrategy
from sim.core.engine_config import EngineConfig
from sim.progress import progress_bar
from sim.recording.metrics import Slo
from sim.recording.outputs import parse_int_list, parse_policies
from sim.report import print_comparison, write_outputs
from sim.runner import RunResult, RunSpec, simulate
from traces import TraceError, add_trace_arguments, trace_from_args


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Engine flags named as vLLM names them (with --tp and --chunk as short aliases)."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default="llama-3.1-8b", help="preset name or a config.json path")
    g.add_argument("--gpu", default="h200", help="GPU preset (h200, h100-80gb, a100-40gb, ...)")
    g.add_argument("--tensor-parallel-size", "--tp", type=int, default=1, dest="tp")
    g.add_argument("--max-num-batched-tokens", "--chunk", default=None, dest="chunk",
                   help="chunk size(s), comma-separated (default: vLLM's for the GPU)")
    g.add_argument("--max-num-seqs", type=int, default=None,
                   help="default: vLLM's for the GPU (1024 with >= 70 GiB, else 256)")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--enable-prefix-caching", action="store_true")
    g.add_argument("--policy", default="static,elastic",
                   help="static, elastic, overcommit, comma-separated, or all")
    g.add_argument("--drain", default="migrate", choices=[d.value for d in DrainStrategy],
                   help="how the elastic policy empties the reserve before a prefill")
    g.add_argument("--vmm-handle-mib", type=int, default=512,
                   help="VMM handle size for the elastic reserve (multiple of 2 MiB)")
    g.add_argument("--reclaim", default="remap", choices=["remap", "release"])
    g.add_argument("--calibration", default=None, metavar="FILE|none",
                   help="calibration JSON from `python -m gpu_backend profile` (default: the "
                        "one shipped for the model, GPU and engine, if any; 'none': the "
                        "datasheet roofline with default efficiencies)")
    g.add_argument("--cuda-graph-sizes", type=parse_graph_sizes, default=(),
                   help="decode CUDA graph batch sizes, comma-separated: a decode-only batch is "
                        "priced padded to the next size up, eager beyond the largest (vLLM "
                        "captures 1,2,4,8,16,24,...,512; default: each batch at its own size)")
    g.add_argument("--piecewise-graphs", action="store_true",
                   help="steps with prefill tokens run piecewise CUDA graphs: their linear "
                        "layers are priced padded to the next of piecewise_capture_sizes(chunk) "
                        "(as `python -m gpu_backend replay --piecewise-graphs`)")
    g.add_argument("--piecewise-max-tokens", type=int, default=None, metavar="N",
                   help="with --piecewise-graphs: the graphs stop at N tokens (as the engine's "
                        "--piecewise-max-tokens); a longer step is priced fully eager, with "
                        "the calibration's eager_launch_s")


def parse_graph_sizes(text: str) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8); '' or 'none' -> ()."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--cuda-graph-sizes {text!r}: expected positive batch sizes separated by commas, "
            "e.g. 1,2,4,8,16,32") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(
            f"--cuda-graph-sizes {text!r}: every size must be a positive batch size")
    return sizes


def engine_configs(args: argparse.Namespace) -> list[EngineConfig]:
    """One EngineConfig per (policy, chunk) combination named on the command line."""
    base = EngineConfig(
        model=get_model(args.model), gpu=get_gpu(args.gpu), tensor_parallel_size=args.tp,
        max_num_seqs=args.max_num_seqs, gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len, block_size=args.block_size,
        drain=DrainStrategy.parse(args.drain), vmm_handle_bytes=args.vmm_handle_mib * MIB,
        reclaim=args.reclaim, enable_prefix_caching=args.enable_prefix_caching,
        cuda_graph_sizes=args.cuda_graph_sizes,
    )
    policies = parse_policies(args.policy)
    chunks = parse_int_list(args.chunk, "--max-num-batched-tokens") if args.chunk else [None]
    configs = [replace(base, policy=p, max_num_batched_tokens=c)
               for c in chunks for p in policies]
    cap = getattr(args, "piecewise_max_tokens", None)
    if cap is not None and not args.piecewise_graphs:
        raise ValueError("--piecewise-max-tokens caps the piecewise graphs: add --piecewise-graphs")
    if not args.piecewise_graphs:
        return configs
    return [replace(c, piecewise_graph_sizes=piecewise_sizes_for(c.chunk_tokens, cap))
            for c in configs]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sim",
        description="Simulate an LLM serving engine on a request trace and compare static, "
                    "elastic and overcommitted activation reserves. Subcommands: "
                    "`python -m sim memory ...`, `python -m sim sweep ...`, `python -m sim plan ...`.",
    )
    add_trace_arguments(parser)
    add_engine_arguments(parser)
    g = parser.add_argument_group("fleet and output")
    g.add_argument("--num-replicas", "--replicas", type=int, default=1, dest="replicas")
    g.add_argument("--router", default="round-robin", choices=["round-robin", "least-tokens"])
    g.add_argument("--slo-ttft", type=float, default=None, help="TTFT SLO in seconds (goodput)")
    g.add_argument("--slo-tpot", type=float, default=None, help="TPOT SLO in seconds (goodput)")
    g.add_argument("--out", type=Path, default=None, help="write summary.json, CSVs (and plots)")
    g.add_argument("--plot", action="store_true", help="with --out: write PNG plots")
    g.add_argument("--json", action="store_true", help="print the summaries as JSON")
    g.add_argument("--no-progress", action="store_true")
    g.add_argument("--host-slowdown", type=float, default=1.0, metavar="FACTOR",
                   help="what-if: a host FACTOR times as slow (the per-step host terms of the "
                        "calibration multiplied; launch-bound steps of small models feel it)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        trace = trace_from_args(args)
        configs = engine_configs(args)
        kind = engine_kinds_of(configs)
        calibration = choose_calibration(args.calibration, configs[0].model.name,
                                         configs[0].gpu.name, kind)
        efficiency, profile, vmm_costs = parts_of(calibration)
        capped = any(c.piecewise_graph_sizes and max(c.piecewise_graph_sizes) < c.chunk_tokens
                     for c in configs)
        note = piecewise_mismatch(calibration, args.piecewise_graphs, capped)
        if note:
            print(f"note: {note}", file=sys.stderr)
        if args.host_slowdown != 1.0:
            efficiency = host_slower(efficiency or Efficiency(), args.host_slowdown)
    except (TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    slo = Slo(args.slo_ttft, args.slo_tpot)
    results: list[RunResult] = []
    for config in configs:
        spec = RunSpec(config, args.replicas, args.router, efficiency, profile, slo, vmm_costs)
        try:
            with progress_bar(spec.label, trace, disabled=args.no_progress) as progress:
                results.append(simulate(spec, trace, progress))
        except ValueError as exc:  # a configuration that does not fit the GPU, say
            print(f"error: {spec.label}: {exc}", file=sys.stderr)
            return 2
    for result in results:
        result.summary["pricing"] = pricing(calibration)
    if args.json:
        print(json.dumps([r.summary for r in results], indent=2))
    else:
        print_comparison(results, trace)
        print(pricing_line(calibration))
    if calibration is None:
        print(uncalibrated_warning(configs[0].model.name, configs[0].gpu.name, kind,
                                   forced=args.calibration is not None), file=sys.stderr)
    if args.out is not None:
        write_outputs(args.out, results, trace, plot=args.plot)
    return 0
