"""`python -m sim --trace FILE`: run policies x chunk sizes over one trace and compare them.

    python -m sim --trace azure-conv
    python -m sim --trace azure-code --policy all --chunk 2048,8192,32768 --out out/ --plot
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.core.calibration import (
    attention_mismatch,
    choose_calibration,
    engine_kinds_of,
    parts_of,
    piecewise_mismatch,
    pricing,
    pricing_line,
    uncalibrated_warning,
)
from sim.core.calibration.coverage import grid_extent
from sim.core.config_flags import (
    CommandParser,
    add_engine_flags,
    engine_configs,
    positive_float,
    positive_int,
)
from sim.core.cost_model import Efficiency, host_slower
from sim.recording.metrics import Slo
from sim.report import extrapolation_notes, interrupted_message, show_finished
from sim.runner import RunSpec
from sim.runs import check_fits, claim_outputs, run_all
from traces import TraceError, add_trace_arguments, trace_from_args


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m sim",
        description="Simulate an LLM serving engine on a request trace and compare static, "
                    "elastic and overcommitted activation reserves. Subcommands: "
                    "`python -m sim memory ...`, `python -m sim sweep ...`, `python -m sim plan ...`.",
    )
    add_trace_arguments(parser)
    add_engine_flags(parser, multi=("max_num_batched_tokens", "policy"),
                     multi_defaults={"policy": "static,elastic"})
    g = parser.add_argument_group("fleet and output")
    g.add_argument("--calibration", default=None, metavar="FILE|none",
                   help="calibration JSON from `python -m gpu_backend profile` (default: the "
                        "one shipped for the model, GPU and engine, if any; 'none': the "
                        "datasheet roofline with default efficiencies)")
    g.add_argument("--num-replicas", "--replicas", type=positive_int, default=1, dest="replicas",
                   help="engines behind the router (default: 1)")
    g.add_argument("--router", default="round-robin", choices=["round-robin", "least-tokens"],
                   help="how requests are spread over the replicas (default: round-robin)")
    g.add_argument("--slo-ttft", type=positive_float, default=None,
                   help="TTFT SLO in seconds, for goodput (default: none)")
    g.add_argument("--slo-tpot", type=positive_float, default=None,
                   help="TPOT SLO in seconds, for goodput (default: none)")
    g.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="write summary.json and each run's CSVs (and plots) into DIR as each "
                        "run ends; DIR must be new or empty (see --overwrite)")
    g.add_argument("--overwrite", action="store_true",
                   help="let --out (and --trace-events) replace the results of an earlier run")
    g.add_argument("--plot", action="store_true",
                   help="with --out: per run, queue, batch, KV and tokens/s over time; TTFT "
                        "and TPOT CDFs with the SLOs")
    g.add_argument("--trace-events", type=Path, default=None, metavar="FILE",
                   help="write engine steps and request spans as Chrome trace events (JSON; "
                        "opens in ui.perfetto.dev)")
    g.add_argument("--json", action="store_true", help="print the summaries as JSON")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--host-slowdown", type=float, default=1.0, metavar="FACTOR",
                   help="what-if: a host FACTOR times as slow (the per-step host terms of the "
                        "calibration multiplied; launch-bound steps of small models feel it)")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        trace = trace_from_args(args)
        configs = engine_configs(args)
        kind = engine_kinds_of(configs)
        calibration = choose_calibration(args.calibration, configs[0].model.name,
                                         configs[0].gpu.name, kind,
                                         attention_backend=configs[0].attention_backend)
        efficiency, profile, vmm_costs = parts_of(calibration)
        grid = grid_extent(calibration.data, calibration.source) if calibration else None
        capped = any(c.piecewise_graph_sizes and max(c.piecewise_graph_sizes) < c.chunk_tokens
                     for c in configs)
        piecewise = any(c.piecewise_graph_sizes for c in configs)
        for note in (piecewise_mismatch(calibration, piecewise, capped),
                     attention_mismatch(calibration, {c.attention_backend for c in configs})):
            if note:
                print(f"note: {note}", file=sys.stderr)
        if args.host_slowdown != 1.0:
            efficiency = host_slower(efficiency or Efficiency(), args.host_slowdown)
        if args.replicas > len(trace):
            raise ValueError(f"--num-replicas {args.replicas} is more than the trace's "
                             f"{len(trace)} requests: each replica past them stays idle; give "
                             f"--num-replicas {len(trace)} or fewer")
        slo = Slo(args.slo_ttft, args.slo_tpot)
        specs = [RunSpec(c, args.replicas, args.router, efficiency, profile, slo, vmm_costs)
                 for c in configs]
        check_fits(specs)
        outputs = claim_outputs(args.out, args.trace_events, overwrite=args.overwrite,
                                plot=args.plot)
    except (TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finished = run_all(specs, trace, outputs, show_progress=not args.no_progress,
                       pricing=pricing(calibration))
    show_finished(finished.results, trace, as_json=args.json, pricing=pricing_line(calibration))
    for line in extrapolation_notes(finished.results, grid,
                                    calibration.source if calibration else ""):
        print(line, file=sys.stderr)
    if calibration is None:
        print(uncalibrated_warning(configs[0].model.name, configs[0].gpu.name, kind,
                                   forced=args.calibration is not None), file=sys.stderr)
    if finished.interrupted:
        print(interrupted_message(finished, args.out, args.trace_events), file=sys.stderr)
        return 130
    return 0
