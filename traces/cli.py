"""``python -m traces describe``: summarise a trace as a table.

    python -m traces describe azure-conv
    python -m traces describe my.csv --format burstgpt --window 0:600
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from traces.errors import TraceError
from traces.options import add_loading_options, parse_window, trace_from_args
from traces.synthetic_options import add_synthetic_arguments
from traces.trace import Trace

__all__ = ["main", "parse_window", "print_description"]  # parse_window: for scripts' --window


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m traces", description="Inspect request traces.")
    commands = parser.add_subparsers(dest="command", required=True)
    describe = commands.add_parser("describe", help="summarise a trace as a table")
    describe.add_argument("trace", metavar="FILE_OR_BUNDLED_NAME")
    add_loading_options(describe)
    add_synthetic_arguments(describe)  # "describe synthetic --synthetic-rate 4 ..." works too
    args = parser.parse_args(argv)
    try:
        trace = trace_from_args(args)
    except (TraceError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print_description(trace)
    return 0


def print_description(trace: Trace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{Path(trace.source).name} ({trace.format})")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for name, value in trace.describe().items():
        table.add_row(name, f"{value:,}" if isinstance(value, int) else f"{value:,.3f}")
    console = Console()
    console.print(table)
    for note in trace.notes:
        console.print(f"note: {note}", highlight=False)
