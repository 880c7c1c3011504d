"""The subcommands behind `python -m validation`. Imports that need simpy or scipy stay inside
the commands that use them: the GPU machine may have neither, and `run --gpu-only` needs none."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from sim.core.config_flags import engine_configs, engine_flag_names
from sim.core.cost_model import HOST_TERMS
from sim.core.elastic import Policy
from sim.core.engine_config import EngineConfig
from sim.recording.outputs import run_label, slug
from validation.compare import format_target_value
from validation.runs import (
    GpuRun,
    TraceSlice,
    check_calibration_graphs,
    engine_config,
    find_runs,
    load_run,
    load_summary,
)


def slice_from_args(args: argparse.Namespace) -> TraceSlice | None:
    if getattr(args, "trace", None) is None:
        return None
    return TraceSlice(args.trace, args.format, args.limit, args.window, args.rate_scale)


def load_runs(gpu_dir: Path) -> list[GpuRun]:
    runs = [load_run(folder) for folder in find_runs(gpu_dir)]
    return sorted(runs, key=lambda r: (r.chunk, r.policy))


def print_targets(targets: list[dict], title: str = "targets") -> None:
    print(f"{title}:")
    for t in targets:
        measure = t["measure"]
        value = "n/a" if t["value"] is None else format_target_value(t["value"], measure)
        verdict = "PASS" if t["passed"] else "FAIL"
        print(f"  {verdict}  {t['metric']:<20} {t['aggregate']} |error| {value:>8} "
              f"(target <= {format_target_value(t['limit'], measure)}) {t['note']}")


def compare(args: argparse.Namespace) -> int:
    from sim.core.calibration import UNCALIBRATED, describe, parts_of, pricing_line
    from validation.calibrate import replay_calibration, write_calibration
    from validation.pipeline import validate
    from validation.repeats import median_deviation, repeat_rows
    from validation.report import write_report

    runs = load_runs(args.gpu_dir)
    calibration = replay_calibration(args.calibration, runs, args.gpu)
    efficiency, profile, vmm_costs = parts_of(calibration)
    check_calibration_graphs(calibration, runs)
    repeats = [(d.name, [load_summary(f) for f in find_runs(d)]) for d in args.repeat_dir or ()]
    v = validate(runs, efficiency, profile, describe(calibration),
                 slice_override=slice_from_args(args),
                 gpu_name=args.gpu, holdout_fraction=args.holdout, fit=not args.no_fit,
                 resimulate_fitted=args.resimulate_fitted, vmm_costs=vmm_costs)
    if calibration is not None:
        v.describe_calibration(calibration.data)
    v.repeats = repeat_rows(runs, repeats)
    paths = write_report(args.out, v, plots=not args.no_plots)
    print_targets(v.targets)
    if v.repeats:
        spread = median_deviation(v.repeats)
        print("the same replays measured again (median over runs of the largest deviation): "
              + ", ".join(f"{m} {'n/a' if x is None else f'{x:.1%}'}" for m, x in spread.items()))
    if v.refit_targets:
        print_targets(v.refit_targets, "targets after re-simulating with the fitted efficiencies")
    if v.fit is not None:
        after = v.fit.holdout_after["median_abs"]
        print(f"calibration fit: held-out step-time median |error| "
              f"{v.fit.holdout_before['median_abs']:.1%} -> {after:.1%}")
        if args.save_calibration:
            write_calibration(args.save_calibration, v.fit, profile,
                              {"gpu_dir": str(args.gpu_dir), "holdout_fraction": args.holdout,
                               "model": v.runs[0].sim.spec.engine.model.name,
                               "gpu": v.runs[0].sim.spec.engine.gpu.name}, vmm_costs)
            print(f"wrote {args.save_calibration}")
    print(pricing_line(calibration))
    if calibration is None:
        print(f"warning: {UNCALIBRATED} (give --calibration FILE, or none to mean it)",
              file=sys.stderr)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def _replay_command(args: argparse.Namespace, config_file: Path, out: Path) -> list[str]:
    """`python -m gpu_backend replay` of one configuration (a JSON file: no engine setting
    goes through a command line) on the trace slice, with the GPU-run flags of --replay-args."""
    cmd = [sys.executable, "-m", "gpu_backend", "replay", "--trace", args.trace,
           "--engine-config", str(config_file), "--no-wait", "--out", str(out)]
    if args.format:
        cmd += ["--format", args.format]
    if args.sort:
        cmd += ["--sort"]
    if args.window:
        cmd += ["--window", f"{args.window[0]:g}:{args.window[1]:g}"]
    if args.limit is not None:
        cmd += ["--limit", str(args.limit)]
    if args.rate_scale != 1.0:
        cmd += ["--rate-scale", f"{args.rate_scale:g}"]
    return cmd + replay_flags(args.replay_args)


def replay_flags(text: str) -> list[str]:
    """--replay-args split, refused if it names an engine setting: those are validation
    run's own flags, so that the replays, the profile and the report share them."""
    words = shlex.split(text)
    engine = sorted({w.split("=")[0] for w in words} & engine_flag_names())
    if engine:
        raise ValueError(f"--replay-args {text!r} names engine flags ({', '.join(engine)}): "
                         "give them to `validation run` itself; --replay-args takes the GPU "
                         "run's own flags (--no-graphs, --torch-cap, --max-kv-blocks, --seed)")
    return words


