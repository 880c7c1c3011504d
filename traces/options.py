"""The trace options every command shares: ``--trace`` and how to load it.

    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    trace = trace_from_args(parser.parse_args())

A library module, so that ``traces`` can export these without importing a command.
"""

from __future__ import annotations

import argparse

from traces.bundled import BUNDLED
from traces.errors import TraceError
from traces.loader import FORMATS, cut_trace, load_trace
from traces.synthetic_options import SYNTHETIC, add_synthetic_arguments, synthetic_from_args
from traces.trace import Trace


def add_trace_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Add ``--trace`` and the options ``trace_from_args`` reads."""
    parser.add_argument(
        "--trace", required=required, metavar="FILE_OR_BUNDLED_NAME",
        help=f"trace file, a bundled trace ({', '.join(sorted(BUNDLED))}), or 'synthetic'",
    )
    add_loading_options(parser)
    add_synthetic_arguments(parser)


def trace_from_args(args: argparse.Namespace) -> Trace:
    """Load the trace named by ``--trace`` with the loading options.

    With ``add_trace_arguments(required=False)`` check ``args.trace`` first: a missing
    trace raises ``TraceError``, and so does a ``--window`` or ``--limit`` that leaves no
    request.
    """
    if args.trace is None:
        raise TraceError(None, "no trace given", fix="pass --trace FILE_OR_BUNDLED_NAME")
    if args.trace == SYNTHETIC:
        trace = cut_trace(synthetic_from_args(args), window_s=args.window, limit=args.limit)
        return trace.scaled(args.rate_scale)
    return load_trace(
        args.trace,
        args.format,
        sort=args.sort,
        window_s=args.window,
        limit=args.limit,
        rate_scale=args.rate_scale,
    )


def parse_window(text: str) -> tuple[float, float]:
    """``START:END`` in seconds, e.g. ``0:600``; an empty END means no end."""
    start_text, sep, end_text = text.partition(":")
    try:
        start_s = float(start_text) if start_text else 0.0
        end_s = float(end_text) if end_text else float("inf")
    except ValueError:
        start_s = end_s = float("nan")
    if not sep or not end_s > start_s:
        raise argparse.ArgumentTypeError(f"window must be START:END seconds with END > START, got '{text}'")
    return start_s, end_s


def add_loading_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="trace format (default: detect from the header)")
    parser.add_argument("--sort", action="store_true",
                        help="sort out-of-order requests by arrival instead of failing")
    parser.add_argument("--window", type=parse_window, default=None, metavar="START:END",
                        help="keep requests arriving in [START, END) seconds, re-based to START")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="keep only the first N requests (after --window)")
    parser.add_argument("--rate-scale", type=float, default=1.0, metavar="X",
                        help="multiply the request rate by X (arrival times divided by X)")
