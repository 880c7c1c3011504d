"""The printed comparison of `python -m sim`'s runs, its warnings, and the line a stop prints.

The table fits TABLE_WIDTH columns: runs that do not fit beside each other are split into
several tables of equal size (each repeating the metric names), deltas staying relative to the
first run. A run whose queue kept growing is marked in its column header and in its own row,
and requests rejected as too long have a row of their own: both also warn on stderr, since a
table read in a hurry must not pass them off as predictions.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from sim.core.calibration.coverage import StepExtent, extrapolation_note
from sim.core.request import RejectReason
from sim.recording.reclaims import reclaim_note
from traces import Trace

if TYPE_CHECKING:
    from sim.runner import RunResult
    from sim.runs import Finished

TABLE_WIDTH = 100

# (label, summary key, sub key or None, format, higher is better; None: no delta shown)
ROWS = (
    ("KV capacity, tokens", "kv_capacity_tokens", None, "{:,.0f}", True),
    ("KV with reserve lent", "kv_capacity_lent_tokens", None, "{:,.0f}", True),
    ("throughput, out tok/s", "throughput_tok_s", None, "{:,.1f}", True),
    ("goodput, req/s", "goodput_req_s", None, "{:.3f}", True),
    ("TTFT p50, s", "ttft_s", "p50", "{:.4f}", False),
    ("TTFT p99, s", "ttft_s", "p99", "{:.4f}", False),
    ("TPOT p50, s", "tpot_s", "p50", "{:.5f}", False),
    ("TPOT p99, s", "tpot_s", "p99", "{:.5f}", False),
    ("ITL p99, s", "itl_s", "p99", "{:.5f}", False),
    ("end-to-end p50, s", "e2e_s", "p50", "{:.3f}", False),
    ("finished", "num_finished", None, "{:,.0f}", True),
    ("rejected (too long)", "num_rejected", None, "rejected", None),
    ("failed by OOM", "num_failed_oom", None, "{:,.0f}", False),
    ("OOM steps", "num_oom", None, "{:,.0f}", False),
    ("preemptions", "num_preemptions", None, "{:,.0f}", False),
    ("recomputed tokens", "num_recomputed_tokens", None, "{:,.0f}", False),
    ("overloaded", "overloaded", None, "overloaded", None),
    ("decode-only time", "decode_only_time_share", None, "{:.1%}", None),
    ("reserve lent, time", "reserve_lent_time_share", None, "{:.1%}", None),
    ("reserve lent, tokens", "reserve_lent_tokens_mean", None, "{:,.0f}", None),
    ("attach count", "num_attach", None, "{:,.0f}", None),
    ("attach time, s", "attach_time_s", None, "{:.4f}", None),
    ("detach count", "num_detach", None, "{:,.0f}", None),
    ("detach time, s", "detach_time_s", None, "{:.4f}", None),
    ("drain victims", "num_drain_victims", None, "{:,.0f}", None),
    ("simulator wall, s", "sim_wall_s", None, "{:.2f}", None),
)
SHORT_REASONS = {RejectReason.EXCEEDS_MAX_MODEL_LEN.value: "> max len",
                 RejectReason.EXCEEDS_KV_POOL.value: "> KV pool"}


def metric(summary: dict, key: str, sub: str | None) -> float | None:
    value = summary.get(key)
    if sub is not None:
        value = value.get(sub) if isinstance(value, dict) else None
    return value


def show_finished(results: Sequence[RunResult], trace: Trace, *, as_json: bool,
                  pricing: str | None = None) -> None:
    """The runs as JSON or as the comparison tables on stdout; their warnings on stderr."""
    if as_json:
        print(json.dumps([r.summary for r in results], indent=2))
    elif results:
        print_comparison(results, trace, pricing=pricing)
    for line in run_warnings(results):
        print(line, file=sys.stderr)


def print_comparison(results: Sequence[RunResult], trace: Trace, console: Console | None = None,
                     pricing: str | None = None) -> None:
    """The comparison tables, the deltas' base and `pricing` (what priced the runs)."""
    console = console or Console(width=max(Console().width, TABLE_WIDTH))
    engine = results[0].spec.engine
    console.print(f"{engine.model.name} on {engine.gpu.name} x TP {engine.tensor_parallel_size}"
                  f", {len(trace):,} requests from {Path(trace.source).name}",
                  width=TABLE_WIDTH, style="bold", highlight=False)
    for table in comparison_tables(results):
        console.print(table)
    if len(results) > 1:
        console.print(f"deltas are relative to {results[0].spec.label}")
    if pricing:
        console.print(pricing, width=TABLE_WIDTH, soft_wrap=False, highlight=False)


