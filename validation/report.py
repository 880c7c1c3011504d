"""report.json (every number) and report.md (the tables a reader checks) for a validation.

report.md's sections are written by validation.report_header (title, environment, host
speed), validation.report_tables (targets, repeats, per-run metrics, gains),
validation.report_transitions, validation.report_steps and validation.report_model
(alignment, sensitivity, calibration fit); this module puts them in order."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from validation.pipeline import RunComparison, Validation
from validation.repeats import median_deviation
from validation.report_format import nonempty
from validation.report_header import KERNELS, environment_line, header_lines, host_speed_line
from validation.report_model import model_lines, steepness_line
from validation.report_steps import step_time_lines
from validation.report_tables import (
    gains_table,
    metrics_table,
    repeat_lines,
    targets_table,
    vs_median,
)
from validation.report_transitions import slowest_transition_line, transition_line

# What callers import from here: the report's writers and, re-exported, the lines of it that
# tests and other reports build on their own.
__all__ = [
    "KERNELS", "PLOT_NAMES", "REFERENCES", "REPORT_DIGITS", "host_speed_line", "markdown",
    "render_report", "report_dict", "run_dict", "slowest_transition_line", "steepness_line",
    "transition_line", "write_report",
]

REFERENCES = ("Vidur reports ~9% latency error; LLMServingSim 2.0 reports 2-14%.")


# the plots a report links to (validation.plots.plot_all writes them beside the report)
PLOT_NAMES = ("ttft_cdf.png", "step_time.png", "kv_usage.png")


def _folder(path: Path, report_dir: Path | None) -> str:
    """A run folder as the report names it: relative to the report's own folder when given (so
    a report reads the same wherever its folders sit), else as given."""
    if report_dir is None:
        return str(path)
    return Path(os.path.relpath(path.resolve(), report_dir.resolve())).as_posix()


def run_dict(run: RunComparison, report_dir: Path | None = None) -> dict:
    return {
        "label": run.label, "gpu_folder": _folder(run.gpu.path, report_dir),
        "policy": run.gpu.policy,
        "chunk": run.gpu.chunk, "trace_slice": run.trace_slice.to_dict(),
        "config": {k: run.sim.summary.get(k) for k in (
            "model", "gpu", "tensor_parallel_size", "max_num_seqs", "block_size", "drain",
            "vmm_handle_bytes")},
        "metrics": run.metrics, "step_time": run.step_error, "step_classes": run.step_classes,
        "tpot_attribution": run.tpot_attribution, "ttft_attribution": run.ttft_attribution,
        "sensitivity": run.sensitivity, "host_sensitivity": run.host_sensitivity,
        "steps_chunks_exact": run.gpu.steps.chunks_exact,
        "num_measured_steps": len(run.gpu.steps), "num_simulated_steps": len(run.sim_steps),
        "divergence": run.divergence.to_dict(),
    }


def report_dict(v: Validation, report_dir: Path | None = None,
                provenance: dict | None = None) -> dict:
    """Every number of the report; `provenance` (when and how the replays were measured, what
    the report was built from) is added as given."""
    data = {
        "calibration": v.calibration_source, "efficiency": asdict(v.efficiency),
        "vmm_costs": asdict(v.vmm_costs) if v.vmm_costs else None,
        "environment": environment_line(v),
        "runs": [run_dict(r, report_dir) for r in v.runs], "targets": v.targets,
        "gains": v.gains,
        "fit": v.fit.to_dict() if v.fit else None, "fit_note": v.fit_note,
        "repeats": v.repeats, "profile_host_probe": v.profile_host_probe,
        "repeat_deviation": median_deviation(v.repeats) if v.repeats else None,
        "vs_replay_median": vs_median(v),
    }
    if v.refit_runs:
        data["after_fit"] = {"runs": [run_dict(r, report_dir) for r in v.refit_runs],
                             "targets": v.refit_targets}
    if provenance is not None:
        data["provenance"] = provenance
    return data


def render_report(v: Validation, report_dir: Path, *, plot_links: bool = True,
                  notes: Sequence[str] = (), provenance: dict | None = None) -> dict[str, str]:
    """report.json and report.md as text (file name -> text), the same bytes for the same
    inputs: run folders relative to `report_dir`, no clock, no absolute path. `notes`: lines
    under the report's header (where the replays came from)."""
    data = _finite(report_dict(v, report_dir, provenance))
    return {"report.json": json.dumps(data, indent=2) + "\n",
            "report.md": markdown(v, list(PLOT_NAMES) if plot_links else [], notes)}


def write_report(out_dir: Path, v: Validation, *, plots: bool = True,
                 notes: Sequence[str] = (), provenance: dict | None = None) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = render_report(v, out_dir, plot_links=plots, notes=notes, provenance=provenance)
    paths = []
    for name, text in texts.items():
        (out_dir / name).write_text(text)
        paths.append(out_dir / name)
    if plots:
        from validation.plots import plot_all

        paths += plot_all(out_dir, v.runs)
    return paths


REPORT_DIGITS = 9  # significant digits a report keeps of every number


def _finite(value):
    """JSON without NaN/inf (they become null), so any JSON reader accepts the report, and
    every float to REPORT_DIGITS significant digits: far finer than any error the report
    judges, and coarse enough that summing the same terms in another order (another numpy,
    another fast-forward of the simulator) rebuilds the same bytes."""
    if isinstance(value, float):
        return float(f"{value:.{REPORT_DIGITS}g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(x) for k, x in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(x) for x in value]
    return value



def markdown(v: Validation, images: list[str], notes: Sequence[str] = ()) -> str:
    out = [*header_lines(v, notes), *_results_lines(v), *step_time_lines(v.runs),
           *model_lines(v)]
    if v.refit_runs:
        out += ["## After the fit: simulation re-run with the fitted efficiencies", "",
                "The fit saw the first part of these same runs' steps; a fit on another trace "
                "(`python -m validation fit`, then `compare --calibration`) is the stricter test.",
                "", *targets_table(v.refit_targets), "", *metrics_table(v.refit_runs), ""]
    out += ["## Plots", ""] + [f"![{name}]({name})" for name in images]
    return "\n".join(out) + "\n"


APART_NOTE = (" Replayed apart: the run and its baseline ran on different starts of the machine "
              "(as their replays recorded, or the slice's `replayed_apart`), so that gain "
              "compares two hosts as well.")


def _results_lines(v: Validation) -> list[str]:
    """The targets, the repeats, predicted vs measured per run, the transitions as measured and
    the gains: what the report is read for."""
    return ["## Targets", "", *targets_table(v.targets), "",
            f"Reference: {REFERENCES}", "", *repeat_lines(v),
            "## Predicted / measured (relative error), per run", "", *metrics_table(v.runs), "",
            *nonempty(transition_line([(r.label, r.gpu.summary) for r in v.runs])),
            *nonempty(slowest_transition_line([(r.label, r.gpu.transitions) for r in v.runs])),
            "## Gains: what a user decides on", "",
            "Gain = (run - baseline) / baseline; decisions compare directions, a gain under 1% "
            "counting as no change." + APART_NOTE * any(g.get("replayed_apart") for g in v.gains),
            "", *gains_table(v.gains), ""]
