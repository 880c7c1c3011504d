"""`python -m validation {run,compare,fit,fake-gpu,table,rebuild,remeasure,adopt}`: simulator predictions vs GPU measurements.

    # on a GPU machine (with `pip install simpy` there), everything in one command:
    python -m validation run --trace azure-conv --limit 400 --model llama-3.1-8b \\
        --policy static,elastic --chunk 2048,8192 --out validation_out/
    # GPU replays already produced (one folder per run): simulate here and write the report
    python -m validation compare --gpu-dir runs/ --out report/
    # fit the cost model on one set of runs, judge it on another
    python -m validation fit --gpu-dir runs_conv/ --test-dir runs_code/ --out calibration.json
    # the targets of several reports side by side, and over all their runs pooled
    python -m validation table validation/evidence/h200_*
    # every committed report and results table, again from validation/evidence/
    python -m validation rebuild [--check]
    # slices measured again on a GPU, each by the command its slice.json holds
    python -m validation remeasure SLICE ... --out OUT [--current-engine] [--gpu-only]
    # runs of a slice measured again (`run ... --gpu-only --out OUT`): into the slice, rebuilt
    python -m validation adopt OUT [SLICE] [--repeat]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.core.config_flags import CommandParser, add_engine_flags, positive_float
from traces import TraceError, add_trace_arguments

RUN_AXES = ("max_num_batched_tokens", "policy")  # several values: one run per combination


def _add_slice_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    add_trace_arguments(parser, required=required)


def _add_gpu_override(parser: argparse.ArgumentParser) -> None:
    """--gpu as the engine flag, the simulator's GPU in place of the one the runs recorded."""
    add_engine_flags(parser, include=("gpu",), keep_text=("gpu",), config_file=False,
                     defaults_shown={"gpu": "the one the runs recorded"})
    parser.set_defaults(gpu=None)


def _add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("comparison")
    g.add_argument("--calibration", type=Path, default=None, metavar="FILE|none",
                   help="calibration JSON for the simulator (default: the one shipped for the "
                        "runs' model, GPU and engine, if any; 'none': the datasheet roofline "
                        "with default efficiencies)")
    g.add_argument("--holdout", type=float, default=0.5,
                   help="fraction of each run's steps held out of the calibration fit")
    g.add_argument("--no-fit", action="store_true", help="skip the calibration fit")
    g.add_argument("--resimulate-fitted", action="store_true",
                   help="also re-run the simulations with the fitted efficiencies")
    g.add_argument("--save-calibration", type=Path, default=None,
                   help="write the fitted efficiencies as a calibration JSON")
    g.add_argument("--no-plots", action="store_true", help="write the report without PNG plots")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m validation", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for add_command in (_add_compare_parser, _add_run_parser, _add_fit_parser,
                        _add_fake_gpu_parser, _add_table_parser, _add_rebuild_parser,
                        _add_remeasure_parser, _add_adopt_parser):
        add_command(commands)
    return parser


def _add_compare_parser(commands: argparse._SubParsersAction) -> None:
    compare = commands.add_parser("compare", help="simulate GPU runs' configs; write the report")
    compare.add_argument("--gpu-dir", type=Path, required=True,
                         help="folder of GPU replay outputs, one subfolder per run")
    compare.add_argument("--out", type=Path, required=True, help="report folder")
    compare.add_argument("--repeat-dir", type=Path, action="append",
                         help="other replays of the same runs (same layout as --gpu-dir); the "
                              "report shows how far the measurement itself moves (repeatable)")
    _add_slice_arguments(compare, required=False)
    _add_gpu_override(compare)
    _add_compare_arguments(compare)


