"""Flags the planning commands share (`sweep`, `plan`, `plan fleet`, `plan map`) and the
objects made from them: where the runs execute, which trace, which fixed engine settings."""

from __future__ import annotations

import argparse

from sim.core.config_flags import positive_int
from sim.planning.cases import EngineOptions, TraceSpec
from sim.planning.parallel import Executor
from sim.planning.spec import OPTION_SETTINGS, engine_options


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("execution")
    g.add_argument("--workers", type=positive_int, default=None,
                   help="local worker processes (default: all cores; 1 runs in-process)")
    g.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="run on a Ray cluster at ADDRESS ('local' starts one here; "
                        "needs the optional ray extra)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def executor_from(args: argparse.Namespace, workers: int | None = None) -> Executor:
    """The executor the flags ask for (`workers`: the default when --workers is not given)."""
    chosen = args.workers if args.workers is not None else workers
    return Executor(chosen, args.ray, not args.no_progress)


def trace_spec_from(args: argparse.Namespace) -> TraceSpec:
    return TraceSpec(source=args.trace, format=args.format, window_s=args.window,
                     limit=args.limit, sort=args.sort)


def options_from(args: argparse.Namespace) -> EngineOptions:
    """The fixed engine flags given (the rest at EngineConfig's defaults)."""
    given = {name: getattr(args, name) for name in OPTION_SETTINGS.values() if name in vars(args)}
    return engine_options(given, args.piecewise_graphs, args.piecewise_max_tokens)
