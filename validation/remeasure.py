"""`python -m validation remeasure SLICE ... --out DIR`: evidence slices measured again.

Each slice's slice.json holds the command that measures it again (`python -m validation run
... --out OUT`). This runs those commands one slice after another on the GPU machine, each
into DIR/<slice>/ with its output in DIR/<slice>.log, and ends saying which slices ran and the
`python -m validation adopt` command that puts each into the evidence. A slice that fails is
named with its log and the next one runs; an interrupt stops the slice in flight and keeps
every slice that finished.

- `--current-engine` measures the engine as it is now: it takes out of each command the flags
  that pin an earlier engine (ENGINE_PINS). Once every run of a slice is adopted so, `adopt`
  takes the pin out of its slice.json's command too.
- `--stale` adds every slice whose command pins an earlier engine.
- `--gpu-only` runs the GPU replays only (`run --gpu-only`): a GPU machine without simpy, the
  comparison made here after `adopt`.
- `--time-limit-s S` fits the work into S seconds of wall time (a GPU job's limit): a slice
  whose runs, as last measured, would not finish in the time left is not started and is named,
  the next one that fits runs, and a slice still running at the limit is stopped, its finished
  runs kept. Each slice's estimate is its runs' recorded setup and replay time plus
  PROCESS_START_S a run; a slice that records none is started whatever is left.
- `--runs RUN,...` measures those runs of each slice only (as its runs/ folder names them,
  `elastic_chunk_8192`, or as its report labels them, `elastic/chunk=8192`): the command's
  policy and chunk lists cut to theirs (`adopt --repeat` takes a repeat of some runs; it
  pairs only the runs it replayed together). They must be a grid of policies x chunks.
- `--dry-run` prints the commands, each with its estimate, and runs nothing.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from validation.evidence import (
    ENGINE_PINS,
    EVIDENCE_DIR,
    ROOT,
    engine_pins,
    find_slice,
    read_recipe,
    slice_folders,
)
from validation.runs import find_runs, load_summary

# a replay's seconds beyond the setup and replay its summary records (its process's start,
# imports and exit): 5.5-8.5 s a run over the six H200 slices replayed on 2026-12-06
PROCESS_START_S = 10.0

_ENV = re.compile(r"[A-Z_][A-Z0-9_]*=\S*")


@dataclass(frozen=True)
class SliceCommand:
    """One slice's command as it will run: its environment switches and its argv."""
    name: str
    env: dict[str, str]
    argv: list[str]
    out: Path
    expected_s: float | None = None  # expected_s(): its runs as last measured

    def shown(self) -> str:
        words = [f"{k}={v}" for k, v in self.env.items()] + self.argv
        return " ".join(shlex.quote(w) for w in words)

    def estimate(self) -> str:
        return ("no estimate (its runs record no setup and replay time)"
                if self.expected_s is None else f"about {self.expected_s:.0f} s")


@dataclass(frozen=True)
class Remeasured:
    """What `remeasure` did: each slice that ran and its exit status (None: stopped by an
    interrupt or the time limit), in order, and the slices not started for lack of time."""
    status: dict[str, int | None]
    over_time: list[str]


def expected_s(folder: Path, runs: Sequence[str] | None = None) -> float | None:
    """Seconds the slice's compared runs took (`runs`: those of these folder names only), as
    their summaries record them (setup and replay), plus PROCESS_START_S each; None where a
    run records neither."""
    try:
        found = find_runs(folder / "runs")
    except ValueError:  # a new slice, no runs yet
        return None
    total = 0.0
    for run in found:
        if runs is not None and run.name not in runs:
            continue
        measured = load_summary(run).summary.get("measured") or {}
        setup, replay = measured.get("setup_s"), measured.get("replay_wall_s")
        if setup is None or replay is None:
            return None
        total += float(setup) + float(replay) + PROCESS_START_S
    return total


def slice_command(folder: Path, out: Path, *, current_engine: bool, gpu_only: bool,
                  python: str = sys.executable, runs: Sequence[str] | None = None
                  ) -> SliceCommand:
    """The slice's own command, its OUT replaced by `out`, run by `python`; `runs` (names as
    `run_names` reads them): those runs only."""
    words = shlex.split(read_recipe(folder).command)
    env = {}
    while words and _ENV.fullmatch(words[0]):  # the engine's environment switches
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if words[:4] != ["python", "-m", "validation", "run"] or words.count("OUT") != 1:
        raise ValueError(f"{folder / 'slice.json'}: command: expected `python -m validation "
                         "run ... --out OUT`; write the command that measures the slice so")
    if current_engine:
        words = [w for w in words if w not in ENGINE_PINS]
    words[words.index("OUT")] = str(out)
    if gpu_only and "--gpu-only" not in words:
        words.append("--gpu-only")
    if runs is not None:
        words = cut_to_runs(folder, words, runs)
    return SliceCommand(folder.name, env, [python, *words[1:]], out, expected_s(folder, runs))


RUN_NAME = re.compile(r"([a-z]+)_chunk_(\d+)")
GRID_FLAGS = {"--policy": 0, "--max-num-batched-tokens": 1}  # flag: its part of a run's name


def run_names(text: str) -> list[str]:
    """'elastic_chunk_8192, static/chunk=2048' -> the runs' folder names, each once."""
    names = [w.strip().replace("/chunk=", "_chunk_") for w in text.split(",") if w.strip()]
    bad = [n for n in names if not RUN_NAME.fullmatch(n)]
    if not names or bad:
        raise ValueError(f"--runs {text!r}: name runs as their folders do (elastic_chunk_8192) "
                         "or as their reports do (elastic/chunk=8192), separated by commas")
    return list(dict.fromkeys(names))


