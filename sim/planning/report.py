"""Rich tables for `sweep`, `plan`, `plan map` and `plan reserve`, and what a stopped command
leaves."""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sim.planning.gain_map import OUTPUT_TOKENS, Cell, MapQuery
from sim.planning.reserve import PUBLISHED_NOTE
from sim.planning.sweep import BEYOND_CONTEXT, fit_status
from sim.recording.folder import TEMP_PREFIX
from sim.recording.reclaims import RECLAIM_EVIDENCE, RECLAIM_MARK

# (header, row key, format)
SWEEP_COLUMNS = (
    ("model", "model", "{}"), ("gpu", "gpu", "{}"), ("tp", "tensor_parallel_size", "{}"),
    ("chunk", "chunk", "{:,}"), ("policy", "policy", "{}"), ("rate x", "rate_scale", "{:g}"),
    ("prompt", "prompt", "{}"), ("KV tokens", "kv_capacity_tokens", "{:,}"),
    ("goodput req/s", "goodput_req_s", "{:.3f}"), ("TTFT p99 s", "ttft_s_p99", "{:.3f}"),
    ("preempt", "num_preemptions", "{:,}"),
)
MAX_SWEEP_ROWS_SHOWN = 60
MAX_FAILURES_SHOWN = 5


def cell(row: dict, key: str, fmt: str) -> str:
    """A table cell: "-" for a missing value, ">" before a max rate above the searched range."""
    value = row.get(key)
    if value is None:
        return "-"
    if key == "max_rate_req_s" and row.get("max_rate_above_range"):
        return ">" + fmt.format(value)
    return fmt.format(value)


def _table(title: str, rows: Sequence[dict], spec) -> Table:
    table = Table(title=title)
    for header, _, _ in spec:
        table.add_column(header, justify="right")
    for row in rows:
        if row.get("error") or not row.get("fits", True):
            first = [cell(row, key, fmt) for _, key, fmt in spec[:2]]
            status = "failed" if row.get("error") else fit_status(row.get("fit_error"))
            table.add_row(*first, status, *[""] * (len(spec) - 3))
            continue
        table.add_row(*[cell(row, key, fmt) for _, key, fmt in spec])
    return table


def print_sweep(rows: Sequence[dict], console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 130))
    shown = rows[:MAX_SWEEP_ROWS_SHOWN]
    console.print(_table(f"sweep: {len(rows)} configurations", shown, SWEEP_COLUMNS))
    if len(rows) > len(shown):
        console.print(f"({len(rows) - len(shown)} more rows in the table file)")


def sweep_failures(rows: Sequence[dict], out: Path | None) -> list[str]:
    """The stderr lines of a sweep whose cases failed: how many, the first reasons, and how
    to run them again."""
    failed = [r for r in rows if r.get("error")]
    if not failed:
        return []
    where = f"the error column of {out / 'sweep.csv'}" if out is not None else "--json"
    lines = [f"warning: {len(failed)} of {len(rows)} cases failed (all reasons: {where})"]
    for row in failed[:MAX_FAILURES_SHOWN]:
        lines.append(f"  {row['model']} {row['gpu']} tp={row['tensor_parallel_size']} "
                     f"chunk={row['chunk']} {row['policy']} x{row['rate_scale']:g}: "
                     f"{row['error']}")
    if out is not None:
        lines.append("  rerun with --resume to run the failed cases again")
    return lines


def interrupted_sweep(rows_done: int, total: int, out: Path | None) -> str:
    """What a stopped sweep leaves."""
    if out is None:
        return f"interrupted: {rows_done} of {total} cases had ended; nothing saved (no --out)"
    return (f"interrupted: the {rows_done} of {total} cases that ended are in "
            f"{out / 'sweep.csv'}; rerun with --resume to run the rest")


