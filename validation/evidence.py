"""The committed validation evidence: its layout, each slice's recipe, and its report rebuilt.

One folder per validated slice (GPU, model, trace slice, engine):

    validation/evidence/<gpu>_<model>_<trace>[_<engine>]/
        slice.json          how its report is built (calibration, trace slice) and where the
                            replays came from (date, GPUs, the command that measures them again)
        runs/<policy>_chunk_<n>/   the compared replays, as `gpu_backend replay --out` writes
                            them (summary.json; steps, requests, timeline and transitions CSVs
                            gzip-compressed)
        repeats/repeat-<k>/<policy>_chunk_<n>/summary.json   other replays of the same runs
        report.md, report.json   rebuilt from the above by `python -m validation rebuild`

`rebuild_slice` regenerates one report (`python -m validation rebuild`, validation.results,
does every one, then the tables over them); with `check` it regenerates it in memory and
names every committed file that differs. A report records the SHA-256 of each file it was built
from (`inputs`), so `stale_inputs` tells cheaply whether evidence changed after its report.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from validation.runs import (
    REPO_ROOT,
    GpuRun,
    TraceSlice,
    check_calibration_graphs,
    find_runs,
    load_run,
)

ROOT = REPO_ROOT
EVIDENCE_DIR = ROOT / "validation" / "evidence"
RECIPE = "slice.json"
# flags a slice's command carries to measure an engine the current one no longer is by default,
# each with the EngineConfig field it turns off (`remeasure --current-engine`, `adopt`)
ENGINE_PINS = {"--no-detach-behind-step": "detach_behind_step"}
REPORT_FILES = ("report.json", "report.md")
RECIPE_FIELDS = {"calibration": str, "trace": str, "limit": (int, type(None)),
                 "window_s": (list, type(None)), "rate_scale": (int, float),
                 "measured_on": str, "gpus": str, "command": str}
# optional: the runs (folder names under runs/) whose every replay ran on another start of the
# machine than the slice's other runs, as when one policy is measured again on its own
RECIPE_OPTIONAL = ("replayed_apart",)

Log = Callable[[str], None]


@dataclass(frozen=True)
class SliceRecipe:
    """A slice's slice.json: what its report is built from and how its replays were measured."""

    calibration: str  # repository-relative path of the calibration the report is priced with
    trace_slice: TraceSlice
    measured_on: str  # the date the replays ran (YYYY-MM-DD)
    gpus: str  # e.g. "1 x NVIDIA H200"
    command: str  # measures the slice again on a GPU (`python -m validation run ...`)
    # runs whose every replay ran on another start of the machine than the other runs'
    replayed_apart: tuple[str, ...] = ()


def read_recipe(folder: Path) -> SliceRecipe:
    """A slice folder's slice.json, checked field by field (errors name the file and field)."""
    path = folder / RECIPE
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the slice recipe: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a slice recipe is a JSON object")
    for name, kind in RECIPE_FIELDS.items():
        if name not in data:
            raise ValueError(f"{path}: no {name!r}; expected {sorted(RECIPE_FIELDS)}")
        if not isinstance(data[name], kind) or isinstance(data[name], bool):
            raise ValueError(f"{path}: {name!r} is {data[name]!r}, of the wrong type")
    _check_slice_values(path, data)
    unknown = sorted(set(data) - set(RECIPE_FIELDS) - set(RECIPE_OPTIONAL))
    if unknown:
        raise ValueError(f"{path}: unknown fields {unknown}; expected {sorted(RECIPE_FIELDS)}"
                         f", optionally {sorted(RECIPE_OPTIONAL)}")
    apart = data.get("replayed_apart", [])
    runs = run_names(folder)
    if not isinstance(apart, list) or any(name not in runs for name in apart):
        raise ValueError(f"{path}: 'replayed_apart' is {apart!r}; expected a list of run folders "
                         f"under runs/ ({', '.join(sorted(runs)) or 'none'})")
    window = tuple(float(x) for x in data["window_s"]) if data["window_s"] else None
    trace = TraceSlice(data["trace"], None, data["limit"], window, float(data["rate_scale"]))
    return SliceRecipe(data["calibration"], trace, data["measured_on"], data["gpus"],
                       data["command"], tuple(apart))


