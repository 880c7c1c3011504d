"""`python -m validation table REPORT_DIR ...`: the targets of several reports side by side.

Each report folder's `report.json` gives one row (its targets over its own runs); a last row
pools every run of the listed reports, which is how the validation targets read ("median
absolute error over the configurations"). When the reports hold more than one model, a row per
model pools that model's runs first: a pooled median over two models can pass while one of
them misses. Markdown, for a report index such as validation/evidence/README.md, whose
tables `python -m validation rebuild` writes with these functions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from validation.compare import TARGETS, check_targets, direction, format_target_value
from validation.repeats import REPEAT_METRICS, median_abs_errors, median_deviation

COLUMNS = {"ttft_p50_s": "TTFT p50", "tpot_p50_s": "TPOT p50",
           "throughput_tok_s": "throughput", "ttft_p99_s": "TTFT p99",
           "kv_capacity_tokens": "KV capacity", "reserve_share": "reserve share"}


def read_report(folder: Path) -> dict:
    path = folder / "report.json" if folder.is_dir() else folder
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a validation report: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or not data["runs"]:
        raise ValueError(f"{path}: no \"runs\" in this report; write it with "
                         "`python -m validation compare`")
    for i, run in enumerate(data["runs"]):
        if not isinstance(run, dict) or not isinstance(run.get("metrics"), dict):
            raise ValueError(f"{path}: run {i} has no \"metrics\" object")
    return data


def _cells(targets: list[dict]) -> list[str]:
    by_metric = {t["metric"]: t for t in targets}
    cells = []
    for target in TARGETS:
        t = by_metric[target.metric]
        if t["value"] is None:
            cells.append("n/a")
            continue
        text = format_target_value(t["value"], t["measure"])
        cells.append(text if t["passed"] else f"**{text}**")
    return cells


def table(folders: list[Path]) -> str:
    """Markdown: one row per report, then every run pooled."""
    header = ["report", "runs", *(COLUMNS[t.metric] for t in TARGETS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    pooled: list[dict] = []
    by_model: dict[str, list[dict]] = {}
    repeats: list[tuple[str, list[dict]]] = []
    vs_median: list[tuple[str, str | None, list[dict]]] = []  # (report, model, error rows)

    def row(name: str, metrics: list[dict]) -> str:
        return (f"| {name} | {len(metrics)} | " + " | ".join(_cells(check_targets(metrics)))
                + " |")

    gains: list[tuple[dict, list[dict]]] = []
    for folder in folders:
        report = read_report(folder)
        gains += [(g, report.get("repeats") or []) for g in report.get("gains") or ()]
        metrics = [run["metrics"] for run in report["runs"]]
        pooled += metrics
        for run in report["runs"]:
            model = (run.get("config") or {}).get("model")
            if model is not None:
                by_model.setdefault(model, []).append(run["metrics"])
        name = folder.name if folder.is_dir() else folder.parent.name
        lines.append(row(name, metrics))
        if report.get("repeats"):
            repeats.append((name, report["repeats"]))
        if (report.get("vs_replay_median") or {}).get("rows"):
            model = (report["runs"][0].get("config") or {}).get("model")
            vs_median.append((name, model, report["vs_replay_median"]["rows"]))
    if len(by_model) > 1:  # each model's runs pooled, so that one model cannot hide another
        lines += [row(f"all {model} runs", metrics) for model, metrics in by_model.items()]
    lines.append(row("all of the above", pooled))
    limits = ", ".join(f"{COLUMNS[t.metric]} {t.aggregate} <= "
                       f"{format_target_value(t.limit, t.measure)}" for t in TARGETS)
    out = "\n".join(lines) + f"\n\nTargets: {limits} (over the runs of each row). Bold: missed.\n"
    if repeats:
        out += _repeat_table(repeats)
    if vs_median:
        out += _median_table(vs_median)
    if gains:
        out += gain_table(gains)
    return out


# the gains a user decides on; counted without and with KV capacity, where elastic over static
# at one chunk gains nothing by design, so predicted and measured agree by construction
GAIN_METRICS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "throughput_tok_s")
DECIDED_GAIN = 0.02  # a gain counts towards the decisions only where the measured one is this large


def _chunk(label: str) -> int:
    """The chunk of a gains entry's run label ("elastic/chunk=2048")."""
    return int(label.rpartition("chunk=")[2])


