"""`python -m validation rebuild`: every slice's report, then what the evidence says as a whole.

`rebuild` regenerates each slice's report (validation.evidence.rebuild_slice), then writes,
from every slice's report:

- the results tables between the markers of validation/evidence/README.md (per engine, every
  report's targets, the repeats' spread and the gains) and of README.md (the gains first: does
  elastic pay, predicted as measured; then how close every slice's metrics come);
- validation/evidence/calibrations.json (INDEX): for each calibration a slice is priced with,
  what the evidence says of it, which `python -m sim` and its planners print beside the
  calibration that priced them (sim.core.calibration.validated).

`rebuild --check` writes nothing and names every committed file that differs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from validation.evidence import (
    ROOT,
    Log,
    find_slice,
    read_recipe,
    rebuild_slice,
    run_names,
    slice_folders,
)

# A slice's engine is the last part of its folder name (none: eager prefill steps).
ENGINES = {"eager": "eager prefill steps, decode CUDA graphs, synchronous",
           "piecewise": "piecewise CUDA graphs, synchronous",
           "piecewise512": "piecewise CUDA graphs up to 512 tokens, synchronous",
           "auto": "eager prefill steps on the auto attention backend (SPLIT from 2,048 new "
                   "tokens), decode CUDA graphs, synchronous",
           "async": "eager prefill steps, decode CUDA graphs, async scheduling",
           "piecewise-async": "piecewise CUDA graphs, async scheduling",
           "piecewise512-async": "piecewise CUDA graphs up to 512 tokens, async scheduling",
           "auto-async": "eager prefill steps on the auto attention backend, decode CUDA "
                         "graphs, async scheduling",
           "flashinfer-async": "eager prefill steps with prefill attention through FlashInfer "
                               "(fa3 on Hopper), decode CUDA graphs, async scheduling",
           "tp2": "tensor parallel 2 on two GPUs (torch layers, even decode split), "
                  "synchronous"}
EVIDENCE_MARKERS = ("<!-- results:begin -->", "<!-- results:end -->")
README_MARKERS = ("<!-- validation-results:begin -->", "<!-- validation-results:end -->")


def engine_of(folder: Path) -> str:
    parts = folder.name.split("_")
    engine = parts[3] if len(parts) > 3 else "eager"
    if engine not in ENGINES:
        raise ValueError(f"{folder}: engine {engine!r} (the name's last part) is not one of "
                         f"{sorted(ENGINES)}; name a slice <gpu>_<model>_<trace>[_<engine>]")
    return engine


def grouped(folders: Sequence[Path]) -> list[tuple[str, list[Path]]]:
    """The slices by engine, in ENGINES' order."""
    by_engine: dict[str, list[Path]] = {}
    for folder in folders:
        by_engine.setdefault(engine_of(folder), []).append(folder)
    return [(e, by_engine[e]) for e in ENGINES if e in by_engine]


def evidence_tables(folders: Sequence[Path]) -> str:
    """Per engine, every report's targets, repeat spread and gains (validation.table)."""
    from validation.table import table

    return "\n".join(f"### {ENGINES[engine]}\n\n{table(list(group))}"
                     for engine, group in grouped(folders))


def readme_table(folders: Sequence[Path]) -> str:
    """The decision a user takes first (does elastic gain, predicted as measured), then how
    close every slice's metrics come."""
    from validation.table import gain_table, read_report, summary_table

    reports = [read_report(folder) for folder in folders]
    gains = [(g, r.get("repeats") or []) for r in reports for g in r.get("gains") or ()]
    return ("**Does elastic pay here?** The gain of elastic over static, predicted against "
            f"measured, over every validated slice ({len(folders)}):\n"
            + gain_table(gains)
            + "\nEvery validated slice (its report: `validation/evidence/<slice>/report.md`; "
            "all of them rebuilt from the evidence by `python -m validation rebuild`):\n\n"
            + summary_table(grouped(folders)))


def between_markers(text: str, markers: tuple[str, str], body: str, path: Path) -> str:
    """`text` with what lies between its two marker lines replaced by `body`."""
    begin, end = markers
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"{path}: expected one {begin!r} line, then one {end!r} line, around "
                         "the generated results; put them back where the table goes")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body.rstrip()}\n{end}{tail}"


INDEX = "calibrations.json"  # validation/evidence/: what the evidence says of each calibration