def _check_slice_values(path: Path, data: dict) -> None:
    """The trace slice's values in range: ValueError naming `path` and the field otherwise."""
    window = data["window_s"]
    if window is not None and not (
            len(window) == 2 and all(isinstance(x, int | float) and not isinstance(x, bool)
                                     for x in window) and 0 <= window[0] < window[1]):
        raise ValueError(f"{path}: 'window_s' is {window!r}; expected [start, end] in seconds "
                         "with 0 <= start < end, or null for the whole trace")
    if data["limit"] is not None and data["limit"] < 1:
        raise ValueError(f"{path}: 'limit' is {data['limit']!r}; expected a request count "
                         ">= 1, or null for every request")
    if not 0 < data["rate_scale"] < float("inf"):
        raise ValueError(f"{path}: 'rate_scale' is {data['rate_scale']!r}; expected a number "
                         "above 0 (2 = twice the rate)")


def run_names(folder: Path) -> set[str]:
    """The names of a slice's run folders under runs/ (none where it has no runs/)."""
    runs = folder / "runs"
    return {p.name for p in runs.iterdir() if p.is_dir()} if runs.is_dir() else set()


def slice_folders(evidence_dir: Path = EVIDENCE_DIR) -> list[Path]:
    """Every slice folder (one holding a slice.json), sorted by name."""
    return sorted(p.parent for p in evidence_dir.glob(f"*/{RECIPE}"))


def engine_pins(command: str) -> list[str]:
    """The flags of a slice's command that pin an earlier engine (ENGINE_PINS)."""
    return [word for word in shlex.split(command) if word in ENGINE_PINS]


def find_slice(name: str, evidence_dir: Path = EVIDENCE_DIR) -> Path:
    """A slice folder by its name or path."""
    folder = Path(name) if Path(name).is_dir() else evidence_dir / name
    if not (folder / RECIPE).is_file():
        known = ", ".join(p.name for p in slice_folders(evidence_dir))
        raise ValueError(f"{name}: no such slice (a folder with {RECIPE}); known: {known}")
    return folder


def input_files(folder: Path, recipe: SliceRecipe, root: Path = ROOT) -> list[Path]:
    """What the slice's report is built from: its recipe, replays, repeats and calibration."""
    files = [folder / RECIPE]
    for sub in ("runs", "repeats"):
        files += sorted(p for p in (folder / sub).rglob("*") if p.is_file())
    return files + [root / recipe.calibration]


def _name(path: Path, folder: Path, root: Path) -> str:
    """A file as a report names it: relative to the slice folder, else to the repository."""
    base = folder if path.is_relative_to(folder) else root
    return path.relative_to(base).as_posix()


def digests(folder: Path, recipe: SliceRecipe, root: Path = ROOT) -> dict[str, str]:
    """SHA-256 of every input file, by the name a report gives it."""
    return {_name(p, folder, root): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in input_files(folder, recipe, root)}


def load_runs(folder: Path) -> list[GpuRun]:
    runs = [load_run(f) for f in find_runs(folder / "runs")]
    return sorted(runs, key=lambda r: (r.chunk, r.policy))