def repeat_rows_of(gain: dict, metric: str, repeats: list[dict]
                   ) -> tuple[dict | None, dict | None]:
    """The `repeats` rows (repeats.repeat_rows) of `gain`'s run and of its baseline on
    `metric`: None for a run replayed only once."""
    rows = {(r["run"], r["metric"]): r for r in repeats}
    return rows.get((gain["run"], metric)), rows.get((gain["baseline"], metric))


def replay_gains(gain: dict, metric: str, repeats: list[dict]) -> list[float] | None:
    """The gain of `gain`'s run over its baseline on `metric` as each replay pair measured it:
    the compared replays, then each repeat folder that replayed both runs (one validation run,
    so one start of the machine); None with fewer than two pairs, or where the run and its
    baseline were replayed apart (on different starts: compare.mark_replayed_apart).
    `repeats`: the report's `repeats` rows (repeats.repeat_rows)."""
    run, base = repeat_rows_of(gain, metric, repeats)
    if run is None or base is None or gain.get("replayed_apart"):
        return None
    base_by_name = {x["name"]: x["value"] for x in base["repeats"]}
    pairs = [(run["value"], base["value"])] + [
        (x["value"], base_by_name[x["name"]]) for x in run["repeats"] if x["name"] in base_by_name]
    measured = [r / b - 1.0 for r, b in pairs if r is not None and b]
    return measured if len(measured) >= 2 else None


def median_gain(gain: dict, metric: str, repeats: list[dict]) -> float | None:
    """The gain of `gain`'s run over its baseline on `metric`, each measured as the median of
    all its replays (the compared one and every repeat, repeats.repeat_rows' `median`); None
    where either run was replayed only once."""
    run, base = repeat_rows_of(gain, metric, repeats)
    if run is None or base is None or not base["median"]:
        return None
    return run["median"] / base["median"] - 1.0


def settled_direction(measured: list[float]) -> int | None:
    """+1 or -1 when every replay pair measured a gain of at least DECIDED_GAIN the same way,
    else None: the replays do not agree on a decision."""
    if any(abs(g) < DECIDED_GAIN for g in measured) or len({g > 0 for g in measured}) != 1:
        return None
    return 1 if measured[0] > 0 else -1


@dataclass(frozen=True)
class GainCounts:
    """How a set of gains pairs decides (gain_table's columns): `pairs` compared, `decided`
    of them measured at least DECIDED_GAIN, `same` of those predicted the same way, the
    median |gain error| in points, `settled` of the `repeated` pairs whose replays agree and
    `settled_same` of those predicted so, and `on_medians_same` of the `on_medians` pairs
    whose replays' medians measured at least DECIDED_GAIN."""
    pairs: int
    decided: int
    same: int
    error_pp: float
    repeated: int
    settled: int
    settled_same: int
    on_medians: int
    on_medians_same: int


