"""`python -m sim plan fleet ...`: how many GPUs serve a trace within SLO targets.

    python -m sim plan fleet --model llama-3.1-70b --gpu h100 --tp 4,8 \\
        --trace azure-conv --rate-scale 4 --slo-ttft 2
    python -m sim plan fleet --model llama-3.1-8b --gpu h100,h200 \\
        --gpu-cost h100=2.5,h200=3.5 --trace azure-conv --slo-ttft 2 --slo-tpot 0.1

The engine flags are EngineConfig's (sim.core.config_flags); GPU, TP, chunk and policy take
several values and the search covers every combination.
"""

from __future__ import annotations

import json
import sys

from sim.core.config_flags import CommandParser, add_engine_flags, positive_float, positive_int
from sim.core.engine_config import DEFAULT_MODEL
from sim.planning.cases import build_trace
from sim.planning.flags import (
    add_executor_arguments,
    add_out_arguments,
    claim_out,
    executor_from,
    options_from,
    trace_spec_from,
)
from sim.planning.fleet import FleetQuery, FleetResult, Objective, run_fleet
from sim.planning.fleet_report import fleet_dict, print_fleet, trial_rows
from sim.planning.report import stopped
from sim.planning.spec import SWEEP_FIXED
from sim.planning.stretch import DEFAULT_MAX_REQUESTS
from sim.planning.sustain import Sustain
from sim.planning.sweep import write_table
from sim.recording.folder import OutputFolder
from sim.recording.metrics import Slo
from traces import add_trace_arguments

FLEET_AXES = ("gpu", "tensor_parallel_size", "max_num_batched_tokens", "policy")
FLEET_FILES = ("fleet.json", "fleet_trials.csv", "fleet_trials.parquet")


def fleet_main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    costs = parse_gpu_costs(args.gpu_cost)
    objective = Objective(args.objective or ("cost" if costs else "gpus"))
    query = FleetQuery(
        model=getattr(args, "model", DEFAULT_MODEL),
        gpus=tuple(getattr(args, "gpu", None) or ("h200",)),
        tps=tuple(args.tensor_parallel_size),
        chunks=tuple(getattr(args, "max_num_batched_tokens", None) or (None,)),
        policies=tuple(p.value for p in args.policy), trace=trace_spec_from(args),
        rule=Sustain(Slo(args.slo_ttft, args.slo_tpot), args.attainment),
        rate_scale=args.rate_scale, options=options_from(args), router=args.router,
        gpu_costs=costs, objective=objective, max_replicas=args.max_replicas,
        num_runners_up=args.runners_up,
        max_requests=None if args.full_trace else args.max_requests,
        calibration=args.calibration)
    build_trace(query.trace)  # a trace that cannot load fails before --out is touched
    folder = claim_out(args, FLEET_FILES)
    try:
        result = run_fleet(query, executor_from(args))
        _report(result, folder, as_json=args.json)
    except KeyboardInterrupt:
        return stopped("plan fleet", args.out, FLEET_FILES)
    return 0 if result.answer is not None else 1


def _report(result: FleetResult, folder: OutputFolder | None, as_json: bool) -> None:
    """Print the answer; write fleet_trials.csv, then fleet.json (so that beside fleet.json
    the trials table is always complete)."""
    document = json.dumps(fleet_dict(result), indent=1, default=str)
    if as_json:
        print(document)
    else:
        print_fleet(result)
    for warning in result.warnings:
        print(warning, file=sys.stderr)
    if folder is not None:
        write_table(trial_rows(result), folder.path, stem="fleet_trials")
        folder.write_text("fleet.json", document)
        print(f"wrote {folder.path / 'fleet.json'} and fleet_trials.csv", file=sys.stderr)


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="python -m sim plan fleet",
        description="The fewest GPUs (or the lowest $/hour) that serve a trace within SLO "
                    "targets: replicas x TP x chunk x policy x GPU, pruned by memory and "
                    "throughput bounds, the rest simulated (docs/planning.md).")
    add_trace_arguments(parser)
    add_engine_flags(parser, multi=FLEET_AXES, keep_text=("model", "gpu"),
                     multi_defaults={"tensor_parallel_size": "1,2,4,8", "policy": "static"},
                     defaults_shown={"max_num_batched_tokens": "vLLM's for each GPU"},
                     exclude=SWEEP_FIXED, config_file=False)
    g = parser.add_argument_group("fleet search")
    g.add_argument("--slo-ttft", "--slo-ttft-p99", type=positive_float, default=2.0,
                   metavar="SECONDS", help="p99 TTFT target (default: 2)")
    g.add_argument("--slo-tpot", "--slo-tpot-p99", type=positive_float, default=None,
                   metavar="SECONDS", help="p99 TPOT target (default: none)")
    g.add_argument("--attainment", type=positive_float, default=0.95,
                   help="share of requests that must finish within every SLO (default: 0.95)")
    g.add_argument("--gpu-cost", default=None, metavar="GPU=DOLLARS[,...]",
                   help="$ per GPU-hour of each GPU, e.g. h100=2.5,h200=3.5 (then the search "
                        "minimizes $/hour)")
    g.add_argument("--objective", choices=("gpus", "cost"), default=None,
                   help="minimize GPUs or $/hour (default: cost when --gpu-cost is given)")
    g.add_argument("--max-replicas", type=positive_int, default=64,
                   help="most replicas of one configuration tried (default: 64)")
    g.add_argument("--runners-up", type=int, default=2, choices=range(0, 11), metavar="N",
                   help="configurations shown after the answer (0-10, default: 2)")
    g.add_argument("--router", choices=("round-robin", "least-tokens"), default="round-robin",
                   help="how the fleet spreads requests over replicas (default: round-robin)")
    g.add_argument("--max-requests", type=positive_int, default=DEFAULT_MAX_REQUESTS,
                   help="search a longer trace on its busiest stretch of this many requests, "
                        f"said in the output (default: {DEFAULT_MAX_REQUESTS:,})")
    g.add_argument("--full-trace", action="store_true",
                   help="search on every request of the trace (slower)")
    g.add_argument("--calibration", default=None, metavar="FILE|none",
                   help="calibration JSON for every case (default: each case's shipped one, "
                        "if any; 'none': the datasheet roofline)")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    add_out_arguments(g, "fleet.json and fleet_trials.csv (one row per run)")
    add_executor_arguments(parser)
    return parser


def parse_gpu_costs(text: str | None) -> tuple[tuple[str, float], ...]:
    """'h100=2.5,h200=3.5' -> (('h100', 2.5), ('h200', 3.5)); an error names the bad part."""
    if text is None:
        return ()
    costs = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        try:
            price = float(value) if sep else float("nan")
        except ValueError:
            price = float("nan")
        if not name.strip() or not price > 0:
            raise ValueError(f"--gpu-cost {part!r}: give GPU=DOLLARS_PER_GPU_HOUR with a price "
                             f"above 0, e.g. h100=2.5")
        costs.append((name.strip(), price))
    if not costs:
        raise ValueError("--gpu-cost: give GPU=DOLLARS pairs separated by commas")
    return tuple(costs)
