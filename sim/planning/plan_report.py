"""What `plan` prints: the rows (overloaded ones marked), the rules, the picks, and, when no
configuration sustains the load, that statement and what would."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from sim.planning.fleet_report import answer_line
from sim.planning.plan import PlanQuery, PlanResult
from sim.planning.report import cell
from sim.planning.sustain import overload_text
from sim.planning.sweep import fit_status

# (header, row key, format)
PLAN_COLUMNS = (
    ("policy", "policy", "{}"),
    ("chunk", "chunk", "{:,}"),
    ("KV tokens", "kv_capacity_tokens", "{:,}"),
    ("KV lent", "kv_capacity_lent_tokens", "{:,}"),
    ("tok/s", "throughput_tok_s", "{:,.1f}"),
    ("goodput req/s", "goodput_req_s", "{:.3f}"),
    ("TTFT p99 s", "ttft_s_p99", "{:.3f}"),
    ("TPOT p99 s", "tpot_s_p99", "{:.4f}"),
    ("preempt", "num_preemptions", "{:,}"),
    ("max rate req/s", "max_rate_req_s", "{:.2f}"),
    ("queue", "queue_at_last_arrival", "{:,}"),
)


def _cell(row: dict, key: str, fmt: str) -> str:
    """planning.report's cell, the queue marked where the run is overloaded."""
    text = cell(row, key, fmt)
    if key == "queue_at_last_arrival" and row.get(key) is not None and row.get("overloaded"):
        text += f" OVERLOADED ({row.get('queue_growth_req_s') or 0.0:+.2f}/s)"
    return text


def plan_table(result: PlanResult) -> Table:
    q = result.query
    table = Table(title=f"{q.model} on {q.gpu} x TP {q.tp}, trace {q.trace.label} "
                        f"at rate x{q.rate_scale:g}")
    for header, _, _ in PLAN_COLUMNS:
        table.add_column(header, justify="right")
    for row in result.rows:
        if not row["fits"]:
            head = [_cell(row, key, fmt) for _, key, fmt in PLAN_COLUMNS[:2]]
            table.add_row(*head, fit_status(row.get("fit_error")),
                          *[""] * (len(PLAN_COLUMNS) - 3))
            continue
        table.add_row(*[_cell(row, key, fmt) for _, key, fmt in PLAN_COLUMNS],
                      style="red" if row.get("overloaded") else None)
    return table


def print_plan(result: PlanResult, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 150))
    if result.stretch is not None:
        console.print(f"trace: {result.stretch.note()}")
    if result.length_note is not None:
        console.print(f"trace: {result.length_note}")
    console.print(plan_table(result))
    for name, rule in result.rules.items():
        console.print(f"[bold]{name}[/]: {rule}")
    if result.nothing_sustains:
        _print_overloaded(result, console)
        return
    if result.static_pick is None:
        console.print("no static chunk size fits this GPU and sustains the load; see the rows "
                      "above")
        return
    s = result.static_pick
    console.print(f"[bold]pick chunk {s['chunk']:,}[/] (static): goodput "
                  f"{s['goodput_req_s']:.3f} req/s, TTFT p99 {_fmt(s.get('ttft_s_p99'), '.3f')} s")
    if result.overloaded_rows:
        chunks = ", ".join(f"{r['policy']} {r['chunk']:,}" for r in result.overloaded_rows)
        console.print(f"overloaded, never picked: {chunks}")
    e = result.elastic_pick
    if e is not None:
        gains = ", ".join(f"{k} {_fmt(v, '+.1f')}%" for k, v in result.gains_pct.items())
        verdict = "pays" if result.elastic_pays else "does not pay"
        console.print(f"elastic (its pick: chunk {e['chunk']:,}) {verdict}: {gains}")
        if result.elastic_note is not None:
            console.print(f"[yellow]note[/]: {result.elastic_note}")


def _print_overloaded(result: PlanResult, console: Console) -> None:
    q = result.query
    worst = max(result.overloaded_rows, key=lambda r: r.get("queue_at_last_arrival") or 0)
    least = min(result.overloaded_rows, key=lambda r: r.get("queue_growth_req_s") or 0.0)
    console.print(f"[bold red]no configuration sustains this load[/] on one replica of "
                  f"{q.model} on {q.gpu} x TP {q.tp}: the waiting queue grows through the "
                  f"trace at every chunk and policy (least: {least['policy']} chunk "
                  f"{least['chunk']:,}, {overload_text(least)}; most: {worst['policy']} chunk "
                  f"{worst['chunk']:,}, {overload_text(worst)}). Their goodput and latencies "
                  f"measure the trace's length, not the engine: no chunk is picked.")
    fleet = result.fleet
    if fleet is None:
        console.print("give an SLO (--slo-ttft, --slo-tpot) and the fleet search says how "
                      "many replicas would: python -m sim plan fleet ...")
        return
    if fleet.answer is not None:
        console.print(f"[bold]what would[/] (fleet search, same GPU and TP): "
                      f"{answer_line(fleet, fleet.answer)}")
    else:
        console.print(f"the fleet search found no replica count up to "
                      f"{fleet.query.max_replicas} on this GPU and TP that meets the targets")
    console.print(f"other GPUs and TP degrees: {fleet_command(q)} (docs/planning.md)")


def fleet_command(q: PlanQuery) -> str:
    """The `plan fleet` command that asks the plan's question over other GPUs and TPs."""
    trace = q.trace.source if q.trace.source is not None else "FILE"
    window = "" if q.trace.window_s is None else f" --window {q.trace.window_s[0]:g}:{q.trace.window_s[1]:g}"
    slo = "".join(f" --slo-{name} {value:g}" for name, value in
                  (("ttft", q.slo.ttft_s), ("tpot", q.slo.tpot_s)) if value is not None)
    return (f"python -m sim plan fleet --model {q.model} --gpu {q.gpu},OTHER --tp 1,2,4,8 "
            f"--trace {trace}{window} --rate-scale {q.rate_scale:g}{slo}")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