def count_gains(gains: list[tuple[dict, list[dict]]], *, same_chunk: bool,
                metrics: Sequence[str] = GAIN_METRICS) -> GainCounts | None:
    """The decisions of `gains` (each report's gains entries with its `repeats` rows) at the
    same chunk or over a smaller one, on `metrics`; None where no pair has both gains."""
    pairs = [(m, v, g, repeats) for g, repeats in gains
             if (_chunk(g["run"]) == _chunk(g["baseline"])) == same_chunk
             for m, v in g["metrics"].items() if m in metrics
             and v.get("predicted_gain") is not None and v.get("measured_gain") is not None]
    if not pairs:
        return None
    decided = [v for _, v, _, _ in pairs if abs(v["measured_gain"]) >= DECIDED_GAIN]
    settled = []
    repeated = 0  # pairs replayed more than once (KV capacity: exact, always)
    on_medians = []  # (same decision) where the replays' medians measured >= 2%
    for metric, v, g, repeats in pairs:
        median = median_gain(g, metric, repeats)  # None for KV capacity: never repeated
        gain_of_medians = v["measured_gain"] if median is None else median
        if abs(gain_of_medians) >= DECIDED_GAIN:
            on_medians.append(direction(v["predicted_gain"]) == direction(gain_of_medians))
        measured = ([v["measured_gain"]] if metric == "kv_capacity_tokens"
                    else replay_gains(g, metric, repeats))
        if measured is None:
            continue
        repeated += 1
        way = settled_direction(measured)
        if way is not None:
            settled.append(direction(v["predicted_gain"]) == way)
    return GainCounts(len(pairs), len(decided),
                      sum(bool(v["same_direction"]) for v in decided),
                      100 * float(np.median([abs(v["gain_error"]) for _, v, _, _ in pairs])),
                      repeated, len(settled), sum(settled), len(on_medians), sum(on_medians))


def gain_table(gains: list[tuple[dict, list[dict]]]) -> str:
    """Markdown: how often the predicted gain of elastic over static takes the measured one's
    decision (up, down, or under compare.NO_CHANGE_BELOW: no change), and the median |gain
    error| in percentage points, at the same chunk and over a smaller chunk. `gains`: each
    report's gains entries with its `repeats` rows.

    Only pairs whose measured gain is at least DECIDED_GAIN count towards the decisions: a
    smaller measured change is within a replay's own spread, and no one decides on it. The
    two columns after the error count only the pairs whose every replay pair (the compared
    replays and each repeat of both runs) measured a gain of at least DECIDED_GAIN the same
    way: the decisions the measurement itself settles. KV capacity is exact, so its pairs
    count there when its one measured gain is at least DECIDED_GAIN. The last column measures
    each run as the median of all its replays where both runs were replayed more than once
    (a value with less of the host's noise in it; elsewhere the compared replays) and counts
    the pairs whose gain so measured is at least DECIDED_GAIN."""
    header = (r"| elastic over static | metrics | pairs | same decision | median \|gain error\| "
              "| settled by the replays | same decision there | same decision, replays' medians |")
    lines = ["", "Gains, predicted against measured, over these reports (each report's gains "
             "table):", "", header, "|---|---|---|---|---|---|---|---|"]
    for name, same_chunk in (("at the same chunk", True), ("over a smaller chunk", False)):
        for metrics, label in ((GAIN_METRICS, "TTFT p50, p99, TPOT p50, throughput"),
                               ((*GAIN_METRICS, "kv_capacity_tokens"), "the same and KV capacity")):
            c = count_gains(gains, same_chunk=same_chunk, metrics=metrics)
            if c is None:
                continue
            lines.append(f"| {name} | {label} | {c.pairs} ({c.decided} measured >= "
                         f"{DECIDED_GAIN:.0%}) | {c.same} of {c.decided} | {c.error_pp:.2f} pp | "
                         f"{c.settled} of {c.repeated} | {c.settled_same} of {c.settled} | "
                         f"{c.on_medians_same} of {c.on_medians} |")
    lines += ["", f"Settled by the replays: of the pairs replayed more than once on one start "
              f"of the machine, those whose every replay pair (the compared replays, and each "
              f"repeat folder that replayed both runs) measured a gain of at least "
              f"{DECIDED_GAIN:.0%} the same way; KV capacity is exact, so one replay settles "
              "it. A pair whose runs a slice replayed on different starts (its slice.json's "
              "`replayed_apart`) settles nothing. A measured gain the "
              "replays do not agree on is within the measurement's own spread. Replays' "
              "medians: each run measured as the median of all its replays where both runs "
              f"were replayed more than once (else the compared replays), the pairs whose gain "
              f"so measured is at least {DECIDED_GAIN:.0%}."]
    return "\n".join(lines) + "\n"


