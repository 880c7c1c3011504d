"""`python -m validation adopt`: GPU replays measured again, put into an evidence slice.

A slice's runs are measured again one policy or configuration at a time as often as all at
once (`python -m validation run ... --policy elastic --gpu-only --out OUT`). Adopting them:

- as the compared replays (the default): each adopted run replaces `runs/<run>/` (its CSVs
  gzip-compressed byte for byte the same from the same file), and every repeat of it the slice
  held is removed, since those measured the engine the run replaced;
- as a repeat (`--repeat`): each adopted run's summary.json goes into a new
  `repeats/repeat-<k>/`, one folder for the whole adoption (one start of the machine).

A partial adoption leaves the slice's runs on two starts of the machine, so the adopted runs go
into slice.json's `replayed_apart` (compare.mark_replayed_apart), unless every run's replays
recorded one and the same start. The slice's report and the results tables are then rebuilt.

A new slice is its folder with a slice.json and no runs yet: its first adoption (not a repeat)
makes every adopted run one of its runs. Where every compared replay recorded the day it ran,
slice.json's `measured_on` becomes those days.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from validation.compare import machine_start
from validation.evidence import (
    ENGINE_PINS,
    RECIPE,
    ROOT,
    Log,
    engine_pins,
    find_slice,
    read_recipe,
    run_names,
)
from validation.results import rebuild
from validation.runs import CONFIG_FILE, find_runs, load_run, load_summary

CSV_LEVEL = 9  # gzip level of the evidence CSVs (validation/evidence/README.md)


def adopt(source: Path, slice_name: str, *, repeat: bool = False, root: Path = ROOT,
          log: Log = print) -> list[str]:
    """Put the run folders under `source` into the slice `slice_name`, as its compared replays
    or (`repeat`) as a new repeat folder, mark them replayed apart where the slice's other runs
    ran on another start, and rebuild. Returns the adopted runs' folder names."""
    folder = find_slice(slice_name, root / "validation" / "evidence")
    recipe = read_recipe(folder)
    adopted = _measured_runs(source)
    known = run_names(folder)
    if not known and not repeat:
        known = set(adopted)  # a new slice: the runs measured are its runs
    unknown = sorted(set(adopted) - known)
    if unknown:
        raise ValueError(f"{source}: runs {unknown} are not runs of {folder.name} "
                         f"({', '.join(sorted(known))}); a slice adopts only its own runs")
    for run in adopted.values():  # every file it keeps read before the slice changes
        _check_slice(run, folder, recipe.trace_slice.limit, recipe.trace_slice.rate_scale)
        if not repeat:
            load_run(run)
    if repeat:
        dest = _adopt_repeat(adopted, folder)
        log(f"{folder.name}: {', '.join(sorted(adopted))} added as {dest.name}")
    else:
        apart = _replayed_apart(folder, adopted, known, recipe.replayed_apart)
        for name, run in sorted(adopted.items()):
            _replace_run(run, folder, name)
        dates = _dates(folder, known)
        unpinned = [pin for pin in engine_pins(recipe.command)
                    if _all_on(folder, known, ENGINE_PINS[pin])]
        _write_recipe(folder, apart, dates, unpinned)
        log(f"{folder.name}: runs {', '.join(sorted(adopted))} replaced"
            + (f"; replayed apart: {', '.join(apart)}" if apart else "")
            + (f"; {', '.join(unpinned)} taken out of its command: every run measured the "
               "current engine" if unpinned else "")
            + (f"; measured_on {dates}" if dates else
               f"; measured_on left at {recipe.measured_on}: replays older than the date "
               "record recorded none, so set it by hand"))
    rebuild([folder], plots=False, root=root, log=log)
    return sorted(adopted)


def _measured_runs(source: Path) -> dict[str, Path]:
    """The GPU run folders under `source` (a `run --out` folder's gpu/, or `source` itself),
    by name."""
    runs_dir = source / "gpu" if (source / "gpu").is_dir() else source
    return {run.name: run for run in find_runs(runs_dir)}