def cut_to_runs(folder: Path, words: list[str], runs: Sequence[str]) -> list[str]:
    """The command `words` with its --policy and --max-num-batched-tokens lists cut to `runs`
    (folder names), each a run of the slice's, together every policy with every chunk."""
    known = [run.name for run in find_runs(folder / "runs")]
    missing = [r for r in runs if r not in known]
    if missing:
        raise ValueError(f"{folder.name}: no run {', '.join(missing)}; its runs: "
                         f"{', '.join(known)}")
    parts = [RUN_NAME.fullmatch(r).groups() for r in runs]  # type: ignore[union-attr]
    grid = [list(dict.fromkeys(p[i] for p in parts)) for i in (0, 1)]
    if len(runs) != len(grid[0]) * len(grid[1]):
        raise ValueError(f"--runs {', '.join(runs)}: a command runs every policy at every "
                         "chunk it names; name such a grid, or remeasure the runs apart")
    words = list(words)
    for flag, part in GRID_FLAGS.items():
        if flag not in words[:-1]:
            raise ValueError(f"{folder / 'slice.json'}: command: no {flag} list to cut to "
                             f"{', '.join(runs)}")
        words[words.index(flag) + 1] = ",".join(grid[part])
    return words


def chosen(names: Sequence[str], stale: bool, evidence_dir: Path) -> list[Path]:
    """The slices named, then (`stale`) every slice pinned to an earlier engine, each once."""
    folders = [find_slice(name, evidence_dir) for name in names]
    if stale:
        folders += [f for f in slice_folders(evidence_dir) if engine_pins(read_recipe(f).command)]
    unique = list(dict.fromkeys(folders))
    if not unique:
        raise ValueError("no slice to measure: name slices, or --stale for every slice whose "
                         "command pins an earlier engine")
    return unique


def remeasure(commands: Sequence[SliceCommand], out: Path, *, cwd: Path = ROOT,
              time_limit_s: float | None = None, log=print) -> Remeasured:
    """Run each command, its output into out/<slice>.log. An interrupt, or the time limit
    reached while a slice runs, stops that slice and runs no other; a slice expected to
    outlast the time left is not started (module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    status: dict[str, int | None] = {}
    over_time: list[str] = []
    began = time.monotonic()
    for command in commands:
        left = None if time_limit_s is None else time_limit_s - (time.monotonic() - began)
        if left is not None and (left <= 0 or (command.expected_s or 0.0) > left):
            over_time.append(command.name)
            log(f"{command.name}: not started: {command.estimate()}, {max(left, 0):.0f} s left")
            continue
        path = out / f"{command.name}.log"
        log(f"{command.name}: {command.shown()}  # {command.estimate()}")
        start = time.monotonic()
        with open(path, "w") as sink:
            # its own process group, so that stopping it stops the replays it started too
            process = subprocess.Popen(command.argv, cwd=cwd, stdout=sink,
                                       stderr=subprocess.STDOUT, preexec_fn=os.setpgrp,
                                       env={**os.environ, **command.env})
            try:
                status[command.name] = process.wait(timeout=left)
            except (KeyboardInterrupt, subprocess.TimeoutExpired) as stop:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait()
                status[command.name] = None
                why = ("interrupted" if isinstance(stop, KeyboardInterrupt)
                       else "stopped at the time limit")
                log(f"{command.name}: {why} after {time.monotonic() - start:.0f} s; "
                    "its finished runs are under " + str(command.out))
                break
        log(f"{command.name}: exit {status[command.name]} in {time.monotonic() - start:.0f} s "
            f"(log: {path})")
    return Remeasured(status, over_time)


def remeasure_command(args) -> int:
    """`python -m validation remeasure [SLICE ...] [--stale] --out DIR ...`."""
    runs = None if args.runs is None else run_names(args.runs)
    commands = [slice_command(folder, args.out / folder.name, current_engine=args.current_engine,
                              gpu_only=args.gpu_only, runs=runs)
                for folder in chosen(args.slices, args.stale, EVIDENCE_DIR)]
    if args.dry_run:
        for command in commands:
            print(f"{command.shown()}  # {command.estimate()}")
        return 0
    result = remeasure(commands, args.out, time_limit_s=args.time_limit_s)
    status = result.status
    done = [name for name, code in status.items() if code == 0]
    failed = [name for name, code in status.items() if code not in (0, None)]
    skipped = [c.name for c in commands if c.name not in result.over_time
               and (c.name not in status or status[c.name] is None)]
    for name in done:
        print(f"measured: {name}; put it into the evidence: python -m validation adopt "
              f"{args.out / name} {name}")
    if len(done) > 1:
        print(f"or every slice measured: python -m validation adopt {args.out}")
    for name in failed:
        print(f"failed: {name} (exit {status[name]}; {args.out / (name + '.log')})",
              file=sys.stderr)
    if result.over_time:
        print(f"not measured (the time limit): {', '.join(result.over_time)}", file=sys.stderr)
    if skipped:
        print(f"not measured (interrupted or stopped at the time limit): {', '.join(skipped)}",
              file=sys.stderr)
        return 130
    return 1 if failed else 3 if result.over_time else 0