def _repeat_table(repeats: list[tuple[str, list[dict]]]) -> str:
    """Per report, the median over its runs of the largest deviation of a repeated replay."""
    header = ["report", "runs repeated", *(COLUMNS[m] for m in REPEAT_METRICS)]
    lines = ["", "The same replays measured again (`compare --repeat-dir`): median over runs of "
             "the largest |repeat / replay - 1|.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def row(name: str, rows: list[dict], num_runs: int) -> str:
        spread = median_deviation(rows)
        cells = ["n/a" if spread[m] is None else f"{spread[m]:.1%}" for m in REPEAT_METRICS]
        return f"| {name} | {num_runs} | " + " | ".join(cells) + " |"

    counts = [len({r["run"] for r in rows}) for _, rows in repeats]
    lines += [row(name, rows, n) for (name, rows), n in zip(repeats, counts)]
    lines.append(row("all of the above", [r for _, rows in repeats for r in rows], sum(counts)))
    return "\n".join(lines) + "\n"


def _median_table(reports: list[tuple[str, str | None, list[dict]]]) -> str:
    """Per report (then per model and all pooled, over runs), the median |error| of the model
    against the median of every replay of each run (`repeats.errors_against_median`)."""
    header = ["report", "runs", *(COLUMNS[m] for m in REPEAT_METRICS)]
    lines = ["", "The model against the median of every replay of each run (the compared one and "
             "its repeats): median over runs of |error|. Bold: over the target.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    limits = {t.metric: t.limit for t in TARGETS}

    def row(name: str, group: list[tuple[str, list[dict]]]) -> str:
        errors = median_abs_errors([r for _, rows in group for r in rows])
        cells = ["n/a" if errors[m] is None else
                 (f"**{errors[m]:.1%}**" if errors[m] > limits[m] else f"{errors[m]:.1%}")
                 for m in REPEAT_METRICS]
        runs = sum(len({r["run"] for r in rows}) for _, rows in group)
        return f"| {name} | {runs} | " + " | ".join(cells) + " |"

    lines += [row(name, [(name, rows)]) for name, _, rows in reports]
    models: dict[str, list[tuple[str, list[dict]]]] = {}
    for name, model, rows in reports:
        if model is not None:
            models.setdefault(model, []).append((name, rows))
    if len(models) > 1:
        lines += [row(f"all {model} runs", group) for model, group in models.items()]
    lines.append(row("all of the above", [(name, rows) for name, _, rows in reports]))
    return "\n".join(lines) + "\n"


def summary_table(groups: list[tuple[str, list[Path]]]) -> str:
    """Markdown: one row per report, with the engine it ran (`groups`: engine, report folders),
    then each model's runs per engine pooled. The compact table of the project README."""
    header = ["slice", "engine", "runs", *(COLUMNS[t.metric] for t in TARGETS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    pooled: list[tuple[str, list[dict]]] = []
    for engine, folders in groups:
        by_model: dict[str, list[dict]] = {}
        for folder in folders:
            report = read_report(folder)
            metrics = [run["metrics"] for run in report["runs"]]
            model = (report["runs"][0].get("config") or {}).get("model") or "?"
            by_model.setdefault(model, []).extend(metrics)
            lines.append(f"| {folder.name} | {engine} | {len(metrics)} | "
                         + " | ".join(_cells(check_targets(metrics))) + " |")
        pooled += [(f"all {model} runs, {engine}", m) for model, m in by_model.items()]
    for name, metrics in pooled:
        lines.append(f"| {name} | | {len(metrics)} | "
                     + " | ".join(_cells(check_targets(metrics))) + " |")
    limits = ", ".join(f"{COLUMNS[t.metric]} {t.aggregate} <= "
                       f"{format_target_value(t.limit, t.measure)}" for t in TARGETS)
    return ("\n".join(lines) + f"\n\nThe prediction's |error| over each row's runs (the median; "
            f"KV capacity and reserve share: the largest). Targets: {limits}. Bold: missed.\n")