def _check_slice(run: Path, folder: Path, limit: int | None, rate_scale: float) -> None:
    """The run replayed the slice's trace slice (its request count and rate scale)."""
    summary = load_summary(run).summary
    if limit is not None and summary.get("num_requests") not in (None, limit):
        raise ValueError(f"{run / 'summary.json'}: num_requests {summary['num_requests']} is "
                         f"not {folder.name}'s limit {limit}; replay the slice's own command")
    scale = summary.get("rate_scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float)):
        raise ValueError(f"{run / 'summary.json'}: field rate_scale is {scale!r}; it must be "
                         "a number")
    if scale is not None and abs(scale - rate_scale) > 1e-9:
        raise ValueError(f"{run / 'summary.json'}: rate_scale {scale} is not {folder.name}'s "
                         f"{rate_scale:g}; replay the slice's own command")


def _replayed_apart(folder: Path, adopted: dict[str, Path], known: set[str],
                    was_apart: Sequence[str]) -> list[str]:
    """The slice's `replayed_apart` after adopting `adopted` as its compared replays."""
    kept = known - set(adopted)
    if not kept:
        return []  # every run measured again: one start again
    starts = {_start(run) for run in adopted.values()}
    starts |= {_start(folder / "runs" / name) for name in kept}
    if len(starts) == 1 and None not in starts:
        return []  # the replays recorded one start for every run
    apart, rest = set(was_apart) & kept, kept - set(was_apart)
    if apart and rest:
        raise ValueError(
            f"{folder.name}: its runs already stand on two starts of the machine "
            f"({', '.join(sorted(apart))} apart from {', '.join(sorted(rest))}); adopting "
            f"{', '.join(sorted(adopted))} alone would make three. Adopt them together with "
            "every other run of one side, replayed on the same start")
    return sorted(adopted)


def _start(run: Path) -> str | None:
    """The start of the machine the replay in folder `run` recorded."""
    return machine_start(load_summary(run).summary)


def _replace_run(run: Path, folder: Path, name: str) -> None:
    """`run` as the slice's compared replay `name`, its repeats removed. The new folder is
    written beside the slice's runs first and takes the old one's place whole, so an
    interrupted copy leaves the slice's run as it was."""
    dest = folder / "runs" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = folder / f".{name}.adopting"  # outside runs/: never read as a run
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir()
    try:
        _copy_run(run, part)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
    if dest.exists():
        shutil.rmtree(dest)
    part.rename(dest)
    for stale in sorted((folder / "repeats").glob(f"*/{name}")):
        shutil.rmtree(stale)
        if not any(stale.parent.iterdir()):
            stale.parent.rmdir()


def _copy_run(run: Path, dest: Path) -> None:
    """The files of the run folder `run` into `dest`, its CSVs gzip-compressed."""
    for f in sorted(p for p in run.iterdir() if p.is_file()):
        if f.suffix == ".csv":
            with open(f, "rb") as src, open(dest / (f.name + ".gz"), "wb") as raw:
                # no name and no time in the header: the same file compresses the same
                with gzip.GzipFile(filename="", fileobj=raw, mode="wb",
                                   compresslevel=CSV_LEVEL, mtime=0) as out:
                    shutil.copyfileobj(src, out)
        else:
            shutil.copy(f, dest / f.name)


def _adopt_repeat(adopted: dict[str, Path], folder: Path) -> Path:
    """Each adopted run's summary.json into a new repeats/repeat-<k>/, which it returns."""
    numbers = [int(p.name.split("-")[1]) for p in (folder / "repeats").glob("repeat-*")
               if p.name.split("-")[1].isdigit()]
    dest = folder / "repeats" / f"repeat-{max(numbers, default=0) + 1}"
    for name, run in sorted(adopted.items()):
        (dest / name).mkdir(parents=True)
        shutil.copy(run / "summary.json", dest / name / "summary.json")
    return dest


def _dates(folder: Path, runs: set[str]) -> str | None:
    """The days the slice's compared replays ran, as their summaries recorded them
    (`measured.measured_on`): one date, or several joined by "and"; None where a replay
    recorded none."""
    dates = {(load_summary(folder / "runs" / name).summary.get("measured") or {})
             .get("measured_on") for name in runs}
    if not dates or None in dates:
        return None
    return " and ".join(sorted(str(d) for d in dates))


def _all_on(folder: Path, runs: set[str], field: str) -> bool:
    """Whether every compared replay ran with the EngineConfig `field` on (its config.json;
    a replay without one ran an engine older than the field)."""
    for name in runs:
        path = folder / "runs" / name / CONFIG_FILE
        if not path.is_file() or json.loads(path.read_text()).get(field) is not True:
            return False
    return True


def _write_recipe(folder: Path, apart: list[str], measured_on: str | None,
                  unpinned: Sequence[str] = ()) -> None:
    """slice.json with `replayed_apart` set to `apart` (dropped when empty), where known
    `measured_on`, and the flags `unpinned` taken out of its command, its layout kept."""
    path = folder / RECIPE
    raw = path.read_text()
    data = json.loads(raw)
    data.pop("replayed_apart", None)
    if apart:
        data["replayed_apart"] = apart
    if measured_on is not None:
        data["measured_on"] = measured_on
    for pin in unpinned:  # the one word, the command's quoting kept
        data["command"] = re.sub(rf"\s{re.escape(pin)}(?=\s|$)", "", data["command"])
    indent = 2 if '\n  "' in raw else 1
    path.write_text(json.dumps(data, indent=indent) + ("\n" if raw.endswith("\n") else ""))


def measured_slices(out: Path, evidence_dir: Path) -> list[str]:
    """The slices a `remeasure --out OUT` folder holds: its folders named after a slice of
    `evidence_dir` (each a `run --out` folder)."""
    names = sorted(p.name for p in out.iterdir() if p.is_dir()
                   and (evidence_dir / p.name / RECIPE).is_file()) if out.is_dir() else []
    if not names:
        raise ValueError(f"{out}: no folder named after a slice of {evidence_dir}; give the "
                         "slice (adopt OUT SLICE), or the --out folder of `remeasure`")
    return names


def _whole(source: Path, folder: Path) -> None:
    """Refuse a slice measured only in part (a `remeasure` cut short): adopted by name only."""
    missing = sorted(run_names(folder) - set(_measured_runs(source)))
    if missing:
        raise ValueError(f"{source}: {folder.name} was measured in part (no {', '.join(missing)}); "
                         f"adopt it by name if that is meant: python -m validation adopt "
                         f"{source} {folder.name}")


def adopt_all(out: Path, *, repeat: bool = False, root: Path = ROOT,
              log: Log = print) -> list[str]:
    """Every slice the `remeasure --out` folder `out` holds, adopted one after another; a
    slice refused (measured in part, or by `adopt`'s checks) is named on stderr and the rest
    go on. Returns the slices refused."""
    refused = []
    evidence_dir = root / "validation" / "evidence"
    for name in measured_slices(out, evidence_dir):
        try:
            _whole(out / name, evidence_dir / name)
            adopt(out / name, name, repeat=repeat, root=root, log=log)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            refused.append(name)
    return refused


def adopt_command(args) -> int:
    """`python -m validation adopt OUT [SLICE] [--repeat]`: without SLICE, every slice the
    `remeasure --out` folder OUT holds (adopt_all)."""
    if args.slice is not None:
        adopt(args.source, args.slice, repeat=args.repeat)
        return 0
    refused = adopt_all(args.source, repeat=args.repeat)
    if refused:
        print(f"not adopted: {', '.join(refused)}", file=sys.stderr)
    return 2 if refused else 0
