"""`python -m sim sweep ...` and `python -m sim plan [map|reserve] ...`.

    python -m sim sweep --config examples/sweep.yaml --out out/sweep
    python -m sim sweep --trace azure-conv --model llama-3.1-8b,qwen2.5-7b --tps 1,2 \\
        --chunk 2048,8192 --policy static,elastic --rate-scales 1,2 --out out/sweep
    python -m sim plan --model llama-3.1-8b --gpu h200 --trace azure-conv --window 0:600
    python -m sim plan map --gpu h200 --out out/map
    python -m sim plan reserve --gpu h100
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from sim.cli import add_engine_arguments
from sim.core.calibration import (
    choose_calibration,
    describe,
    parts_of,
    pricing,
    pricing_line,
    uncalibrated_warning,
)
from sim.planning import gain_map, plan, report, reserve
from sim.planning.cases import EngineOptions, TraceSpec
from sim.planning.map_figure import plot_map
from sim.planning.parallel import Executor
from sim.planning.pricing import options_engine, price_cases, pricing_lines
from sim.planning.spec import SweepSpec, load_sweep
from sim.planning.sweep import run_sweep, write_table
from sim.recording.metrics import Slo
from sim.recording.outputs import parse_int_list, parse_policies
from traces import TraceError, add_trace_arguments


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    sub = rest[0] if rest and command == "plan" and rest[0] in ("map", "reserve") else None
    handlers = {"sweep": sweep_main, "plan": plan_main, "map": map_main,
                "reserve": reserve_main}
    try:
        return handlers[sub or command](rest[1:] if sub else rest)
    except (TraceError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


# ----------------------------------------------------------------------------- shared flags
def _add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("execution")
    g.add_argument("--workers", type=int, default=None,
                   help="local worker processes (default: all cores; 1 runs in-process)")
    g.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="run on a Ray cluster at ADDRESS ('local' starts one here; "
                        "needs the optional ray extra)")
    g.add_argument("--no-progress", action="store_true")


def _executor(args: argparse.Namespace, workers: int | None = None) -> Executor:
    return Executor(args.workers or workers, args.ray, not args.no_progress)


def _options(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(
        max_num_seqs=args.max_num_seqs, gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len, block_size=args.block_size, drain=args.drain,
        vmm_handle_mib=args.vmm_handle_mib, reclaim=args.reclaim,
        enable_prefix_caching=args.enable_prefix_caching, cuda_graph_sizes=args.cuda_graph_sizes,
        piecewise_graphs=args.piecewise_graphs,
        piecewise_max_tokens=getattr(args, "piecewise_max_tokens", None))


def _trace_spec(args: argparse.Namespace) -> TraceSpec:
    return TraceSpec(source=args.trace, format=args.format, window_s=args.window,
                     limit=args.limit, sort=args.sort)


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{flag} takes numbers separated by commas, got {text!r}") from None
    if not values or min(values) <= 0:
        raise ValueError(f"{flag} values must be positive, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


# ----------------------------------------------------------------------------------- sweep
def sweep_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sim sweep",
        description="Run a grid of configurations over a trace and write one tidy table "
                    "(CSV, and Parquet when pyarrow is installed). Give a YAML config "
                    "(schema: examples/sweep.yaml) or the grid as flags.")
    parser.add_argument("--config", type=Path, default=None, help="sweep YAML")
    add_trace_arguments(parser, required=False)
    add_engine_arguments(parser)
    g = parser.add_argument_group("grid (flags; comma-separated lists)")
    g.add_argument("--tps", default=None, help="TP degrees, e.g. 1,2,4 (overrides --tp)")
    g.add_argument("--rate-scales", default=None, help="request-rate scales, e.g. 0.5,1,2")
    g.add_argument("--slo-ttft", type=float, default=None)
    g.add_argument("--slo-tpot", type=float, default=None)
    g.add_argument("--out", type=Path, default=None, help="folder for sweep.csv/.parquet")
    g.add_argument("--json", action="store_true", help="print the rows as JSON")
    _add_executor_arguments(parser)
    args = parser.parse_args(argv)
    spec = load_sweep(args.config) if args.config else _sweep_from_flags(args)
    choice = spec.calibration or args.calibration
    cases, calibrations = price_cases(spec.cases(), choice)
    rows = run_sweep(cases, _executor(args, spec.workers))
    for row, calibration in zip(rows, calibrations):
        row["pricing"] = describe(calibration)
    out = args.out or spec.out
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
    else:
        report.print_sweep(rows)
    lines, warnings = pricing_lines(cases, calibrations, forced=choice is not None)
    print("\n".join(lines), file=sys.stderr if args.json else sys.stdout)
    for warning in warnings:
        print(warning, file=sys.stderr)
    if out is not None:
        for path in write_table(rows, out):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _sweep_from_flags(args: argparse.Namespace) -> SweepSpec:
    if args.trace is None:
        raise ValueError("give --config FILE or --trace (with the grid as flags)")
    chunks = parse_int_list(args.chunk, "--chunk") if args.chunk else [8192]
    tps = parse_int_list(args.tps, "--tps") if args.tps else [args.tp]
    scales = _floats(args.rate_scales, "--rate-scales") if args.rate_scales else (1.0,)
    return SweepSpec(
        models=_names(args.model), gpus=_names(args.gpu), tps=tuple(tps), chunks=tuple(chunks),
        policies=tuple(p.value for p in parse_policies(args.policy)),
        rate_scales=tuple(s * args.rate_scale for s in scales), traces=(_trace_spec(args),),
        options=_options(args), slo=Slo(args.slo_ttft, args.slo_tpot))


# ------------------------------------------------------------------------------------ plan
def plan_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sim plan",
        description="Static at several chunk sizes versus elastic on one trace: KV capacity, "
                    "throughput, goodput, the chunk to pick and the max rate each sustains. "
                    "Also: `plan map` (where elastic pays) and `plan reserve` (reserve share). "
                    "plan always compares static with elastic (--policy is not used).")
    add_trace_arguments(parser)
    add_engine_arguments(parser)
    g = parser.add_argument_group("plan")
    g.add_argument("--slo-ttft", type=float, default=2.0, help="TTFT SLO, s (default 2)")
    g.add_argument("--slo-tpot", type=float, default=0.1, help="TPOT SLO, s (default 0.1)")
    g.add_argument("--no-max-rate", action="store_true", help="skip the max-rate search")
    g.add_argument("--rate-tol", type=float, default=0.05, help="max-rate bisection tolerance")
    g.add_argument("--attainment", type=float, default=0.95,
                   help="share of requests within SLO for a rate to count as sustained")
    g.add_argument("--tie-pct", type=float, default=1.0)
    g.add_argument("--pays-pct", type=float, default=5.0)
    g.add_argument("--json", action="store_true", help="print the plan as JSON")
    g.add_argument("--out", type=Path, default=None, help="write plan.json and plan.csv")
    _add_executor_arguments(parser)
    args = parser.parse_args(argv)
    options = _options(args)
    calibration = choose_calibration(args.calibration, args.model, args.gpu,
                                     options_engine(options))
    efficiency, profile, vmm_costs = parts_of(calibration)
    chunks = parse_int_list(args.chunk, "--chunk") if args.chunk else plan.DEFAULT_CHUNKS
    query = plan.PlanQuery(
        model=args.model, gpu=args.gpu, tp=args.tp, trace=_trace_spec(args),
        slo=Slo(args.slo_ttft, args.slo_tpot), chunks=tuple(chunks), options=options,
        rate_scale=args.rate_scale, search_max_rate=not args.no_max_rate,
        rel_tol=args.rate_tol, min_attainment=args.attainment, tie_pct=args.tie_pct,
        pays_pct=args.pays_pct, efficiency=efficiency, profile=profile,
        vmm_costs=vmm_costs)
    result = plan.run_plan(query, _executor(args))
    planned = {**result.as_dict(), "pricing": pricing(calibration)}
    if args.json:
        print(json.dumps(planned, indent=1, default=str))
    else:
        report.print_plan(result)
        print(pricing_line(calibration))
    if calibration is None:
        print(uncalibrated_warning(args.model, args.gpu, options_engine(options),
                                   forced=args.calibration is not None), file=sys.stderr)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan.json").write_text(json.dumps(planned, indent=1, default=str))
        write_table(result.rows, args.out, stem="plan")
        print(f"wrote {args.out / 'plan.json'} and plan.csv", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------- map
def map_main(argv: list[str]) -> int:
    d = gain_map.MapQuery()
    parser = argparse.ArgumentParser(
        prog="python -m sim plan map",
        description="Elastic's goodput gain over the best static chunk across models x prompt "
                    "lengths x TP degrees, on small synthetic traces that stress the KV pool.")
    parser.add_argument("--gpu", default=d.gpu)
    parser.add_argument("--models", default=",".join(d.models))
    parser.add_argument("--prompts", default=",".join(map(str, d.prompts)),
                        help="prompt lengths, tokens")
    parser.add_argument("--tps", default=",".join(map(str, d.tps)))
    parser.add_argument("--chunks", default=",".join(map(str, d.chunks)))
    parser.add_argument("--num-requests", type=int, default=d.num_requests)
    parser.add_argument("--load", type=float, default=d.load,
                        help="offered load over the rate that just fills the static KV pool")
    parser.add_argument("--pays-pct", type=float, default=d.pays_pct,
                        help="a cell 'pays' when elastic's goodput gain is at least this, %%")
    parser.add_argument("--slo-ttft", type=float, default=None)
    parser.add_argument("--slo-tpot", type=float, default=None)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--out", type=Path, default=None,
                        help="write map.png, map.csv (cells), map_runs.csv (every run)")
    parser.add_argument("--json", action="store_true")
    _add_executor_arguments(parser)
    args = parser.parse_args(argv)
    query = replace(
        d, gpu=args.gpu, models=_names(args.models),
        prompts=tuple(parse_int_list(args.prompts, "--prompts")),
        tps=tuple(parse_int_list(args.tps, "--tps")),
        chunks=tuple(parse_int_list(args.chunks, "--chunks")), num_requests=args.num_requests,
        load=args.load, pays_pct=args.pays_pct, slo=Slo(args.slo_ttft, args.slo_tpot),
        seed=args.seed)
    gain_map.check_names(query)
    cells, rows = gain_map.run_map(query, _executor(args))
    if args.json:
        print(json.dumps([gain_map.cell_row(c) for c in cells], indent=1))
    else:
        report.print_map(cells, query)
    if args.out is not None:
        write_table([gain_map.cell_row(c) for c in cells], args.out, stem="map")
        write_table(rows, args.out, stem="map_runs")
        print(f"wrote {plot_map(cells, query, args.out / 'map.png')}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------------- reserve
def reserve_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sim plan reserve",
        description="Activation reserve as a share of the KV pool (memory plan only).")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--models", default="qwen2.5-7b,llama-3.1-8b,qwen2.5-32b,llama-3.1-70b")
    parser.add_argument("--tps", default="1,2,4,8")
    parser.add_argument("--chunks", default="2048,8192,32768")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write reserve.csv")
    args = parser.parse_args(argv)
    rows = reserve.reserve_rows(
        _names(args.models), args.gpu, parse_int_list(args.tps, "--tps"),
        parse_int_list(args.chunks, "--chunks"), args.max_num_seqs)
    report.print_reserve(rows)
    if args.out is not None:
        write_table(rows, args.out, stem="reserve")
    return 0