def _add_run_parser(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser("run", help="GPU replays + simulations + report (GPU machine)")
    _add_slice_arguments(run, required=True)
    add_engine_flags(run, multi=RUN_AXES, exclude=("cuda_graph_sizes",),
                     multi_defaults={"policy": "static,elastic",
                                     "max_num_batched_tokens": "2048,8192"})
    run.add_argument("--out", type=Path, required=True,
                     help="OUT/configs/ for each run's engine configuration, OUT/gpu/<run>/ "
                          "for the replays, OUT/report/ for the report")
    run.add_argument("--replay-args", default="",
                     help="the GPU run's own flags for `python -m gpu_backend replay` "
                          "(--no-graphs, --torch-cap, --max-kv-blocks, --seed), quoted")
    run.add_argument("--gpu-only", action="store_true",
                     help="run the GPU replays only (no simpy needed); compare later")
    run.add_argument("--repeats", type=int, default=1,
                     help="replay every run this many times; the report compares the first with "
                          "the simulator and shows how far the others moved (default 1)")
    run.add_argument("--profile", action="store_true",
                     help="first profile the model on this GPU (`python -m gpu_backend profile`, "
                          "with the engine settings of the largest chunk) into "
                          "OUT/calibration.json and compare with that calibration")
    _add_compare_arguments(run)


def _add_fit_parser(commands: argparse._SubParsersAction) -> None:
    fit = commands.add_parser("fit", help="fit cost-model efficiencies to measured step times")
    fit.add_argument("--gpu-dir", type=Path, required=True,
                     help="folder of GPU replay outputs to fit on, one subfolder per run")
    fit.add_argument("--test-dir", type=Path, default=None,
                     help="judge the fit on these runs (all steps) instead of a held-out tail")
    fit.add_argument("--holdout", type=float, default=0.5,
                     help="fraction of each run's steps held out to judge the fit (default: 0.5)")
    fit.add_argument("--calibration", type=Path, default=None, help="starting point")
    fit.add_argument("--free", default=None,
                     help="parameters to fit, comma-separated (default: all), or 'host': "
                          "step_overhead_s, per_seq_overhead_s and eager_launch_s only, the "
                          "device efficiencies kept from --calibration")
    fit.add_argument("--out", type=Path, required=True, help="calibration JSON to write")
    _add_gpu_override(fit)


def _add_fake_gpu_parser(commands: argparse._SubParsersAction) -> None:
    fake = commands.add_parser("fake-gpu", help="GPU-style run folders from the simulator "
                                                "(perturbed efficiencies), for dry runs")
    _add_slice_arguments(fake, required=True)
    add_engine_flags(fake, multi=RUN_AXES, multi_defaults={
        "policy": "static,elastic", "max_num_batched_tokens": "2048,8192"})
    fake.add_argument("--efficiency", default="linear_compute=0.62,memory=0.78",
                      help="Efficiency fields of the fake GPU, NAME=VALUE,...")
    fake.add_argument("--noise", type=float, default=0.02, help="relative step-time noise")
    fake.add_argument("--out", type=Path, required=True,
                      help="folder for the GPU-style run folders, one per configuration")


def _add_table_parser(commands: argparse._SubParsersAction) -> None:
    tab = commands.add_parser("table", help="several reports' targets side by side, and pooled")
    tab.add_argument("reports", type=Path, nargs="+", help="report folders (or report.json files)")


def _add_rebuild_parser(commands: argparse._SubParsersAction) -> None:
    rebuild = commands.add_parser("rebuild", help="rebuild the committed reports and results "
                                                  "tables from validation/evidence/")
    rebuild.add_argument("slices", nargs="*", help="slice folder names (default: every slice)")
    rebuild.add_argument("--check", action="store_true",
                         help="write nothing; exit 1 naming each file its regeneration changes")
    rebuild.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def _add_remeasure_parser(commands: argparse._SubParsersAction) -> None:
    again = commands.add_parser("remeasure", help="measure evidence slices again on a GPU, "
                                                  "each by its slice.json's command")
    again.add_argument("slices", nargs="*", help="slice folder names under validation/evidence/")
    again.add_argument("--stale", action="store_true",
                       help="also every slice whose command pins an earlier engine")
    again.add_argument("--out", type=Path, required=True, metavar="DIR",
                       help="each slice's runs into DIR/<slice>/, its output in DIR/<slice>.log")
    again.add_argument("--current-engine", action="store_true",
                       help="measure the engine as it is now: drop the flags that pin an "
                            "earlier one (--no-detach-behind-step)")
    again.add_argument("--gpu-only", action="store_true",
                       help="the GPU replays only (run --gpu-only), compared here by adopt")
    again.add_argument("--time-limit-s", type=positive_float, default=None, metavar="S",
                       help="fit the work into S seconds: start no slice whose runs, as last "
                            "measured, would outlast the time left; stop one still running at "
                            "S (exit 3 when a slice was left out for time)")
    again.add_argument("--runs", default=None, metavar="RUN,...",
                       help="those runs of each slice only (elastic_chunk_8192 or "
                            "elastic/chunk=8192; every policy at every chunk they name)")
    again.add_argument("--dry-run", action="store_true",
                       help="print the commands, each with its expected time; run none")


def _add_adopt_parser(commands: argparse._SubParsersAction) -> None:
    adopt = commands.add_parser("adopt", help="put GPU replays measured again into an evidence "
                                              "slice, then rebuild it")
    adopt.add_argument("source", type=Path,
                       help="a `run --out` folder, or a folder of GPU run folders; without "
                            "SLICE, a `remeasure --out` folder (every slice it holds)")
    adopt.add_argument("slice", nargs="?", default=None,
                       help="the slice folder's name under validation/evidence/")
    adopt.add_argument("--repeat", action="store_true",
                       help="add them as a new repeats/repeat-<k>/ instead of replacing the "
                            "compared replays (and their repeats)")


# where each command writes: (its flag's attribute, whether it is a folder)
OUT_PATHS = {"compare": (("out", True), ("save_calibration", False)), "run": (("out", True),),
             "fit": (("out", False),), "fake-gpu": (("out", True),),
             "remeasure": (("out", True),)}


def check_out_paths(args: argparse.Namespace) -> None:
    """Every path the command writes checked before it starts (`check_out_path`)."""
    from sim.recording.folder import check_out_path

    for name, folder in OUT_PATHS.get(args.command, ()):
        if getattr(args, name) is not None:
            check_out_path(getattr(args, name), "--" + name.replace("_", "-"), folder=folder)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except ValueError as exc:  # a usage error (sim.core.config_flags.UsageError)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from validation import commands
    from validation.adopt import adopt_command
    from validation.remeasure import remeasure_command
    from validation.results import rebuild_command

    handler = {"compare": commands.compare, "run": commands.run, "fit": commands.fit,
               "fake-gpu": commands.fake_gpu, "table": commands.table,
               "rebuild": rebuild_command, "remeasure": remeasure_command,
               "adopt": adopt_command}[args.command]
    try:
        check_out_paths(args)
        return handler(args)
    except (TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
