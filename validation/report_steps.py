"""report.md's step-time section: the cost model on every measured step's composition, per run
and per class of step, and the TPOT error each class of step makes."""

from __future__ import annotations

from validation.pipeline import RunComparison
from validation.report_format import abs_pct, signed_pct


def step_time_lines(runs: list[RunComparison]) -> list[str]:
    """The section as report.md writes it: heading, tables and the prose that reads them."""
    return ["## Step times: the cost model on every measured step's composition", "",
            *steps_table(runs), "",
            "Per class of step (error = predicted / measured - 1; negative: the model is "
            "faster than the engine; the last column, where the replay recorded them, is the "
            "median host batch build and host enqueue time and the device span, which holds "
            "any wait for the host's launches: a span close to the enqueue time is a "
            "launch-bound step):", "", *step_class_table(runs), "",
            "TPOT p50 on the measured step sequence, with the model's time for every step, or "
            "for one class of step only (the rest measured): the error each class makes "
            "(validation/attribution.py):", "", *tpot_attribution_table(runs), ""]


def steps_table(runs: list[RunComparison]) -> list[str]:
    lines = ["| run | steps | median \\|err\\| | p90 \\|err\\| | bias | prefill steps median "
             "| decode steps median | chunk prefixes known |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        a, p, d = (r.step_error[k] for k in ("all", "with_prefill", "decode_only"))
        lines.append(f"| {r.label} | {a['count']} | {abs_pct(a['median_abs'])} | "
                     f"{abs_pct(a['p90_abs'])} | {signed_pct(a['bias'])} | "
                     f"{abs_pct(p['median_abs'])} | {abs_pct(d['median_abs'])} | "
                     f"{'yes' if r.gpu.steps.chunks_exact else 'no'} |")
    return lines


def step_class_table(runs: list[RunComparison]) -> list[str]:
    lines = ["| run | class | steps | measured s | predicted s | sum error | median step error "
             "| median step ms | host build / enqueue, device span ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        for c in r.step_classes:
            lines.append(f"| {r.label} | {c['class']} | {c['count']} | {c['measured_s']:.2f} | "
                         f"{c['predicted_s']:.2f} | {signed_pct(c['sum_error'])} | "
                         f"{signed_pct(c['median_error'])} | {c['median_measured_s'] * 1e3:.2f} | "
                         f"{_phases(c.get('median_phases_s'))} |")
    return lines


def _phases(medians: dict | None) -> str:
    """'0.31 / 0.40, 5.19' (ms) from a class's median phases; '-' when not recorded."""
    if not medians:
        return "-"

    def ms(key: str) -> str:
        return "-" if medians.get(key) is None else f"{medians[key] * 1e3:.2f}"

    return f"{ms('build_s')} / {ms('enqueue_s')}, {ms('device_s')}"


def tpot_attribution_table(runs: list[RunComparison]) -> list[str]:
    runs = [r for r in runs if r.tpot_attribution]
    if not runs:
        return ["(needs the replay's request times and step start times)"]
    classes = list(dict.fromkeys(c for r in runs for c in r.tpot_attribution["by_class"]))
    lines = ["| run | requests | TPOT p50 measured | every step | " + " | ".join(classes) + " |",
             "|---|---|---|---|" + "---|" * len(classes)]
    for r in runs:
        a = r.tpot_attribution
        cells = [signed_pct(a["by_class"].get(c)) for c in classes]
        lines.append(f"| {r.label} | {a['num_requests']} | {a['measured_p50_s'] * 1e3:.2f} ms | "
                     f"{signed_pct(a['all_steps_error'])} | " + " | ".join(cells) + " |")
    return lines