def stopped(command: str, out: Path | None, patterns: Sequence[str],
            kept_note: str | None = None) -> int:
    """Say on stderr what a Ctrl-C after --out was claimed leaves, and return exit code 130.

    Every file is written whole or not at all, so the result files in `out` (which the claim
    emptied of earlier ones) are exactly what this command finished before the stop.
    `kept_note` says what the kept files hold, where that is less than a whole result."""
    kept = kept_files(out, patterns)
    print(interrupted_command(command, out, kept, kept_note), file=sys.stderr)
    return 130


def interrupted_command(command: str, out: Path | None, kept: Sequence[str],
                        kept_note: str | None = None) -> str:
    head = f"interrupted: python -m sim {command} stopped before it ended"
    if out is None:
        return f"{head}; nothing saved (no --out)"
    if not kept:
        return f"{head}; nothing written to {out}"
    note = f" ({kept_note})" if kept_note else ""
    return (f"{head}; kept in {out}, each file whole: {', '.join(kept)}{note}; "
            "nothing else written")


def kept_files(out: Path | None, patterns: Sequence[str]) -> list[str]:
    """The result files (names matching `patterns`) in `out`, leaving out unfinished ones."""
    if out is None or not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if not p.name.startswith(TEMP_PREFIX)
                  and any(fnmatch.fnmatch(p.name, pattern) for pattern in patterns))


def _mib(mib: int) -> str:
    return f"from {mib} MiB" if mib else "off"


def print_map(cells: Sequence[Cell], query: MapQuery, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 140))
    engine = (f"{query.drain} drain, "
              f"{'async' if query.async_scheduling else 'synchronous'} scheduling, "
              f"mixed split {_mib(query.mixed_split_mib)}")
    for tp in query.tps:
        table = Table(title=f"elastic goodput gain over best static, %, {query.gpu}, TP {tp}, "
                            f"{engine} (* pays: >= {query.pays_pct:g}%)")
        table.add_column("model")
        for prompt in query.prompts:
            table.add_column(f"{prompt:,} tok", justify="right")
        index = {(c.model, c.prompt_tokens): c for c in cells if c.tp == tp}
        for model in query.models:
            table.add_row(model, *[_map_text(index[(model, p)]) for p in query.prompts])
        console.print(table)
    if any(c.reclaims_often for c in cells):
        console.print(f"{RECLAIM_MARK}. {RECLAIM_EVIDENCE}")
    if any(c.status == BEYOND_CONTEXT for c in cells):
        console.print(f"{BEYOND_CONTEXT} (N): prompt + up to {OUTPUT_TOKENS[1]} output tokens "
                      "exceed the model's N-token context; vLLM refuses such a max_model_len")


def _map_text(cell: Cell) -> str:
    if cell.status == BEYOND_CONTEXT:
        return f"{BEYOND_CONTEXT} ({cell.context_tokens:,})"
    if cell.status != "ok":
        return cell.status
    if cell.gain_pct is None or cell.static_chunk is None:
        return "-"
    return (f"{cell.gain_pct:+.1f}{' *' if cell.pays else ''}{' !' if cell.reclaims_often else ''}"
            f" (c{cell.static_chunk // 1024}k)")


def print_reserve(rows: Sequence[dict], console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 110))
    table = Table(title="activation reserve as a share of the KV pool")
    for header in ("model", "TP", "chunk", "reserve GiB", "KV pool GiB", "reserve share",
                   "forward-only share", "published"):
        table.add_column(header, justify="right")
    for r in rows:
        head = (r["model"], str(r["tensor_parallel_size"]), f"{r['chunk']:,}")
        if not r["fits"]:
            table.add_row(*head, r["status"], "", "", "", "")
            continue
        published = "" if r["published_share"] is None else f"{r['published_share']:.1%}"
        table.add_row(*head, f"{r['reserve_gib']:.2f}", f"{r['kv_pool_gib']:.1f}",
                      f"{r['reserve_share']:.1%}", f"{r['forward_only_share']:.1%}", published)
    console.print(table)
    console.print(f"note: {PUBLISHED_NOTE}")
