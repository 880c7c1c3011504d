"""report.json (every number) and report.md (the tables a reader checks) for a validation."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from validation.compare import METRICS, format_target_value, median_steepness
from validation.pipeline import (
    HOST_SENSITIVITY_FACTOR,
    SENSITIVITY_FACTOR,
    RunComparison,
    Validation,
)
from validation.repeats import errors_against_median, median_deviation

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
        "tpot_attribution": run.tpot_attribution,
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
        "environment": _environment(v),
        "runs": [run_dict(r, report_dir) for r in v.runs], "targets": v.targets,
        "gains": v.gains,
        "fit": v.fit.to_dict() if v.fit else None, "fit_note": v.fit_note,
        "repeats": v.repeats, "profile_host_probe": v.profile_host_probe,
        "repeat_deviation": median_deviation(v.repeats) if v.repeats else None,
        "vs_replay_median": _vs_median(v),
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


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or 1e-2 <= abs(value) < 1e6:
        return f"{value:,.4g}" if abs(value) < 1e3 else f"{value:,.0f}"
    return f"{value:.3g}"


def _recorded(value: float | None) -> str:
    return "not recorded" if value is None else _num(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _abs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _targets_table(targets: list[dict]) -> list[str]:
    lines = ["| metric | over runs | \\|error\\| | target | result |", "|---|---|---|---|---|"]
    for t in targets:
        measure = t["measure"]
        value = "-" if t["value"] is None else format_target_value(t["value"], measure)
        verdict = "PASS" if t["passed"] else "FAIL"
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['metric']} | {t['aggregate']} | {value} | "
                     f"<= {format_target_value(t['limit'], measure)} | **{verdict}**{note} |")
    return lines


def _vs_median(v: Validation) -> dict | None:
    """errors_against_median of the report's repeats (None without repeats)."""
    if not v.repeats:
        return None
    predicted = {r.label: {k: m["predicted"] for k, m in r.metrics.items()} for r in v.runs}
    return errors_against_median(v.repeats, predicted)


