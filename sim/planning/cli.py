"""`python -m sim sweep ...` and `python -m sim plan ...`; `plan fleet`, `plan map` and
`plan reserve` are handed to their own modules (fleet_cli, map_cli).

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
from pathlib import Path

from sim.core.calibration import (
    choose_calibration,
    describe,
    parts_of,
    pricing,
    pricing_line,
    uncalibrated_warning,
)
from sim.core.calibration.coverage import StepExtent, extrapolation_note, grid_extent
from sim.core.config_flags import (
    CommandParser,
    add_engine_flags,
    positive_float,
    positive_int,
    setting_default,
)
from sim.core.engine_config import DEFAULT_GPU, DEFAULT_MODEL
from sim.planning import plan, plan_report, report
from sim.planning.cases import build_trace
from sim.planning.flags import (
    add_executor_arguments,
    add_out_arguments,
    add_slo_arguments,
    claim_out,
    executor_from,
    options_from,
    trace_spec_from,
)
from sim.planning.fleet_cli import fleet_main
from sim.planning.map_cli import map_main, reserve_main
from sim.planning.pricing import (
    calibration_grids,
    options_engine,
    past_grid_lines,
    price_cases,
    pricing_lines,
)
from sim.planning.spec import SWEEP_FIXED, SweepSpec, load_sweep
from sim.planning.sweep import SWEEP_FILES, open_table, run_sweep, write_parquet, write_table
from sim.recording.metrics import Slo
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


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{flag} takes numbers separated by commas, got {text!r}") from None
    if not values or min(values) <= 0:
        raise ValueError(f"{flag} values must be positive, got {text!r}")
    return values


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
    add_slo_arguments(g, None, None)
    _add_sweep_out_arguments(g)
    g.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_executor_arguments(parser)
    args = parser.parse_args(argv)
    spec = load_sweep(args.config) if args.config else _sweep_from_flags(args)
    choice = spec.calibration or args.calibration
    cases, calibrations = price_cases(spec.cases(), choice)
    grids = calibration_grids(calibrations)
    out = args.out or spec.out
    rows = _sweep_rows(cases, calibrations, args, executor_from(args, spec.workers), out)
    if rows is None:
        return 130
    try:
        return _sweep_report(rows, cases, calibrations, choice is not None, args, out, grids)
    except KeyboardInterrupt:
        return report.stopped("sweep", out, SWEEP_FILES)


def _sweep_report(rows: list[dict], cases, calibrations, forced: bool,
                  args: argparse.Namespace, out: Path | None, grids: dict) -> int:
    """Print the rows, pricing, the rows past their calibration's grid and failures; add
    sweep.parquet beside sweep.csv."""
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
    else:
        report.print_sweep(rows)
    lines, warnings = pricing_lines(cases, calibrations, forced=forced)
    print("\n".join(lines), file=sys.stderr if args.json else sys.stdout)
    for warning in [*warnings, *past_grid_lines(rows, grids)]:
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
        rate_scales=tuple(s * args.rate_scale for s in scales), traces=(trace_spec_from(args),),
        options=options_from(args), slo=Slo(args.slo_ttft, args.slo_tpot))


# ------------------------------------------------------------------------------------ plan
PLAN_FILES = ("plan.json", "plan.csv", "plan.parquet")


def plan_main(argv: list[str]) -> int:
    args = _plan_parser().parse_args(argv)
    model, gpu = getattr(args, "model", DEFAULT_MODEL), getattr(args, "gpu", DEFAULT_GPU)
    options = options_from(args)
    calibration = choose_calibration(args.calibration, model, gpu, options_engine(options),
                                     attention_backend=options.attention_backend)
    efficiency, profile, vmm_costs = parts_of(calibration)
    grid = grid_extent(calibration.data, calibration.source) if calibration else None
    query = plan.PlanQuery(
        model=model, gpu=gpu,
        tp=getattr(args, "tensor_parallel_size", setting_default("tensor_parallel_size")),
        trace=trace_spec_from(args), slo=Slo(args.slo_ttft, args.slo_tpot),
        chunks=tuple(args.max_num_batched_tokens), options=options,
        rate_scale=args.rate_scale,
        max_rate=plan.MaxRateRows("none" if args.no_max_rate else args.max_rate),
        max_requests=None if args.full_trace else args.max_requests,
        rel_tol=args.rate_tol, min_attainment=args.attainment, tie_pct=args.tie_pct,
        pays_pct=args.pays_pct, efficiency=efficiency, profile=profile,
        vmm_costs=vmm_costs)
    build_trace(query.trace)  # a trace that cannot load fails before --out is touched
    folder = claim_out(args, PLAN_FILES)
    try:
        result = plan.run_plan(query, executor_from(args))
        past_grid = past_grid_notes(result.rows, grid, calibration.source if calibration else "")
        planned = {**result.as_dict(), "pricing": pricing(calibration), "past_grid": past_grid}
        if args.json:
            print(json.dumps(planned, indent=1, default=str))
        else:
            plan_report.print_plan(result)
            print(pricing_line(calibration))
        if calibration is None:
            print(uncalibrated_warning(model, gpu, options_engine(options),
                                       forced=args.calibration is not None), file=sys.stderr)
        for note in past_grid:
            print(f"note: {note}", file=sys.stderr)
        if folder is not None:  # plan.json last: beside it, plan.csv is always complete
            write_table(result.rows, folder.path, stem="plan")
            folder.write_text("plan.json", json.dumps(planned, indent=1, default=str))
            print(f"wrote {folder.path / 'plan.json'} and plan.csv", file=sys.stderr)
    except KeyboardInterrupt:
        return report.stopped("plan", args.out, PLAN_FILES)
    return 0


def past_grid_notes(rows: list[dict], grid: StepExtent | None, source: str) -> list[str]:
    """What the plan says of its runs whose steps went past `grid`, the extent of calibration
    `source`'s grid (sim.core.calibration.coverage): one note per such policy and chunk."""
    notes = (extrapolation_note(f"{row['policy']} at chunk {row['chunk']:,}",
                                StepExtent.from_row(row), grid, source)
             for row in rows if row.get("fits"))
    return [note for note in notes if note]


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
    add_slo_arguments(g, 2.0, 0.1)
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
    add_out_arguments(g, "plan.json and plan.csv")
    add_executor_arguments(parser)
    return parser