def _profile_command(config_file: Path, out: Path) -> list[str]:
    """`python -m gpu_backend profile` of the replays' configuration at their largest chunk
    (its piecewise graphs, if any, cover every replay's)."""
    return [sys.executable, "-m", "gpu_backend", "profile", "--engine-config", str(config_file),
            "--out", str(out)]


def _write_config(config: EngineConfig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_json())
    return path


def _run_gpu(cmd: list[str], what: str, skipped: str) -> int:
    """Echo and run one GPU command; its exit code, with an error line when it failed."""
    print("$ " + shlex.join(cmd), flush=True)
    code = subprocess.run(cmd).returncode
    if code != 0:
        print(f"error: the GPU {what} failed (exit {code}); nothing {skipped}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    """Profile the model first (`--profile`), replay every configuration of the engine flags
    (each policy x chunk, written to OUT/configs/ and handed to the replay as a file;
    `--repeats` times, each round into its own folder: gpu/, then gpu_repeat2/, ...), then
    compare the first round with the simulator, the others as repeats of it."""
    if args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats}: replay each run at least once")
    replay_flags(args.replay_args)
    configs = engine_configs(args)
    if args.profile:
        code = _profile_first(args, configs)
        if code != 0:
            return code
    rounds = [args.out / "gpu"] + [args.out / f"gpu_repeat{i}" for i in range(2, args.repeats + 1)]
    code = _replay_rounds(args, configs, rounds)
    if code != 0:
        return code
    return _compare_rounds(args, rounds)


def _profile_first(args: argparse.Namespace, configs: list[EngineConfig]) -> int:
    """Profile the configurations' largest chunk (static policy) into OUT/calibration.json,
    which becomes `args.calibration`, the one the report uses; the profile's exit code."""
    if args.calibration is not None:
        raise ValueError("--profile writes the calibration the report uses: drop "
                         "--calibration, or --profile to use the one you have")
    args.calibration = args.out / "calibration.json"
    largest = max(configs, key=lambda c: c.chunk_tokens).with_(policy=Policy.STATIC)
    profile = _write_config(largest, args.out / "configs" / "profile.json")
    return _run_gpu(_profile_command(profile, args.calibration), "profile", "replayed")


def _replay_rounds(args: argparse.Namespace, configs: list[EngineConfig],
                   rounds: list[Path]) -> int:
    """Replay every configuration into each round's folder, in order; 0, or the exit code of
    the first replay that failed (nothing after it runs)."""
    for gpu_dir in rounds:
        for config in configs:
            name = slug(run_label(config))
            config_file = _write_config(config, args.out / "configs" / f"{name}.json")
            code = _run_gpu(_replay_command(args, config_file, gpu_dir / name), "replay",
                            "compared")
            if code != 0:
                return code
    return 0


def _compare_rounds(args: argparse.Namespace, rounds: list[Path]) -> int:
    """Compare the first round of replays with the simulator, the others as its repeats (the
    report into OUT/report); with --gpu-only (exit 0) or without simpy (exit 3), print the
    command that does instead."""
    gpu_dir = rounds[0]
    repeat_flags = "".join(f" --repeat-dir {d}" for d in rounds[1:])
    compare_hint = (f"python -m validation compare --gpu-dir {gpu_dir} --out {args.out}/report"
                    + repeat_flags)
    if args.gpu_only:
        print(f"GPU replays written to {gpu_dir}; compare them with:\n  {compare_hint}")
        return 0
    try:
        import simpy  # noqa: F401
    except ImportError:
        print(f"the simulator side needs simpy, which this machine lacks: `pip install simpy`, "
              f"or copy {gpu_dir} to a machine with the project installed and run:\n"
              f"  {compare_hint}", file=sys.stderr)
        return 3
    args.gpu_dir = gpu_dir
    args.gpu = None  # the simulator takes each replay's GPU from its config.json
    args.repeat_dir = (getattr(args, "repeat_dir", None) or []) + rounds[1:]
    args.out = args.out / "report"
    return compare(args)


# The per-step terms a profile's grid cannot see the same way a replay does (host work between
# and inside steps); `fit --free host` fits only these and keeps the grid's device efficiencies.
HOST_PARAMETERS = HOST_TERMS  # sim.core.cost_model: the same terms host_slower scales


def fit(args: argparse.Namespace) -> int:
    from sim.core.calibration import engine_kinds_of, given_calibration, parts_of
    from validation.calibrate import (
        calibrate,
        concat,
        fit_pricing,
        split_tail,
        usable_steps,
        write_calibration,
    )

    start = given_calibration(args.calibration) if args.calibration is not None else None
    efficiency, profile, vmm_costs = parts_of(start)
    runs = load_runs(args.gpu_dir)
    test_runs = load_runs(args.test_dir) if args.test_dir else []
    check_calibration_graphs(start, runs + test_runs)
    configs = [engine_config(r.summary, args.gpu) for r in runs + test_runs]
    cost_args, token_sizes = fit_pricing(configs)
    if test_runs:
        fit_table = concat([usable_steps(r.steps) for r in runs])
        holdout_table = concat([usable_steps(r.steps) for r in test_runs])
    else:
        splits = [split_tail(usable_steps(r.steps), args.holdout) for r in runs]
        fit_table, holdout_table = concat([s[0] for s in splits]), concat([s[1] for s in splits])
    config = configs[0]
    free = HOST_PARAMETERS if args.free == "host" else (
        None if args.free is None else [n.strip() for n in args.free.split(",") if n.strip()])
    result = calibrate(cost_args, fit_table, holdout_table, efficiency, free,
                       token_graph_sizes=token_sizes)
    provenance = {"gpu_dir": str(args.gpu_dir), "test_dir": str(args.test_dir or ""),
                  "holdout_fraction": None if test_runs else args.holdout,
                  "model": config.model.name, "gpu": config.gpu.name,
                  "tensor_parallel_size": config.tensor_parallel_size,
                  "fitted": list(free) if free is not None else "all"}
    write_calibration(args.out, result, profile, provenance, vmm_costs,
                      engine=engine_kinds_of(configs))
    b, a = result.holdout_before, result.holdout_after
    print(f"fit on {result.num_fit_steps} steps, judged on {result.num_holdout_steps} held-out "
          f"steps: median |error| {b['median_abs']:.1%} -> {a['median_abs']:.1%}, "
          f"p90 {b['p90_abs']:.1%} -> {a['p90_abs']:.1%}")
    print(f"wrote {args.out} (use it with --calibration)")
    return 0


def table(args: argparse.Namespace) -> int:
    from validation.table import table as markdown_table

    print(markdown_table(args.reports), end="")
    return 0


def parse_efficiency(text: str):
    from dataclasses import fields

    from sim.core.cost_model import Efficiency

    known = {f.name for f in fields(Efficiency)}
    values = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, value = item.partition("=")
        if name not in known:
            raise ValueError(f"unknown efficiency field {name!r}; known: {sorted(known)}")
        values[name] = float(value)
    return Efficiency(**values)


def fake_gpu(args: argparse.Namespace) -> int:
    from sim.runner import RunSpec
    from validation.synthetic import write_gpu_style_run

    efficiency = parse_efficiency(args.efficiency)
    ts = slice_from_args(args)
    if ts is None:
        raise ValueError("fake-gpu needs --trace")
    for seed, config in enumerate(engine_configs(args)):
        folder = write_gpu_style_run(args.out, RunSpec(config, efficiency=efficiency), ts,
                                     noise_rel=args.noise, seed=seed)
        print(f"wrote {folder}")
    return 0
