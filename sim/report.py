"""Printed comparison table and files written by `--out`: summary.json, CSVs and plots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from sim.recording.outputs import slug, write_request_csv, write_timeline_csv
from traces import Trace

if TYPE_CHECKING:
    from sim.runner import RunResult

# (label, summary key, sub key or None, format, higher is better)
ROWS = (
    ("KV capacity, tokens", "kv_capacity_tokens", None, "{:,.0f}", True),
    ("KV capacity with reserve lent", "kv_capacity_lent_tokens", None, "{:,.0f}", True),
    ("throughput, output tok/s", "throughput_tok_s", None, "{:,.1f}", True),
    ("goodput, req/s", "goodput_req_s", None, "{:.3f}", True),
    ("TTFT p50, s", "ttft_s", "p50", "{:.4f}", False),
    ("TTFT p99, s", "ttft_s", "p99", "{:.4f}", False),
    ("TPOT p50, s", "tpot_s", "p50", "{:.5f}", False),
    ("TPOT p99, s", "tpot_s", "p99", "{:.5f}", False),
    ("ITL p99, s", "itl_s", "p99", "{:.5f}", False),
    ("end-to-end p50, s", "e2e_s", "p50", "{:.3f}", False),
    ("preemptions", "num_preemptions", None, "{:,.0f}", False),
    ("recomputed tokens", "num_recomputed_tokens", None, "{:,.0f}", False),
    ("OOM failures (steps)", "num_oom", None, "{:,.0f}", False),
    ("requests failed by OOM", "num_failed_oom", None, "{:,.0f}", False),
    ("finished / requests", "num_finished", None, "{:,.0f}", True),
    ("decode-only time share", "decode_only_time_share", None, "{:.1%}", None),
    ("reserve lent, time share", "reserve_lent_time_share", None, "{:.1%}", None),
    ("reserve lent, mean tokens", "reserve_lent_tokens_mean", None, "{:,.0f}", None),
    ("attach count", "num_attach", None, "{:,.0f}", None),
    ("attach time, s", "attach_time_s", None, "{:.4f}", None),
    ("detach count", "num_detach", None, "{:,.0f}", None),
    ("detach time, s", "detach_time_s", None, "{:.4f}", None),
    ("drain victims", "num_drain_victims", None, "{:,.0f}", None),
    ("simulator wall time, s", "sim_wall_s", None, "{:.2f}", None),
)


def metric(summary: dict, key: str, sub: str | None) -> float | None:
    value = summary.get(key)
    if sub is not None:
        value = value.get(sub) if isinstance(value, dict) else None
    return value


def print_comparison(results: Sequence[RunResult], trace: Trace,
                     console: Console | None = None) -> None:
    if console is None:
        width = max(Console().width, 34 + 22 * len(results))
        console = Console(width=width)
    first = results[0].spec.engine
    table = Table(title=(f"{first.model.name} on {first.gpu.name} x TP {first.tensor_parallel_size}"
                         f", {len(trace):,} requests from {trace.source}"))
    table.add_column("metric")
    for r in results:
        table.add_column(r.spec.label, justify="right")
    base = results[0].summary
    for label, key, sub, fmt, _ in ROWS:
        cells = []
        for i, r in enumerate(results):
            value = metric(r.summary, key, sub)
            cells.append(_cell(value, metric(base, key, sub), fmt, show_delta=i > 0))
        table.add_row(label, *cells)
    console.print(table)
    if len(results) > 1:
        console.print(f"deltas are relative to the first column ({results[0].spec.label})")


def _cell(value, base, fmt: str, show_delta: bool) -> str:
    if value is None:
        return "-"
    text = fmt.format(value)
    if show_delta and base not in (None, 0) and value != base and "%" not in fmt:
        text += f" ({(value - base) / abs(base):+.1%})"
    return text


def write_outputs(out_dir: Path, results: Sequence[RunResult], trace: Trace, *,
                  plot: bool = False) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {"trace": trace.source, "num_trace_requests": len(trace),
               "runs": [r.summary for r in results]}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    for r in results:
        name = slug(r.spec.label)
        write_request_csv(out_dir / f"requests_{name}.csv",
                          [q for rec in r.recorders for q in rec.requests])
        write_timeline_csv(out_dir / f"timeline_{name}.csv", r.recorders)
    if plot:
        from sim.plots import plot_runs

        plot_runs(out_dir, results)
