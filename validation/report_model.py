"""report.md's sections on the model itself: how far the simulated step sequence follows the
measured one, how much each metric moves when the step times do, and the calibration fit."""

from __future__ import annotations

from dataclasses import asdict

from sim.core.efficiency import SPLIT_PARAMETERS, UNSET_MEANS
from validation.compare import median_steepness
from validation.pipeline import (
    HOST_SENSITIVITY_FACTOR,
    SENSITIVITY_FACTOR,
    RunComparison,
    Validation,
)
from validation.report_format import abs_pct, nonempty, signed_pct


def model_lines(v: Validation) -> list[str]:
    """The alignment, sensitivity and calibration sections as report.md writes them."""
    return ["## Step-by-step alignment", "", *divergence_lines(v.runs), "",
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
            *sensitivity_table(v.runs), "", *nonempty(steepness_line(v.runs)),
            "## Calibration (held-out steps only)", "", *fit_lines(v), ""]


def sensitivity_table(runs: list[RunComparison]) -> list[str]:
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
                             + " | ".join(signed_pct(moved[n]) for n in names) + " |")
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


def divergence_lines(runs: list[RunComparison]) -> list[str]:
    lines = []
    for r in runs:
        d = r.divergence
        aligned = d.aligned_step_error
        lines.append(f"- **{r.label}**: {d.num_matching_steps} of {d.num_gpu_steps} measured "
                     f"steps match the simulated sequence (aligned-step time error median "
                     f"{abs_pct(aligned['median_abs'])}). {d.explanation}.")
    return lines


def fit_lines(v: Validation) -> list[str]:
    if v.fit is None:
        return [v.fit_note or "not fitted"]
    f = v.fit
    lines = [v.fit_note + ".", "",
             "| efficiency | start | fitted |", "|---|---|---|"]
    def shown(name: str, value: float | None) -> str:
        return UNSET_MEANS[name] if value is None else f"{value:.4g}"

    for name, value in asdict(f.efficiency).items():
        if name in SPLIT_PARAMETERS and value == getattr(f.initial, name):
            continue  # held: too few steps ran SPLIT (the triton backend's: none)
        lines.append(f"| {name} | {shown(name, getattr(f.initial, name))} | "
                     f"{shown(name, value)} |")
    b, a = f.holdout_before, f.holdout_after
    lines += ["", "| held-out steps | median \\|err\\| | p90 \\|err\\| | bias |", "|---|---|---|---|",
              f"| before the fit | {abs_pct(b['median_abs'])} | {abs_pct(b['p90_abs'])} | "
              f"{signed_pct(b['bias'])} |",
              f"| after the fit | {abs_pct(a['median_abs'])} | {abs_pct(a['p90_abs'])} | "
              f"{signed_pct(a['bias'])} |"]
    return lines
