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
- `--dry-run` prints the commands and runs nothing.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from validation.evidence import (
    ENGINE_PINS,
    ROOT,
    engine_pins,
    find_slice,
    read_recipe,
    slice_folders,
)

_ENV = re.compile(r"[A-Z_][A-Z0-9_]*=\S*")


@dataclass(frozen=True)
class SliceCommand:
    """One slice's command as it will run: its environment switches and its argv."""
    name: str
    env: dict[str, str]
    argv: list[str]
    out: Path

    def shown(self) -> str:
        words = [f"{k}={v}" for k, v in self.env.items()] + self.argv
        return " ".join(shlex.quote(w) for w in words)


def slice_command(folder: Path, out: Path, *, current_engine: bool, gpu_only: bool,
                  python: str = sys.executable) -> SliceCommand:
    """The slice's own command, its OUT replaced by `out`, run by `python`."""
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
    return SliceCommand(folder.name, env, [python, *words[1:]], out)


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
              log=print) -> dict[str, int | None]:
    """Run each command, its output into out/<slice>.log; the exit status of each slice that
    ran (None: interrupted), in order. An interrupt ends the loop after the slice in flight."""
    out.mkdir(parents=True, exist_ok=True)
    status: dict[str, int | None] = {}
    for command in commands:
        path = out / f"{command.name}.log"
        log(f"{command.name}: {command.shown()}")
        start = time.monotonic()
        with open(path, "w") as sink:
            process = subprocess.Popen(command.argv, cwd=cwd, stdout=sink,
                                       stderr=subprocess.STDOUT,
                                       env={**os.environ, **command.env})
            try:
                status[command.name] = process.wait()
            except KeyboardInterrupt:
                process.terminate()
                process.wait()
                status[command.name] = None
                log(f"{command.name}: interrupted after {time.monotonic() - start:.0f} s; "
                    "its finished runs are under " + str(command.out))
                break
        log(f"{command.name}: exit {status[command.name]} in {time.monotonic() - start:.0f} s "
            f"(log: {path})")
    return status


def remeasure_command(args) -> int:
    """`python -m validation remeasure [SLICE ...] [--stale] --out DIR ...`."""
    evidence_dir = ROOT / "validation" / "evidence"
    commands = [slice_command(folder, args.out / folder.name, current_engine=args.current_engine,
                              gpu_only=args.gpu_only)
                for folder in chosen(args.slices, args.stale, evidence_dir)]
    if args.dry_run:
        for command in commands:
            print(command.shown())
        return 0
    status = remeasure(commands, args.out)
    done = [name for name, code in status.items() if code == 0]
    failed = [name for name, code in status.items() if code not in (0, None)]
    skipped = [c.name for c in commands if c.name not in status or status[c.name] is None]
    for name in done:
        print(f"measured: {name}; put it into the evidence: python -m validation adopt "
              f"{args.out / name} {name}")
    if len(done) > 1:
        print(f"or every slice measured: python -m validation adopt {args.out}")
    for name in failed:
        print(f"failed: {name} (exit {status[name]}; {args.out / (name + '.log')})",
              file=sys.stderr)
    if skipped:
        print(f"not measured (interrupted): {', '.join(skipped)}", file=sys.stderr)
        return 130
    return 1 if failed else 0
