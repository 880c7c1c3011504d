"""`python -m sim sweep ...` and `python -m sim plan [map|reserve] ...`.

    python -m sim sweep --config examples/sweep.yaml --out out/sweep
    python -m sim sweep --trace azure-conv --model llama-3.1-8b,qwen2.5-7b --tp 1,2 \\
        --chunk 2048,8192 --policy static,elastic --rate-scales 1,2 --out out/sweep
    python -m sim plan --model llama-3.1-8b --gpu h200 --trace azure-conv --window 0:600
    python -m sim plan fleet --model llama-3.1-70b --gpu h100 --tp 4,8 --trace azure-conv \\
        --rate-scale 4 --slo-ttft 2
    python -m sim plan map --gpu h200 --out out/map
    python -m sim plan reserve --gpu h100

The engine flags are EngineConfig's (sim.core.config_flags), with its defaults; the settings
a sweep's cases do not carry (SWEEP_FIXED) are left out of these commands.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from sim.core.calibration import (
    choose_calibration,
    describe,
    parts_of,
    pricing,
    pricing_line,
    uncalibrated_warning,
)
from sim.core.config_flags import (
    CommandParser,
    add_engine_flags,
    positive_float,
    positive_int,
    setting_default,
)
from sim.core.engine_config import DEFAULT_GPU, DEFAULT_MODEL
from sim.planning import gain_map, plan, plan_report, report, reserve
from sim.planning.cases import build_trace
from sim.planning.flags import add_executor_arguments as _add_executor_arguments
from sim.planning.flags import executor_from as _executor
from sim.planning.flags import options_from as _options
from sim.planning.flags import trace_spec_from as _trace_spec
from sim.planning.fleet_cli import fleet_main
from sim.planning.map_figure import plot_map
from sim.planning.pricing import options_engine, price_cases, pricing_lines
from sim.planning.spec import SWEEP_FIXED, SweepSpec, load_sweep
from sim.planning.sweep import SWEEP_FILES, open_table, run_sweep, write_parquet, write_table
from sim.recording.folder import OutputFolder
from sim.recording.metrics import Slo
from sim.recording.outputs import parse_int_list
from traces import TraceError, add_trace_arguments

SWEEP_AXES = ("model", "gpu", "tensor_parallel_size", "max_num_batched_tokens", "policy")


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    sub = (rest[0] if rest and command == "plan" and rest[0] in ("map", "reserve", "fleet")
           else None)
    handlers = {"sweep": sweep_main, "plan": plan_main, "map": map_main,
                "reserve": reserve_main, "fleet": fleet_main}
    try:
        return handlers[sub or command](rest[1:] if sub else rest)
    except (TraceError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before --out was claimed: each command handles the rest
        name = f"{command} {sub}" if sub else command
        print(f"interrupted: python -m sim {name} stopped before it wrote anything",
              file=sys.stderr)
        return 130


# ----------------------------------------------------------------------------- shared flags
def _add_slo_arguments(g, ttft_s: float | None, tpot_s: float | None) -> None:
    g.add_argument("--slo-ttft", type=positive_float, default=ttft_s,
                   help=f"TTFT SLO in seconds, for goodput (default: {ttft_s or 'none'})")
    g.add_argument("--slo-tpot", type=positive_float, default=tpot_s,
                   help=f"TPOT SLO in seconds, for goodput (default: {tpot_s or 'none'})")


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


def _add_out_arguments(g, files: str) -> None:
    g.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help=f"write {files} into DIR (new or empty unless --overwrite); checked "
                        "before any run")
    g.add_argument("--overwrite", action="store_true",
                   help=f"remove an earlier result's {files} from --out first")


def _claim(args: argparse.Namespace, patterns: tuple[str, ...]) -> OutputFolder | None:
    """Claim --out before any run (OutputError, one line, if it cannot be used)."""
    if args.out is None:
        return None
    return OutputFolder.claim(args.out, flag="--out", overwrite=args.overwrite,
                              patterns=patterns)


# ----------------------------------------------------------------------------------- sweep
def sweep_main(argv: list[str]) -> int:
    parser = CommandParser(
        prog="python -m sim sweep",
        description="Run a grid of configurations over a trace and write one tidy table "
                    "(CSV, and Parquet when pyarrow is installed). Give a YAML config "
                    "(schema: examples/sweep.yaml) or the grid as flags.")
    parser.add_argument("--config", type=Path, default=None, help="sweep YAML")
    add_trace_arguments(parser, required=False)
    add_engine_flags(parser, multi=SWEEP_AXES, keep_text=("model", "gpu"),
                     multi_defaults={"policy": "static,elastic"}, exclude=SWEEP_FIXED,
                     config_file=False)
    g = parser.add_argument_group("grid and output")
    g.add_argument("--rate-scales", default=None,
                   help="request-rate scales, comma-separated, e.g. 0.5,1,2 (default: 1)")
    g.add_argument("--calibration", default=None, metavar="FILE|none",
                   help="calibration JSON from `python -m gpu_backend profile` for every case "
                        "(default: the YAML's, else each case's shipped one, if any; 'none': "
                        "the datasheet roofline with default efficiencies)")
    _add_slo_arguments(g, None, None)
    _add_sweep_out_arguments(g)
    g.add_argument("--json", action="store_true", help="print the rows as JSON")
    _add_executor_arguments(parser)
    args = parser.parse_args(argv)
    spec = load_sweep(args.config) if args.config else _sweep_from_flags(args)
    choice = spec.calibration or args.calibration
    cases, calibrations = price_cases(spec.cases(), choice)
    out = args.out or spec.out
    rows = _sweep_rows(cases, calibrations, args, _executor(args, spec.workers), out)
    if rows is None:
        return 130
    try:
        return _sweep_report(rows, cases, calibrations, choice is not None, args, out)
    except KeyboardInterrupt:
        return report.stopped("sweep", out, SWEEP_FILES)


def _sweep_report(rows: list[dict], cases, calibrations, forced: bool,
                  args: argparse.Namespace, out: Path | None) -> int:
    """Print the rows, pricing and failures; add sweep.parquet beside sweep.csv."""
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
    else:
        report.print_sweep(rows)
    lines, warnings = pricing_lines(cases, calibrations, forced=forced)
    print("\n".join(lines), file=sys.stderr if args.json else sys.stdout)
    for warning in warnings:
        print(warning, file=sys.stderr)
    if out is not None:
        parquet = write_parquet(rows, out / "sweep.parquet")
        print(f"wrote {out / 'sweep.csv'}" + (f" and {parquet}" if parquet else ""),
              file=sys.stderr)
    failures = report.sweep_failures(rows, out)
    for line in failures:
        print(line, file=sys.stderr)
    return 1 if failures else 0


def _add_sweep_out_arguments(g) -> None:
    g.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="folder for sweep.csv (a row added as each case ends) and "
                        "sweep.parquet; new or empty unless --resume or --overwrite")
    g.add_argument("--resume", action="store_true",
                   help="keep the cases already in --out's sweep.csv and run the others "
                        "(cases that failed run again)")
    g.add_argument("--overwrite", action="store_true",
                   help="remove an earlier sweep's sweep.csv/.parquet from --out first")


def _sweep_rows(cases, calibrations, args: argparse.Namespace, executor,
                out: Path | None) -> list[dict] | None:
    """The sweep's rows, each added to OUT/sweep.csv as its case ends (OUT claimed first);
    None when Ctrl-C stopped it (said on stderr)."""
    if args.resume and out is None:
        raise ValueError("--resume needs --out DIR, the folder of the sweep to finish")
    table = open_table(out, resume=args.resume, overwrite=args.overwrite) if out else None
    try:
        return run_sweep(cases, executor, table=table,
                         extra=[{"pricing": describe(c)} for c in calibrations])
    except KeyboardInterrupt:
        done = len(table.rows) if table is not None else 0
        print(report.interrupted_sweep(done, len(cases), out), file=sys.stderr)
        return None


def _sweep_from_flags(args: argparse.Namespace) -> SweepSpec:
    if args.trace is None:
        raise ValueError("give --config FILE or --trace (with the grid as flags)")
    axes = {name: getattr(args, name, None) for name in SWEEP_AXES}
    scales = _floats(args.rate_scales, "--rate-scales") if args.rate_scales else (1.0,)
    return SweepSpec(
        models=tuple(axes["model"] or [DEFAULT_MODEL]), gpus=tuple(axes["gpu"] or [DEFAULT_GPU]),
        tps=tuple(axes["tensor_parallel_size"] or [setting_default("tensor_parallel_size")]),
        chunks=tuple(axes["max_num_batched_tokens"] or [None]),
        policies=tuple(p.value for p in axes["policy"] or ()),
        rate_scales=tuple(s * args.rate_scale for s in scales), traces=(_trace_spec(args),),
        options=_options(args), slo=Slo(args.slo_ttft, args.slo_tpot))


# ------------------------------------------------------------------------------------ plan
PLAN_FILES = ("plan.json", "plan.csv", "plan.parquet")


def plan_main(argv: list[str]) -> int:
    args = _plan_parser().parse_args(argv)
    model, gpu = getattr(args, "model", DEFAULT_MODEL), getattr(args, "gpu", DEFAULT_GPU)
    options = _options(args)
    calibration = choose_calibration(args.calibration, model, gpu, options_engine(options))
    efficiency, profile, vmm_costs = parts_of(calibration)
    query = plan.PlanQuery(
        model=model, gpu=gpu,
        tp=getattr(args, "tensor_parallel_size", setting_default("tensor_parallel_size")),
        trace=_trace_spec(args), slo=Slo(args.slo_ttft, args.slo_tpot),
        chunks=tuple(args.max_num_batched_tokens), options=options,
        rate_scale=args.rate_scale,
        max_rate=plan.MaxRateRows("none" if args.no_max_rate else args.max_rate),
        max_requests=None if args.full_trace else args.max_requests,
        rel_tol=args.rate_tol, min_attainment=args.attainment, tie_pct=args.tie_pct,
        pays_pct=args.pays_pct, efficiency=efficiency, profile=profile,
        vmm_costs=vmm_costs)
    build_trace(query.trace)  # a trace that cannot load fails before --out is touched
    folder = _claim(args, PLAN_FILES)
    try:
        result = plan.run_plan(query, _executor(args))
        planned = {**result.as_dict(), "pricing": pricing(calibration)}
        if args.json:
            print(json.dumps(planned, indent=1, default=str))
        else:
            plan_report.print_plan(result)
            print(pricing_line(calibration))
        if calibration is None:
            print(uncalibrated_warning(model, gpu, options_engine(options),
                                       forced=args.calibration is not None), file=sys.stderr)
        if folder is not None:  # plan.json last: beside it, plan.csv is always complete
            write_table(result.rows, folder.path, stem="plan")
            folder.write_text("plan.json", json.dumps(planned, indent=1, default=str))
            print(f"wrote {folder.path / 'plan.json'} and plan.csv", file=sys.stderr)
    except KeyboardInterrupt:
        return report.stopped("plan", args.out, PLAN_FILES)
    return 0


def _plan_parser() -> CommandParser:
    parser = CommandParser(
        prog="python -m sim plan",
        description="Static at several chunk sizes versus elastic on one trace: KV capacity, "
                    "throughput, goodput, the chunk to pick and the max rate the picks "
                    "sustain. Also: `plan fleet` (how many GPUs meet SLO targets), `plan map` "
                    "(where elastic pays) and `plan reserve` (reserve share).")
    add_trace_arguments(parser)
    add_engine_flags(parser, multi=("max_num_batched_tokens",), keep_text=("model", "gpu"),
                     multi_defaults={"max_num_batched_tokens": ",".join(
                         map(str, plan.DEFAULT_CHUNKS))},
                     exclude=("policy", *SWEEP_FIXED), config_file=False)
    g = parser.add_argument_group("plan (static and elastic are both run)")
    g.add_argument("--calibration", default=None, metavar="FILE|none",
                   help="calibration JSON from `python -m gpu_backend profile` (default: the "
                        "one shipped for the model, GPU and engine, if any; 'none': the "
                        "datasheet roofline with default efficiencies)")
    _add_slo_arguments(g, 2.0, 0.1)
    g.add_argument("--max-rate", choices=[m.value for m in plan.MaxRateRows], default="picks",
                   help="rows that get a max-rate search: the static and elastic picks, "
                        "every fitting row, or none (default: picks)")
    g.add_argument("--no-max-rate", action="store_true", help="as --max-rate none")
    g.add_argument("--max-requests", type=positive_int, default=plan.DEFAULT_MAX_REQUESTS,
                   help="run a longer trace on its busiest stretch of this many requests, "
                        "said in the output (default: %(default)s)")
    g.add_argument("--full-trace", action="store_true", help="run every request of the trace")
    g.add_argument("--rate-tol", type=positive_float, default=0.05,
                   help="max-rate bisection tolerance, relative (default: 0.05)")
    g.add_argument("--attainment", type=positive_float, default=0.95,
                   help="share of requests within SLO for a rate to count as sustained "
                        "(default: 0.95)")
    g.add_argument("--tie-pct", type=positive_float, default=1.0,
                   help="goodputs within this many percent of the best tie (default: 1)")
    g.add_argument("--pays-pct", type=positive_float, default=5.0,
                   help="elastic pays at a gain of at least this many percent (default: 5)")
    g.add_argument("--json", action="store_true", help="print the plan as JSON")
    _add_out_arguments(g, "plan.json and plan.csv")
    _add_executor_arguments(parser)
    return parser


# ------------------------------------------------------------------------------------- map
MAP_FILES = ("map.png", "map.csv", "map.parquet", "map_runs.csv", "map_runs.parquet")


def map_main(argv: list[str]) -> int:
    d = gain_map.MapQuery()
    args = _map_parser(d).parse_args(argv)
    query = replace(
        d, gpu=getattr(args, "gpu", d.gpu), models=_names(args.models),
        prompts=tuple(parse_int_list(args.prompts, "--prompts")),
        tps=tuple(parse_int_list(args.tps, "--tps")),
        chunks=tuple(parse_int_list(args.chunks, "--chunks")), num_requests=args.num_requests,
        load=args.load, pays_pct=args.pays_pct, slo=Slo(args.slo_ttft, args.slo_tpot),
        seed=args.seed)
    gain_map.check_names(query)
    folder = _claim(args, MAP_FILES)
    try:
        cells, rows = gain_map.run_map(query, _executor(args))
        if args.json:
            print(json.dumps([gain_map.cell_row(c) for c in cells], indent=1))
        else:
            report.print_map(cells, query)
        if folder is not None:  # the figure last: beside it, both tables are complete
            write_table(rows, folder.path, stem="map_runs")
            write_table([gain_map.cell_row(c) for c in cells], folder.path, stem="map")
            with folder.path_for("map.png") as tmp:
                plot_map(cells, query, tmp)
            print(f"wrote {folder.path / 'map.png'}, map.csv and map_runs.csv",
                  file=sys.stderr)
    except KeyboardInterrupt:  # the map's files need every cell: none is written before
        return report.stopped("plan map", args.out, MAP_FILES)
    return 0


def _map_parser(d: gain_map.MapQuery) -> CommandParser:
    parser = CommandParser(
        prog="python -m sim plan map",
        description="Elastic's goodput gain over the best static chunk across models x prompt "
                    "lengths x TP degrees, on small synthetic traces that stress the KV pool.")
    add_engine_flags(parser, include=("gpu",), keep_text=("gpu",), config_file=False)
    g = parser.add_argument_group("map")
    g.add_argument("--models", default=",".join(d.models),
                   help="models, comma-separated (default: %(default)s)")
    g.add_argument("--prompts", default=",".join(map(str, d.prompts)),
                   help="prompt lengths, tokens (default: %(default)s)")
    g.add_argument("--tps", default=",".join(map(str, d.tps)),
                   help="TP degrees (default: %(default)s)")
    g.add_argument("--chunks", default=",".join(map(str, d.chunks)),
                   help="static chunk sizes to beat (default: %(default)s)")
    g.add_argument("--num-requests", type=positive_int, default=d.num_requests,
                   help="requests per synthetic trace (default: %(default)s)")
    g.add_argument("--load", type=positive_float, default=d.load,
                   help="offered load over the rate that just fills the static KV pool "
                        "(default: %(default)s)")
    g.add_argument("--pays-pct", type=positive_float, default=d.pays_pct,
                   help="a cell 'pays' when elastic's goodput gain is at least this, %% "
                        "(default: %(default)s)")
    _add_slo_arguments(g, None, None)
    g.add_argument("--seed", type=int, default=d.seed, help="trace seed (default: %(default)s)")
    _add_out_arguments(g, "map.png, map.csv (cells) and map_runs.csv (every run)")
    g.add_argument("--json", action="store_true", help="print the cells as JSON")
    _add_executor_arguments(parser)
    return parser


# --------------------------------------------------------------------------------- reserve
RESERVE_FILES = ("reserve.csv", "reserve.parquet")


def reserve_main(argv: list[str]) -> int:
    parser = CommandParser(
        prog="python -m sim plan reserve",
        description="Activation reserve as a share of the KV pool (memory plan only).")
    add_engine_flags(parser, include=("gpu", "max_num_seqs"), keep_text=("gpu",),
                     config_file=False)
    g = parser.add_argument_group("grid")
    g.add_argument("--models", default="qwen2.5-7b,llama-3.1-8b,qwen2.5-32b,llama-3.1-70b",
                   help="models, comma-separated (default: %(default)s)")
    g.add_argument("--tps", default="1,2,4,8", help="TP degrees (default: %(default)s)")
    g.add_argument("--chunks", default="2048,8192,32768",
                   help="chunk sizes (default: %(default)s)")
    _add_out_arguments(g, "reserve.csv")
    args = parser.parse_args(argv)
    tps, chunks = parse_int_list(args.tps, "--tps"), parse_int_list(args.chunks, "--chunks")
    folder = _claim(args, RESERVE_FILES)
    try:
        rows = reserve.reserve_rows(_names(args.models), getattr(args, "gpu", DEFAULT_GPU), tps,
                                    chunks, getattr(args, "max_num_seqs", None))
        report.print_reserve(rows)
        if folder is not None:
            write_table(rows, folder.path, stem="reserve")
            print(f"wrote {folder.path / 'reserve.csv'}", file=sys.stderr)
    except KeyboardInterrupt:
        return report.stopped("plan reserve", args.out, RESERVE_FILES)
    return 0