def comparison_tables(results: Sequence[RunResult]) -> list[Table]:
    """The fewest equal groups of runs whose tables fit TABLE_WIDTH columns."""
    measure = Console(width=10 * TABLE_WIDTH)
    for num_tables in range(1, len(results) + 1):
        size = -(-len(results) // num_tables)
        groups = [results[i:i + size] for i in range(0, len(results), size)]
        tables = [_table(g, results[0].summary) for g in groups]
        if all(measure.measure(t).maximum <= TABLE_WIDTH for t in tables):
            return tables
    return tables


def _table(group: Sequence[RunResult], base: dict) -> Table:
    table = Table()
    table.add_column("metric")
    for r in group:
        header = r.spec.label.replace("/", "\n")
        if r.summary.get("overloaded"):
            header += "\n[bold red]OVERLOADED[/]"
        table.add_column(header, justify="right")
    for label, key, sub, fmt, better in ROWS:
        table.add_row(label, *[_cell(r.summary, base, key, sub, fmt, better) for r in group])
    return table


def _cell(summary: dict, base: dict, key: str, sub: str | None, fmt: str,
          better: bool | None) -> str:
    if fmt == "rejected":
        return _rejected_cell(summary)
    if fmt == "overloaded":
        return _overloaded_cell(summary)
    value, base_value = metric(summary, key, sub), metric(base, key, sub)
    if value is None:
        return "-"
    text = fmt.format(value)
    if better is not None and summary is not base and base_value and value != base_value:
        text += f" ({(value - base_value) / abs(base_value):+.1%})"
    return text


def _rejected_cell(summary: dict) -> str:
    by_reason = summary.get("num_rejected_by_reason") or {}
    parts = [f"{n:,} {SHORT_REASONS.get(reason, reason)}" for reason, n in by_reason.items() if n]
    return ", ".join(parts) if parts else "0"


def _overloaded_cell(summary: dict) -> str:
    if "overloaded" not in summary:
        return "-"
    if not summary["overloaded"]:
        return "no"
    return (f"[bold red]yes[/]: q {summary['queue_at_last_arrival']:,}, "
            f"{summary['queue_growth_req_s']:+.2f}/s")


def run_warnings(results: Sequence[RunResult]) -> list[str]:
    """The stderr lines for runs whose numbers must not be read plainly."""
    lines = []
    for r in results:
        s, label = r.summary, r.spec.label
        if s.get("num_rejected"):
            lines.append(f"warning: {label}: {s['num_rejected']:,} of {s['num_requests']:,} "
                         f"requests rejected as too long ({_reasons(r)}); with --out, its "
                         "requests CSV lists each with status 'rejected' and reject_reason")
        if s.get("overloaded"):
            lines.append(f"warning: {label} is overloaded: its waiting queue grew "
                         f"{s['queue_growth_req_s']:+.2f} req/s through the second half of the "
                         f"trace and held {s['queue_at_last_arrival']:,} requests at the last "
                         "arrival, so its latencies grow with the trace's length, not the "
                         "engine; add replicas or lower --rate-scale")
        note = reclaim_note(s, r.spec.engine.async_scheduling, label,
                            r.spec.engine.detach_behind_step)
        if note is not None:
            lines.append(f"note: {note}")
    return lines


def extrapolation_notes(results: Sequence[RunResult], grid: StepExtent | None,
                        source: str) -> list[str]:
    """The stderr notes for runs whose steps went past `grid`, the extent of calibration
    `source`'s grid (their prices extrapolated, sim.core.calibration.coverage); none without
    a grid."""
    notes = (extrapolation_note(r.spec.label, StepExtent.from_dict(r.summary.get("step_extent")),
                                grid, source) for r in results)
    return [f"note: {note}" for note in notes if note]


def _reasons(r: RunResult) -> str:
    by_reason = r.summary.get("num_rejected_by_reason") or {}
    said = {
        RejectReason.EXCEEDS_MAX_MODEL_LEN.value:
            f"longer than max_model_len {r.spec.engine.effective_max_model_len:,} tokens",
        RejectReason.EXCEEDS_KV_POOL.value:
            f"needing more KV than the pool's {r.summary.get('kv_capacity_tokens', 0):,} tokens",
    }
    return ", ".join(f"{n:,} {said.get(reason, reason)}" for reason, n in by_reason.items() if n)


def interrupted_message(done: Finished, out: Path | None, trace_events: Path | None) -> str:
    """What a stop leaves: which runs finished and where their files are."""
    num, planned = len(done.saved), len(done.planned)
    if not num:
        return f"interrupted before any of {planned} runs finished: nothing was saved"
    where = "not saved (no --out)"
    if out is not None:
        where = f"saved in {out} (summary.json, requests_*.csv, timeline_*.csv)"
    events = f"; their trace events are in {trace_events}" if trace_events is not None else ""
    return (f"interrupted: {num} of {planned} runs finished ({', '.join(done.saved)}), "
            f"{where}{events}")
