"""`python -m sim plan map ...` and `python -m sim plan reserve ...`.

    python -m sim plan map --gpu h200 --out out/map
    python -m sim plan reserve --gpu h100

The map runs for a long time: each cell is kept as soon as its last run ends, so a Ctrl-C
still writes the finished cells' tables (the figure needs every cell and is drawn only at
the end).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from sim.core.catalog import MIB
from sim.core.config_flags import CommandParser, add_engine_flags, positive_float, positive_int
from sim.core.engine_config import DEFAULT_GPU
from sim.planning import gain_map, report, reserve
from sim.planning.flags import (
    add_executor_arguments,
    add_out_arguments,
    add_slo_arguments,
    claim_out,
    executor_from,
    names,
)
from sim.planning.map_figure import plot_map
from sim.planning.sweep import write_table
from sim.recording.folder import OutputFolder
from sim.recording.metrics import Slo
from sim.recording.outputs import parse_int_list

MAP_FILES = ("map.png", "map.csv", "map.parquet", "map_runs.csv", "map_runs.parquet")
RESERVE_FILES = ("reserve.csv", "reserve.parquet")


# ------------------------------------------------------------------------------------- map
def map_main(argv: list[str]) -> int:
    d = gain_map.MapQuery()
    args = _map_parser(d).parse_args(argv)
    query = replace(
        d, gpu=getattr(args, "gpu", d.gpu), models=names(args.models),
        prompts=tuple(parse_int_list(args.prompts, "--prompts")),
        tps=tuple(parse_int_list(args.tps, "--tps")),
        chunks=tuple(parse_int_list(args.chunks, "--chunks")), num_requests=args.num_requests,
        load=args.load, pays_pct=args.pays_pct, slo=Slo(args.slo_ttft, args.slo_tpot),
        seed=args.seed, drain=_drain(args, d.drain),
        async_scheduling=getattr(args, "async_scheduling", d.async_scheduling),
        mixed_split_mib=_mixed_split_mib(args, d.mixed_split_mib))
    gain_map.check_names(query)
    folder = claim_out(args, MAP_FILES)
    finished: list[gain_map.FinishedCell] = []
    try:
        for done in gain_map.iter_cells(query, executor_from(args)):
            finished.append(done)
        cells = gain_map.in_order(finished)[0]
        if args.json:
            print(json.dumps([gain_map.cell_row(c) for c in cells], indent=1))
        else:
            report.print_map(cells, query)
        if folder is not None:  # the figure last: beside it, both tables are complete
            _write_tables(folder, finished)
            with folder.path_for("map.png") as tmp:
                plot_map(cells, query, tmp)
            print(f"wrote {folder.path / 'map.png'}, map.csv and map_runs.csv",
                  file=sys.stderr)
    except KeyboardInterrupt:
        return _map_stopped(args.out, folder, finished, gain_map.num_cells(query))
    return 0


def _mixed_split_mib(args: argparse.Namespace, default: int) -> int:
    num_bytes = getattr(args, "mixed_split_bytes", None)  # the flag gives bytes
    return default if num_bytes is None else num_bytes // MIB


def _drain(args: argparse.Namespace, default: str) -> str:
    drain = getattr(args, "drain", None)
    return default if drain is None else drain.value


def _write_tables(folder: OutputFolder, finished: list[gain_map.FinishedCell]) -> None:
    """map_runs.csv, then map.csv: beside map.csv, the runs of its cells are complete."""
    cells, rows = gain_map.in_order(finished)
    write_table(rows, folder.path, stem="map_runs")
    write_table([gain_map.cell_row(c) for c in cells], folder.path, stem="map")


def _map_stopped(out: Path | None, folder: OutputFolder | None,
                 finished: list[gain_map.FinishedCell], num_cells: int) -> int:
    """Keep the tables of the cells that ended, and say what is kept."""
    if folder is not None and finished:
        try:
            _write_tables(folder, finished)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: each file is whole or absent, and the line below says which
    return report.stopped("plan map", out, MAP_FILES,
                          f"the {len(finished)} of {num_cells} cells that ended")


def _map_parser(d: gain_map.MapQuery) -> CommandParser:
    parser = CommandParser(
        prog="python -m sim plan map",
        description="Elastic's goodput gain over the best static chunk across models x prompt "
                    "lengths x TP degrees, on small synthetic traces that stress the KV pool. "
                    "Stopped with Ctrl-C, it keeps the tables of the cells that ended in --out.")
    add_engine_flags(parser, include=("gpu", "drain", "async_scheduling", "mixed_split_bytes"),
                     keep_text=("gpu",),
                     config_file=False)
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
    add_slo_arguments(g, None, None)
    g.add_argument("--seed", type=int, default=d.seed, help="trace seed (default: %(default)s)")
    add_out_arguments(g, "map.png, map.csv (cells) and map_runs.csv (every run)")
    g.add_argument("--json", action="store_true", help="print the cells as JSON")
    add_executor_arguments(parser)
    return parser


# --------------------------------------------------------------------------------- reserve
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
    add_out_arguments(g, "reserve.csv")
    args = parser.parse_args(argv)
    tps, chunks = parse_int_list(args.tps, "--tps"), parse_int_list(args.chunks, "--chunks")
    folder = claim_out(args, RESERVE_FILES)
    try:
        rows = reserve.reserve_rows(names(args.models), getattr(args, "gpu", DEFAULT_GPU), tps,
                                    chunks, getattr(args, "max_num_seqs", None))
        report.print_reserve(rows)
        if folder is not None:
            write_table(rows, folder.path, stem="reserve")
            print(f"wrote {folder.path / 'reserve.csv'}", file=sys.stderr)
    except KeyboardInterrupt:
        return report.stopped("plan reserve", args.out, RESERVE_FILES)
    return 0