def calibration_index(folders: Sequence[Path]) -> dict:
    """For each calibration that prices a slice (its slice.json's `calibration`, or that file
    carried to the slice's model, `FILE -> MODEL`, as its report names it): the slices,
    their runs, each target's best and worst value over them and the slices that missed it,
    and how often the predicted gain of elastic over a smaller chunk took the measured one's
    decision (validation.table.count_gains). What `python -m sim` and `plan` print beside the
    calibration that priced them (sim.core.calibration.validated)."""
    from validation.table import DECIDED_GAIN, count_gains, read_report

    report_of = {folder: read_report(folder) for folder in folders}
    by_calibration: dict[str, list[Path]] = {}
    for folder in folders:  # the report's: a calibration carried to another model keyed so
        key = report_of[folder].get("calibration") or read_recipe(folder).calibration
        by_calibration.setdefault(key, []).append(folder)
    index = {}
    for calibration, group in sorted(by_calibration.items()):
        reports = [report_of[folder] for folder in group]
        targets: dict[str, dict] = {}
        for folder, report in zip(group, reports, strict=True):
            for t in report.get("targets") or ():
                if t.get("value") is None:
                    continue
                entry = targets.setdefault(t["metric"], {
                    "aggregate": t["aggregate"], "measure": t["measure"], "limit": t["limit"],
                    "best": t["value"], "worst": t["value"], "missed": []})
                entry["best"] = min(entry["best"], t["value"])
                entry["worst"] = max(entry["worst"], t["value"])
                if not t["passed"]:
                    entry["missed"].append(folder.name)
        gains = count_gains([(g, r.get("repeats") or []) for r in reports
                             for g in r.get("gains") or ()], same_chunk=False)
        index[calibration] = {
            "slices": [folder.name for folder in group],
            "runs": sum(len(r["runs"]) for r in reports),
            "targets": targets,
            "over_smaller_chunk": None if gains is None else {
                "decided_at": DECIDED_GAIN, "decided": gains.decided, "same": gains.same,
                "on_medians": gains.on_medians, "on_medians_same": gains.on_medians_same}}
    return index


def update_results(folders: Sequence[Path], root: Path = ROOT, *, check: bool) -> list[str]:
    """Write the results tables between the markers of validation/evidence/README.md and
    README.md, and the calibration index (INDEX); with `check`, write nothing and return the
    files that differ."""
    out = []
    index_path = root / "validation" / "evidence" / INDEX
    index = json.dumps(calibration_index(folders), indent=1) + "\n"
    if not index_path.is_file() or index_path.read_text() != index:
        if check:
            out.append(index_path.relative_to(root).as_posix())
        else:
            index_path.write_text(index)
    for path, markers, body in (
            (root / "validation" / "evidence" / "README.md", EVIDENCE_MARKERS,
             evidence_tables(folders)),
            (root / "README.md", README_MARKERS, readme_table(folders))):
        text = path.read_text()
        new = between_markers(text, markers, body, path)
        if new != text:
            if check:
                out.append(path.relative_to(root).as_posix())
            else:
                path.write_text(new)
    return out


def rebuild(folders: Sequence[Path], *, check: bool = False, plots: bool = True,
            root: Path = ROOT, log: Log = print) -> list[str]:
    """Every slice of `folders`, then the results tables between the markers of the evidence
    README and the project README; the files that differ from their regeneration when
    `check`, else []."""
    out = []
    for folder in folders:
        unready(folder, report=False)
        log(f"{'checking' if check else 'rebuilding'} {folder.name} ...")
        out += rebuild_slice(folder, check=check, plots=plots, root=root)
    every = slice_folders(root / "validation" / "evidence")
    for folder in every:
        unready(folder, report=True)
    return out + update_results(every, root, check=check)


def unready(folder: Path, *, report: bool) -> None:
    """Refuse a slice with no runs yet (a new slice's folder before its first adoption) or,
    with `report`, one whose report was never built, saying what makes it ready."""
    if not run_names(folder):
        raise ValueError(f"{folder.name}: no runs yet under {folder / 'runs'}; put its replays "
                         f"there: python -m validation adopt OUT {folder.name}")
    if report and not (folder / "report.json").is_file():
        raise ValueError(f"{folder.name}: no report yet, so the results tables cannot be "
                         f"built; build it: python -m validation rebuild {folder.name}")


def rebuild_command(args) -> int:
    """`python -m validation rebuild [SLICE ...] [--check] [--no-plots]`."""
    folders = [find_slice(n) for n in args.slices] if args.slices else slice_folders()
    stale = rebuild(folders, check=args.check, plots=not (args.no_plots or args.check))
    if stale:
        print("differs from its regeneration (run `python -m validation rebuild`):\n  "
              + "\n  ".join(stale))
        return 1
    print(f"{len(folders)} reports {'match their evidence' if args.check else 'rebuilt'}")
    return 0
