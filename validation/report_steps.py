"""report.md's step-time section: the cost model on every measured step's composition, per run
and per class of step, and the TPOT and TTFT error each class of step makes."""

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
            "for one class of step only (the rest measured): the error each class makes, "
            "beside the simulator's (validation/attribution.py):", "",
            *attribution_table(runs, "tpot"), "",
            "TTFT p50 the same way: a step re-timed moves the steps after it while some "
            "request waits for its first token. Where every step at the model's time comes "
            "close to the simulator, the TTFT error is the steps' prices, not the schedule the "
            "simulator ran:", "", *attribution_table(runs, "ttft"), ""]


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


def attribution_table(runs: list[RunComparison], metric: str) -> list[str]:
    """The TPOT or TTFT (`metric`) attribution of each run, one row a run, beside the
    simulator's error on the same metric."""
    found = [(r, getattr(r, f"{metric}_attribution")) for r in runs]
    found = [(r, a) for r, a in found if a]
    if not found:
        return ["(needs the replay's request times and step start times)"]
    classes = list(dict.fromkeys(c for _, a in found for c in a["by_class"]))
    lines = [f"| run | requests | {metric.upper()} p50 measured | simulated | every step | "
             + " | ".join(classes) + " |", "|---|---|---|---|---|" + "---|" * len(classes)]
    for r, a in found:
        simulated = (r.metrics.get(f"{metric}_p50_s") or {}).get("relative_error")
        cells = [signed_pct(a["by_class"].get(c)) for c in classes]
        lines.append(f"| {r.label} | {a['num_requests']} | {_p50(a['measured_p50_s'])} | "
                     f"{signed_pct(simulated)} | {signed_pct(a['all_steps_error'])} | "
                     + " | ".join(cells) + " |")
    return lines


def _p50(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1.0 else f"{seconds:.3f} s"