def build(folder: Path, root: Path = ROOT, log: Log = lambda _: None):
    """The slice's Validation, as `python -m validation compare` builds it from the same
    replays, repeats, calibration and trace slice."""
    from sim.core.calibration import load_calibration
    from validation.calibrate import carried_for
    from validation.pipeline import validate
    from validation.repeats import repeat_rows
    from validation.runs import load_summary

    recipe = read_recipe(folder)
    runs = load_runs(folder)
    shipped = replace(load_calibration(root / recipe.calibration), source=recipe.calibration)
    calibration = carried_for(shipped, runs)  # another model's: carried, as `python -m sim` does
    efficiency, profile, vmm_costs = calibration.parts()
    check_calibration_graphs(calibration, runs)
    folders = sorted(p for p in (folder / "repeats").glob("*") if p.is_dir())
    repeats = [(d.name, [load_summary(f) for f in find_runs(d)]) for d in folders]
    v = validate(runs, efficiency, profile, calibration.source,
                 slice_override=recipe.trace_slice, vmm_costs=vmm_costs,
                 replayed_apart=recipe.replayed_apart, log=log)
    v.describe_calibration(calibration.data)
    v.repeats = repeat_rows(runs, repeats)
    return v


def provenance(folder: Path, recipe: SliceRecipe, root: Path = ROOT) -> dict:
    extra = {"replayed_apart": list(recipe.replayed_apart)} if recipe.replayed_apart else {}
    return {"slice": folder.name, "measured_on": recipe.measured_on, "gpus": recipe.gpus,
            "command": recipe.command, **extra,
            "rebuild": f"python -m validation rebuild {folder.name}",
            "inputs": digests(folder, recipe, root)}


def provenance_note(folder: Path, recipe: SliceRecipe) -> str:
    apart = ""
    if recipe.replayed_apart:
        apart = (f" Every replay of {', '.join(recipe.replayed_apart)} ran on another start of "
                 "the machine than the other runs' (the host-speed line shows each run's "
                 "host): a gain between the two sides compares two hosts, and its replays "
                 "settle no decision.")
    return (f"Replayed on {recipe.measured_on} on {recipe.gpus}; measured again on a GPU by "
            f"`{recipe.command}`.{apart} This report is rebuilt from its folder "
            f"(validation/evidence/{folder.name}/) by `python -m validation rebuild "
            f"{folder.name}`.")


def render(folder: Path, root: Path = ROOT, log: Log = lambda _: None):
    """The slice's report.json and report.md as text (name -> text), and the Validation
    behind them (for its plots)."""
    from validation.report import render_report

    recipe = read_recipe(folder)
    v = build(folder, root, log)
    texts = render_report(v, folder, notes=[provenance_note(folder, recipe)],
                          provenance=provenance(folder, recipe, root))
    return texts, v


def stale_inputs(folder: Path, root: Path = ROOT) -> list[str]:
    """The inputs whose content differs from what the committed report.json was built from
    (added, removed or changed files); [] when the report is current with its evidence."""
    recipe = read_recipe(folder)
    try:
        report = json.loads((folder / "report.json").read_text())
        recorded = report["provenance"]["inputs"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return [f"{folder.name}/report.json (missing, or without provenance.inputs)"]
    now = digests(folder, recipe, root)
    return [f"{folder.name}: {name}" for name in sorted(set(now) | set(recorded))
            if now.get(name) != recorded.get(name)]


def differing(folder: Path, texts: dict[str, str]) -> list[str]:
    """The report files of `folder` whose committed bytes differ from `texts`."""
    out = []
    for name, text in texts.items():
        path = folder / name
        if not path.is_file() or path.read_bytes() != text.encode():
            out.append(f"{folder.name}/{name}")
    return out


def rebuild_slice(folder: Path, *, check: bool, plots: bool, root: Path = ROOT,
                  log: Log = lambda _: None) -> list[str]:
    """Rebuild one slice's report (with its plots unless `plots` is false); with `check`, write
    nothing and return the report files that differ from their regeneration."""
    texts, v = render(folder, root, log)
    if check:
        return differing(folder, texts)
    for name, text in texts.items():
        (folder / name).write_text(text)
    if plots:
        from validation.plots import plot_all

        plot_all(folder, v.runs)
    return []
