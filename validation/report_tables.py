"""report.md's tables of results: the targets, the same replays measured again, predicted vs
measured per metric and run, and the gains a user decides on."""

from __future__ import annotations

from validation.compare import format_target_value
from validation.metrics import METRICS
from validation.pipeline import RunComparison, Validation
from validation.repeats import errors_against_median, median_deviation
from validation.report_format import abs_pct, number, recorded, signed_pct


def targets_table(targets: list[dict]) -> list[str]:
    lines = ["| metric | over runs | \\|error\\| | target | result |", "|---|---|---|---|---|"]
    for t in targets:
        measure = t["measure"]
        value = "-" if t["value"] is None else format_target_value(t["value"], measure)
        verdict = "PASS" if t["passed"] else "FAIL"
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['metric']} | {t['aggregate']} | {value} | "
                     f"<= {format_target_value(t['limit'], measure)} | **{verdict}**{note} |")
    return lines


def vs_median(v: Validation) -> dict | None:
    """errors_against_median of the report's repeats (None without repeats)."""
    if not v.repeats:
        return None
    predicted = {r.label: {k: m["predicted"] for k, m in r.metrics.items()} for r in v.runs}
    return errors_against_median(v.repeats, predicted)


def repeat_lines(v: Validation) -> list[str]:
    """The same replays measured again: every value, the largest deviation and the model's
    error against the median of all replays (none: [])."""
    rows = v.repeats
    if not rows:
        return []
    spread = median_deviation(rows)
    against = vs_median(v)
    assert against is not None
    errors = {(e["run"], e["metric"]): e["relative_error"] for e in against["rows"]}
    lines = ["## The same replays measured again", "",
             "Other replays of these runs (same configuration and trace slice, replayed again in "
             "another process): how far the measurement itself moves. Median over runs of the largest "
             "deviation: " + ", ".join(f"{m} {abs_pct(x)}" for m, x in spread.items()) + ". "
             "The model against the median of every replay of a run (a measured value with "
             "less of the host's noise in it; the targets above stay judged against this "
             "replay), median over runs of |error|: "
             + ", ".join(f"{m} {abs_pct(x)}" for m, x in against["median_abs"].items()) + ".", "",
             "| run | metric | this replay | repeats | largest deviation | median of all | "
             "model vs median |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        others = "; ".join(f"{o['name']}: {number(o['value'])}" for o in r["repeats"])
        error = errors.get((r["run"], r["metric"]))
        lines.append(f"| {r['run']} | {r['metric']} | {number(r['value'])} | {others} | "
                     f"{abs_pct(r['max_deviation'])} | {number(r.get('median'))} | "
                     f"{'n/a' if error is None else f'{error:+.1%}'} |")
    return lines + [""]


def metrics_table(runs: list[RunComparison]) -> list[str]:
    """Predicted / measured (relative error) per metric and run; a side whose summary lacks
    the metric (a replay recorded before it was) reads "not recorded", not a number."""
    header = "| metric | " + " | ".join(r.label for r in runs) + " |"
    lines = [header, "|---|" + "---|" * len(runs)]
    for name, *_rest, unit in METRICS:
        cells = []
        for r in runs:
            m = r.metrics[name]
            if m["predicted"] is None or m["measured"] is None:
                cells.append(f"{recorded(m['predicted'])} / {recorded(m['measured'])}")
                continue
            cells.append(f"{number(m['predicted'])} / {number(m['measured'])} "
                         f"({signed_pct(m['relative_error'])})")
        lines.append(f"| {name} {f'({unit})' if unit else ''} | " + " | ".join(cells) + " |")
    return lines


def gains_table(gains: list[dict]) -> list[str]:
    if not gains:
        return ["(needs a static and an elastic run)"]
    lines = ["| elastic run | over | metric | predicted gain | measured gain | error (points) "
             "| same decision |", "|---|---|---|---|---|---|---|"]
    for g in gains:
        for name, m in g["metrics"].items():
            err = "-" if m["gain_error"] is None else f"{m['gain_error'] * 100:+.1f}"
            same = {True: "yes", False: "**no**", None: "-"}[m["same_direction"]]
            apart = " (replayed apart)" if g.get("replayed_apart") else ""
            lines.append(f"| {g['run']} | {g['baseline']}{apart} | {name} "
                         f"| {signed_pct(m['predicted_gain'])} "
                         f"| {signed_pct(m['measured_gain'])} | {err} | {same} |")
    return lines
