"""What the project's validation evidence says of a calibration: how close the simulator,
priced by it, came to the GPU replays it was checked against.

`python -m validation rebuild` writes `validation/evidence/calibrations.json`: for each
calibration that prices a validated slice, the slices, their runs, each target's best and
worst value over them with the slices that missed it, and how often the predicted gain of
elastic over a smaller chunk took the measured one's decision. Every output that names the
calibration pricing it (`pricing:`) says this beside it (`evidence:`), so a planner reads how
far the prediction has been measured to hold, or that it has not been. A calibration no slice
is priced with (one profiled here but never replayed, or a file of your own) says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.core.calibration.schema import CARRIED, Calibration
from sim.core.compiled import ROOT as PROJECT_DIR

INDEX_PATH = PROJECT_DIR / "validation" / "evidence" / "calibrations.json"
# the targets a planner reads first, in the order the validation reports them
SHOWN_TARGETS = {"ttft_p50_s": "TTFT p50", "tpot_p50_s": "TPOT p50",
                 "throughput_tok_s": "throughput", "ttft_p99_s": "TTFT p99"}


def read_index(path: Path = INDEX_PATH) -> dict | None:
    """The evidence's calibration index, or None where this install holds no evidence; a
    malformed index is an error naming the file and the fix."""
    if not path.is_file():
        return None
    try:
        index = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the validation evidence's calibration index "
                         f"({exc}); write it again: python -m validation rebuild") from None
    if not isinstance(index, dict):
        raise ValueError(f"{path}: expected an object keyed by calibration file; write it "
                         "again: python -m validation rebuild")
    return index


def evidence_key(source: str, project: Path = PROJECT_DIR) -> str:
    """A calibration's file as the evidence names it: relative to the project, in posix form
    (`calibration/h200/llama-3.1-8b.json`), whether the output names it so (a shipped file),
    by an absolute path or by one relative to the working directory; a calibration carried to
    another model or GPU keeps what it was carried to (`... -> qwen2.5-14b`, `transfer`)."""
    file, arrow, carried = source.partition(CARRIED)
    if arrow:
        return evidence_key(file, project) + arrow + carried
    path = Path(source)
    for candidate in ([path] if path.is_absolute() else [project / path, path.resolve()]):
        if candidate.is_file():
            try:
                return candidate.resolve().relative_to(project).as_posix()
            except ValueError:  # outside the project: no slice can be priced with it
                break
    return path.as_posix()


def validated(calibration: Calibration | None, index: dict | None) -> dict | None:
    """The index's entry for `calibration` (None where it has none, or no index)."""
    if calibration is None or index is None:
        return None
    return index.get(evidence_key(calibration.source))


def _unit(measure: str) -> str:
    return " pp" if measure == "points" else "%"


def _spread(best: float, worst: float, measure: str) -> str:
    """'2.3-7.7%': a target's best and worst value over the slices, in percent or points."""
    low, high = f"{100 * best:.1f}", f"{100 * worst:.1f}"
    return (low if low == high else f"{low}-{high}") + _unit(measure)


def evidence_line(calibration: Calibration | None, index: dict | None) -> str | None:
    """One line saying how far the runs `calibration` prices were measured to hold: None for
    the roofline (its warning says so) or where this install holds no evidence."""
    if calibration is None or index is None:
        return None
    entry = validated(calibration, index)
    if entry is None:
        return (f"evidence: no validated slice is priced by {calibration.source}; how close "
                "its predictions come to a GPU's has not been measured "
                "(validation/evidence/README.md)")
    slices = entry["slices"]
    parts = []
    for metric, label in SHOWN_TARGETS.items():
        target = entry["targets"].get(metric)
        if target is None:
            continue
        measure, missed = target["measure"], len(target["missed"])
        parts.append(f"{label} {_spread(target['best'], target['worst'], measure)}" + (
            f" ({missed} slice{'s' if missed != 1 else ''} over the "
            f"{100 * target['limit']:g}{_unit(measure)} target)" if missed else ""))
    line = (f"evidence: {calibration.source} prices {len(slices)} validated "
            f"slice{'s' if len(slices) != 1 else ''} ({entry['runs']} GPU runs); the model's "
            f"error, median over a slice's runs: " + ", ".join(parts))
    gains = entry.get("over_smaller_chunk")
    if gains and gains["decided"]:
        line += (f"; elastic against a smaller chunk, the measured decision predicted in "
                 f"{gains['same']} of {gains['decided']} gains measured at "
                 f"{100 * gains['decided_at']:g}% or more")
    return line + " (validation/evidence/calibrations.json)"
