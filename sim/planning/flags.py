"""Flags the planning commands share (`sweep`, `plan`, `plan fleet`, `plan map`, `plan
reserve`) and the objects made from them: where the runs execute, which trace, which fixed
engine settings, the SLO targets, and the results folder (claimed before any run, so that a
long run cannot find out at its end that it has nowhere to write)."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from sim.core.config_flags import positive_float, positive_int, setting_default
from sim.core.engine_checks import SettingRangeError
from sim.core.engine_config import DEFAULT_GPU, DEFAULT_MODEL
from sim.planning.cases import EngineOptions, SyntheticSpec, TraceSpec, check_settings
from sim.planning.parallel import Executor
from sim.planning.spec import OPTION_SETTINGS, engine_options
from sim.recording.folder import OutputFolder
from traces.synthetic_options import SYNTHETIC, parse_length


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
    """The trace flags' TraceSpec: a file or bundled name, or `--trace synthetic` and the
    synthetic flags."""
    if args.trace == SYNTHETIC:
        return TraceSpec(synthetic=SyntheticSpec(
            args.synthetic_requests, args.synthetic_rate,
            parse_length(args.prompt_dist, "prompt_tokens", "--prompt-dist"),
            parse_length(args.output_dist, "output_tokens", "--output-dist"),
            arrival=args.arrival, cv=args.cv, seed=args.seed),
            window_s=args.window, limit=args.limit)
    return TraceSpec(source=args.trace, format=args.format, window_s=args.window,
                     limit=args.limit, sort=args.sort)


def options_from(args: argparse.Namespace) -> EngineOptions:
    """The fixed engine flags given (the rest at EngineConfig's defaults), once the engine
    config of every model, GPU, TP degree and chunk the flags give is built: a value the
    engine refuses as out of range is an error naming its flag, as argparse does."""
    cap = args.piecewise_max_tokens  # 1 or more: its flag's type (config_flags.positive_int)
    given = {name: getattr(args, name) for name in OPTION_SETTINGS.values() if name in vars(args)}
    options = engine_options(given, args.piecewise_graphs, cap)
    try:
        check_settings(options, itertools.product(*(
            _flag_values(args, name, default) for name, default in _POINT_DEFAULTS)))
    except SettingRangeError as exc:
        raise ValueError(exc.at(f"argument {exc.flag}")) from None
    return options


# the settings of a grid point and each one's value where a command's flags leave it out
_POINT_DEFAULTS = (("model", DEFAULT_MODEL), ("gpu", DEFAULT_GPU),
                   ("tensor_parallel_size", setting_default("tensor_parallel_size")),
                   ("max_num_batched_tokens", None))


def _flag_values(args: argparse.Namespace, name: str, default) -> list:
    """The values a flag gives: several, one, or none (then `default`)."""
    value = getattr(args, name, default)
    return value if isinstance(value, list) else [value]


def add_slo_arguments(group, ttft_s: float | None, tpot_s: float | None) -> None:
    """--slo-ttft and --slo-tpot with these defaults (None: no target)."""
    group.add_argument("--slo-ttft", type=positive_float, default=ttft_s,
                       help=f"TTFT SLO in seconds, for goodput (default: {ttft_s or 'none'})")
    group.add_argument("--slo-tpot", type=positive_float, default=tpot_s,
                       help=f"TPOT SLO in seconds, for goodput (default: {tpot_s or 'none'})")


def names(text: str) -> tuple[str, ...]:
    """'a, b,,c' -> ('a', 'b', 'c')."""
    return tuple(v.strip() for v in text.split(",") if v.strip())


def add_out_arguments(group, files: str) -> None:
    """--out DIR and --overwrite for a command that writes `files` (said in the help)."""
    group.add_argument("--out", type=Path, default=None, metavar="DIR",
                       help=f"write {files} into DIR (new or empty unless --overwrite); "
                            "checked before any run")
    group.add_argument("--overwrite", action="store_true",
                       help=f"remove an earlier result's {files} from --out first")


def claim_out(args: argparse.Namespace, patterns: tuple[str, ...]) -> OutputFolder | None:
    """Claim --out before any run (OutputError, one line, if it cannot be used); None
    without --out. `patterns`: the files the command writes, all --overwrite may remove."""
    if args.out is None:
        return None
    return OutputFolder.claim(args.out, flag="--out", overwrite=args.overwrite,
                              patterns=patterns)