def _repeat_lines(v: Validation) -> list[str]:
    """The same replays measured again: every value, the largest deviation and the model's
    error against the median of all replays (none: [])."""
    rows = v.repeats
    if not rows:
        return []
    spread = median_deviation(rows)
    vs_median = _vs_median(v)
    assert vs_median is not None
    errors = {(e["run"], e["metric"]): e["relative_error"] for e in vs_median["rows"]}
    lines = ["## The same replays measured again", "",
             "Other replays of these runs (same configuration and trace slice, replayed again in "
             "another process): how far the measurement itself moves. Median over runs of the largest "
             "deviation: " + ", ".join(f"{m} {_abs(x)}" for m, x in spread.items()) + ". "
             "The model against the median of every replay of a run (a measured value with "
             "less of the host's noise in it; the targets above stay judged against this "
             "replay), median over runs of |error|: "
             + ", ".join(f"{m} {_abs(x)}" for m, x in vs_median["median_abs"].items()) + ".", "",
             "| run | metric | this replay | repeats | largest deviation | median of all | "
             "model vs median |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        others = "; ".join(f"{o['name']}: {_num(o['value'])}" for o in r["repeats"])
        error = errors.get((r["run"], r["metric"]))
        lines.append(f"| {r['run']} | {r['metric']} | {_num(r['value'])} | {others} | "
                     f"{_abs(r['max_deviation'])} | {_num(r.get('median'))} | "
                     f"{'n/a' if error is None else f'{error:+.1%}'} |")
    return lines + [""]


def _metrics_table(runs: list[RunComparison]) -> list[str]:
    """Predicted / measured (relative error) per metric and run; a side whose summary lacks
    the metric (a replay recorded before it was) reads "not recorded", not a number."""
    header = "| metric | " + " | ".join(r.label for r in runs) + " |"
    lines = [header, "|---|" + "---|" * len(runs)]
    for name, *_rest, unit in METRICS:
        cells = []
        for r in runs:
            m = r.metrics[name]
            if m["predicted"] is None or m["measured"] is None:
                cells.append(f"{_recorded(m['predicted'])} / {_recorded(m['measured'])}")
                continue
            cells.append(f"{_num(m['predicted'])} / {_num(m['measured'])} "
                         f"({_pct(m['relative_error'])})")
        lines.append(f"| {name} {f'({unit})' if unit else ''} | " + " | ".join(cells) + " |")
    return lines


def _gains_table(gains: list[dict]) -> list[str]:
    if not gains:
        return ["(needs a static and an elastic run)"]
    lines = ["| elastic run | over | metric | predicted gain | measured gain | error (points) "
             "| same decision |", "|---|---|---|---|---|---|---|"]
    for g in gains:
        for name, m in g["metrics"].items():
            err = "-" if m["gain_error"] is None else f"{m['gain_error'] * 100:+.1f}"
            same = {True: "yes", False: "**no**", None: "-"}[m["same_direction"]]
            lines.append(f"| {g['run']} | {g['baseline']} | {name} | {_pct(m['predicted_gain'])} "
                         f"| {_pct(m['measured_gain'])} | {err} | {same} |")
    return lines


def _steps_table(runs: list[RunComparison]) -> list[str]:
    lines = ["| run | steps | median \\|err\\| | p90 \\|err\\| | bias | prefill steps median "
             "| decode steps median | chunk prefixes known |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        a, p, d = (r.step_error[k] for k in ("all", "with_prefill", "decode_only"))
        lines.append(f"| {r.label} | {a['count']} | {_abs(a['median_abs'])} | "
                     f"{_abs(a['p90_abs'])} | {_pct(a['bias'])} | {_abs(p['median_abs'])} | "
                     f"{_abs(d['median_abs'])} | {'yes' if r.gpu.steps.chunks_exact else 'no'} |")
    return lines


def _step_class_table(runs: list[RunComparison]) -> list[str]:
    lines = ["| run | class | steps | measured s | predicted s | sum error | median step error "
             "| median step ms | host build / enqueue, device span ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        for c in r.step_classes:
            lines.append(f"| {r.label} | {c['class']} | {c['count']} | {c['measured_s']:.2f} | "
                         f"{c['predicted_s']:.2f} | {_pct(c['sum_error'])} | "
                         f"{_pct(c['median_error'])} | {c['median_measured_s'] * 1e3:.2f} | "
                         f"{_phases(c.get('median_phases_s'))} |")
    return lines


def _phases(medians: dict | None) -> str:
    """'0.31 / 0.40, 5.19' (ms) from a class's median phases; '-' when not recorded."""
    if not medians:
        return "-"

    def ms(key: str) -> str:
        return "-" if medians.get(key) is None else f"{medians[key] * 1e3:.2f}"

    return f"{ms('build_s')} / {ms('enqueue_s')}, {ms('device_s')}"


def _tpot_attribution_table(runs: list[RunComparison]) -> list[str]:
    runs = [r for r in runs if r.tpot_attribution]
    if not runs:
        return ["(needs the replay's request times and step start times)"]
    classes = list(dict.fromkeys(c for r in runs for c in r.tpot_attribution["by_class"]))
    lines = ["| run | requests | TPOT p50 measured | every step | " + " | ".join(classes) + " |",
             "|---|---|---|---|" + "---|" * len(classes)]
    for r in runs:
        a = r.tpot_attribution
        cells = [_pct(a["by_class"].get(c)) for c in classes]
        lines.append(f"| {r.label} | {a['num_requests']} | {a['measured_p50_s'] * 1e3:.2f} ms | "
                     f"{_pct(a['all_steps_error'])} | " + " | ".join(cells) + " |")
    return lines


def _sensitivity_table(runs: list[RunComparison]) -> list[str]:
    runs = [r for r in runs if r.sensitivity]
    if not runs:
        return ["(not computed)"]
    names = list(runs[0].sensitivity)
    lines = ["| run | what changed | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for r in runs:
        for what, moved in ((f"every step {SENSITIVITY_FACTOR - 1:.0%} longer", r.sensitivity),
                            (f"host terms x{HOST_SENSITIVITY_FACTOR:g}", r.host_sensitivity)):
            if moved:
                lines.append(f"| {r.label} | {what} | "
                             + " | ".join(_pct(moved[n]) for n in names) + " |")
    return lines


def steepness_line(runs: list[RunComparison]) -> str:
    """How steep each run's measured TTFT distribution is at its median ("" without request
    times): the p45-p55 stretch over p50 (`median_steepness`)."""
    parts = []
    for r in runs:
        requests = r.gpu.requests
        if not requests or "first_token_s" not in requests or "arrival_s" not in requests:
            continue
        steep = median_steepness(requests["first_token_s"] - requests["arrival_s"])
        if steep is not None:
            parts.append(f"{r.label} {steep:.0%}")
    if not parts:
        return ""
    return ("The measured TTFT at its median, p45 to p55 over p50 (how far TTFT p50 moves when "
            "5% of the requests change sides): " + ", ".join(parts) + ".")


def _divergence_lines(runs: list[RunComparison]) -> list[str]:
    lines = []
    for r in runs:
        d = r.divergence
        aligned = d.aligned_step_error
        lines.append(f"- **{r.label}**: {d.num_matching_steps} of {d.num_gpu_steps} measured "
                     f"steps match the simulated sequence (aligned-step time error median "
                     f"{_abs(aligned['median_abs'])}). {d.explanation}.")
    return lines


def _fit_lines(v: Validation) -> list[str]:
    if v.fit is None:
        return [v.fit_note or "not fitted"]
    f = v.fit
    lines = [v.fit_note + ".", "",
             "| efficiency | start | fitted |", "|---|---|---|"]
    def shown(value: float | None) -> str:  # None: piecewise_launch_s unset (eager_launch_s)
        return "as eager_launch_s" if value is None else f"{value:.4g}"

    for name, value in asdict(f.efficiency).items():
        lines.append(f"| {name} | {shown(getattr(f.initial, name))} | {shown(value)} |")
    b, a = f.holdout_before, f.holdout_after
    lines += ["", "| held-out steps | median \\|err\\| | p90 \\|err\\| | bias |", "|---|---|---|---|",
              f"| before the fit | {_abs(b['median_abs'])} | {_abs(b['p90_abs'])} | "
              f"{_pct(b['bias'])} |",
              f"| after the fit | {_abs(a['median_abs'])} | {_abs(a['p90_abs'])} | "
              f"{_pct(a['bias'])} |"]
    return lines


def _vmm_source(v: Validation) -> str:
    c = v.vmm_costs
    if c is None:
        return "the simulator's H200 driver figures"
    cache = (f" + {c.attach_cache_gib_s * 1e3:.2f} ms per GiB of cached activations"
             if c.attach_cache_gib_s else "")
    return (f"measured on the engine (attach {c.attach_fixed_s * 1e3:.2f} ms + "
            f"{c.attach_handle_s * 1e3:.3f} ms/handle{cache}, detach "
            f"{c.detach_fixed_s * 1e3:.2f} ms + {c.detach_handle_s * 1e3:.3f} ms/handle)")


def _environment(v: Validation) -> str:
    """GPU, driver and library versions: the replays' own, else the calibration's."""
    measured = v.runs[0].gpu.summary.get("measured", {})
    gpu = measured.get("gpu_name") or "GPU not recorded"
    if measured.get("versions"):
        versions, source = measured["versions"], "recorded by the replays"
    elif v.calibration_versions:
        versions, source = v.calibration_versions, "of the calibration's profile run"
    else:
        return f"Measured on {gpu}; driver and library versions not recorded."
    listed = ", ".join(f"{k} {val}" for k, val in versions.items() if val)
    return f"Measured on {gpu}; {listed} ({source}).{_kernels_off(v)}"


# the engine's kernels a replay records (gpu_backend.engine.replay.kernel_flags) that the cost
# model's prices assume: each turned off by an environment switch for an A/B or a fallback
KERNELS = {"fused_layers": "the fused norm, rotary and activation kernels (GPU_BACKEND_FUSED=0)",
           "decode_split_plan": "the decode split plan (GPU_BACKEND_DECODE_PLAN=0)"}


def _kernels_off(v: Validation) -> str:
    """A warning naming the runs that replayed without a kernel the cost model assumes ("" when
    every run had them all, or recorded none): without the split plan a decode step of long
    rows lasts its longest row, which the model does not price (on Mooncake replays of
    Llama-3.1-8B and Llama-3.2-3B without the fused kernels and the split plan, TPOT p50 was
    29-35% off)."""
    off: dict[str, list[str]] = {}
    for run in v.runs:
        flags = run.gpu.summary.get("measured", {}).get("kernels") or {}
        for name in KERNELS:
            if flags.get(name) is False:
                off.setdefault(name, []).append(run.label)
    if not off:
        return ""
    parts = [f"{KERNELS[name]} in {', '.join(labels)}" for name, labels in off.items()]
    return (" **Replayed without " + "; without ".join(parts) + ": the cost model prices the "
            "engine with them, so these errors are not the model's on the shipped engine.**")


def _nonempty(line: str) -> list[str]:
    return [line, ""] if line else []


def transition_line(runs: list[tuple[str, dict]]) -> str:
    """The replays' elastic transitions one by one (measured.attach_latency_s /
    detach_latency_s: count, p50, max): the model prices each at a fixed cost, and a rare
    stall of tens of milliseconds (seen on the H200) lands in TTFT p99. "" without any."""
    parts = []
    for label, summary in runs:
        measured = summary.get("measured") or {}
        kinds = []
        for kind in ("attach", "detach"):
            stats = measured.get(f"{kind}_latency_s") or {}
            if stats.get("count") and stats.get("p50") is not None:
                kinds.append(f"{kind} {stats['count']} x, p50 {stats['p50'] * 1e3:.2f} ms, "
                             f"max {stats['max'] * 1e3:.1f} ms")
        if kinds:
            parts.append(f"{label}: " + "; ".join(kinds))
    if not parts:
        return ""
    return ("Elastic transitions as measured, one by one (the model prices each at its "
            "calibrated cost): " + " | ".join(parts) + ".")


def slowest_transition_line(runs: list[tuple[str, dict[str, np.ndarray] | None]]) -> str:
    """Per run, its slowest elastic transition and where the time went (the replay's
    transitions.csv; "" where no run has one)."""
    parts = []
    for label, moves in runs:
        if not moves or len(moves.get("total_s", ())) == 0:
            continue
        i = int(np.argmax(moves["total_s"]))
        phases = [f"{name[:-2].replace('_', ' ')} {moves[name][i] * 1e3:.1f} ms"
                  for name in ("empty_cache_s", "copy_s", "map_s", "unmap_s")
                  if name in moves and moves[name][i] > 0]
        freed = moves["freed_bytes"][i] / 2**30 if "freed_bytes" in moves else 0.0
        parts.append(f"{label}: {moves['kind'][i]} before step {int(moves['step_id'][i])}, "
                     f"{moves['total_s'][i] * 1e3:.1f} ms (" + ", ".join(phases)
                     + (f"; {freed:.2f} GiB of torch's cache freed" if freed else "") + ")")
    return ("The slowest transition of each replay, by phase: " + " | ".join(parts) + "."
            if parts else "")


def host_speed_line(profile_probe: dict | None, runs: list[tuple[str, dict]]) -> str:
    """The host's speed (gpu_backend.engine.hostprobe's fixed loop) during the profile and
    during each replay (label, summary), when recorded: launch-bound steps take what the host
    takes to launch them. "" when nothing was recorded."""
    def ms(probe) -> float | None:
        return probe.get("median_s") if isinstance(probe, dict) else None

    profile = ms(profile_probe)
    replays = [(label, ms((summary.get("measured") or {}).get("host_probe")))
               for label, summary in runs]
    replays = [(label, s) for label, s in replays if s is not None]
    if profile is None and not replays:
        return ""
    parts = [f"profile {profile * 1e3:.2f} ms" if profile is not None else "profile not recorded"]
    for label, s in replays:
        ratio = f" ({s / profile:.2f}x the profile's)" if profile else ""
        parts.append(f"{label} {s * 1e3:.2f} ms{ratio}")
    return ("Host speed (a fixed Python loop, median; launch-bound steps scale with it): "
            + "; ".join(parts) + ".")


def markdown(v: Validation, images: list[str], notes: Sequence[str] = ()) -> str:
    first = v.runs[0]
    ts = first.trace_slice
    out = ["# Simulator vs GPU: validation report", "",
           f"Model {first.sim.summary['model']} on {first.sim.summary['gpu']}, TP "
           f"{first.sim.summary['tensor_parallel_size']}; trace {ts.trace} (limit {ts.limit}, "
           f"window {ts.window_s}, rate x{ts.rate_scale:g}); cost model efficiencies: "
           f"{v.calibration_source}; elastic transition costs: {_vmm_source(v)}.", "",
           _environment(v), "", *(line for note in notes for line in (note, "")),
           *_nonempty(host_speed_line(
               v.profile_host_probe, [(r.label, r.gpu.summary) for r in v.runs])),
           "## Targets", "", *_targets_table(v.targets), "",
           f"Reference: {REFERENCES}", "", *_repeat_lines(v),
           "## Predicted / measured (relative error), per run", "", *_metrics_table(v.runs), "",
           *_nonempty(transition_line([(r.label, r.gpu.summary) for r in v.runs])),
           *_nonempty(slowest_transition_line([(r.label, r.gpu.transitions) for r in v.runs])),
           "## Gains: what a user decides on", "",
           "Gain = (run - baseline) / baseline; decisions compare directions, a gain under 1% "
           "counting as no change.", "", *_gains_table(v.gains), "",
           "## Step times: the cost model on every measured step's composition", "",
           *_steps_table(v.runs), "",
           "Per class of step (error = predicted / measured - 1; negative: the model is "
           "faster than the engine; the last column, where the replay recorded them, is the "
           "median host batch build and host enqueue time and the device span, which holds "
           "any wait for the host's launches: a span close to the enqueue time is a "
           "launch-bound step):", "", *_step_class_table(v.runs), "",
           "TPOT p50 on the measured step sequence, with the model's time for every step, or "
           "for one class of step only (the rest measured): the error each class makes "
           "(validation/attribution.py):", "", *_tpot_attribution_table(v.runs), "",
           "## Step-by-step alignment", "", *_divergence_lines(v.runs), "",
           f"## Sensitivity: the prediction with every step {SENSITIVITY_FACTOR - 1:.0%} longer, "
           f"and on a host x{HOST_SENSITIVITY_FACTOR:g} as slow",
           "", "How much each metric moves, relative to the prediction: a metric that moves "
           "by several times the step-time change (queueing, or a median that sits between "
           "requests whose decode windows do and do not hold a long prefill step) cannot be "
           "predicted to 5% unless the step times are right to a fraction of that. The second "
           "row scales only the per-step host terms (step overhead, per-sequence time, eager "
           "launch; `sim.core.cost_model.host_slower`): how much of the prediction rides on the "
           "host's speed, which moved up to 2x between H200 hosts and on one host over time "
           "(`benchmarks/host_noise.py`; an upper bound for decode graph steps, whose fitted "
           "step overhead also holds device time).", "",
           *_sensitivity_table(v.runs), "", *_nonempty(steepness_line(v.runs)),
           "## Calibration (held-out steps only)", "", *_fit_lines(v), ""]
    if v.refit_runs:
        out += ["## After the fit: simulation re-run with the fitted efficiencies", "",
                "The fit saw the first part of these same runs' steps; a fit on another trace "
                "(`python -m validation fit`, then `compare --calibration`) is the stricter test.",
                "", *_targets_table(v.refit_targets), "", *_metrics_table(v.refit_runs), ""]
    out += ["## Plots", ""] + [f"![{name}]({name})" for name in images]
    return "\n".join(out) + "\n"
