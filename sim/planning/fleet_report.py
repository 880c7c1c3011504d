"""What the fleet search prints: the answer, the runners-up, every configuration's trials."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from sim.planning.fleet import FleetResult, gpus_text, needs_more_text
from sim.planning.fleet_search import ConfigSearch, Status
from sim.planning.sustain import Trial, attainment


def answer_line(result: FleetResult, search: ConfigSearch) -> str:
    """'N replicas x TP k = G GPUs (gpu, chunk, policy[, $/h]): TTFT p99 ..., ...'."""
    case = search.case
    assert search.passed is not None and search.passed.summary is not None
    summary = search.passed.summary
    cost = _dollars(result, search)
    dollars = "" if cost is None else f", ${cost:,.2f}/h"
    tpot = summary["tpot_s"]["p99"]
    return (f"{gpus_text(search)} ({case.gpu}, chunk {case.chunk:,}, {case.policy}{dollars}): "
            f"TTFT p99 {_seconds(summary['ttft_s']['p99'])}, TPOT p99 {_seconds(tpot)}, "
            f"{attainment(summary):.1%} within the SLO")


def print_fleet(result: FleetResult, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 140))
    q = result.query
    console.print(f"[bold]fleet for {q.model}[/], trace {q.trace.label} at rate x{q.rate_scale:g}")
    console.print(f"targets: {q.rule.describe()}")
    if result.stretch is not None:
        console.print(f"trace: {result.stretch.note()}")
    if result.length_note is not None:
        console.print(f"trace: {result.length_note}")
    console.print(_table(result))
    answer = result.answer
    if answer is None:
        console.print("[bold]no configuration meets the targets[/] within "
                      f"--max-replicas {q.max_replicas}:")
        for s in result.searches:
            console.print(f"  {_config_label(s)}: {needs_more_text(s, q.max_replicas)}")
    else:
        console.print(f"[bold]answer: {answer_line(result, answer)}[/]")
        for i, s in enumerate(result.runners_up, 1):
            console.print(f"runner-up {i}: {answer_line(result, s)}")
    skipped = sum(max(0, s.bound_replicas - 1) for s in result.searches
                  if s.status is not Status.UNFIT)
    unfit = sum(s.status is Status.UNFIT for s in result.searches)
    console.print(f"search: {result.num_runs} runs ({result.num_stopped_early} stopped once "
                  f"they could not meet the targets) in {result.wall_s:.1f} s; the bounds "
                  f"ruled out {unfit} configuration(s) by memory and {skipped} replica "
                  f"count(s) by throughput without a run")
    for line in result.pricing:
        console.print(line)


def fleet_dict(result: FleetResult) -> dict:
    """The result as JSON values: the query, the answer, the runners-up, every trial."""
    q = result.query

    def found(s: ConfigSearch) -> dict:
        return {**_config(s), "replicas": s.replicas, "gpus": (s.replicas or 0) * s.tp,
                "cost_per_hour": _dollars(result, s), "line": answer_line(result, s)}

    return {
        "model": q.model, "trace": q.trace.label, "rate_scale": q.rate_scale,
        "targets": q.rule.describe(), "objective": q.objective.value,
        "stretch": None if result.stretch is None else result.stretch.note(),
        "rejected_too_long": result.length_note,
        "answer": None if result.answer is None else found(result.answer),
        "runners_up": [found(s) for s in result.runners_up],
        "configs": [{**_config(s), "status": s.status.value, "bound_replicas": s.bound_replicas,
                     "why": None if s.status is Status.FOUND
                     else needs_more_text(s, q.max_replicas)} for s in result.searches],
        "num_runs": result.num_runs, "num_stopped_early": result.num_stopped_early,
        "pricing": list(result.pricing), "wall_s": result.wall_s,
    }


def trial_rows(result: FleetResult) -> list[dict]:
    """One table row per run: the configuration, the replica count, the verdict, metrics."""
    rows = []
    for s in result.searches:
        for t in s.trials:
            summary = t.summary or {}
            rows.append({**_config(s), "num_replicas": t.num_replicas, "meets": t.verdict.ok,
                         "verdict": t.verdict.text, "stopped_early": t.stopped_early,
                         "ttft_s_p99": summary.get("ttft_s", {}).get("p99"),
                         "tpot_s_p99": summary.get("tpot_s", {}).get("p99"),
                         "attainment": attainment(summary) if summary else None,
                         "overloaded": summary.get("overloaded"),
                         "queue_at_last_arrival": summary.get("queue_at_last_arrival"),
                         "queue_growth_req_s": summary.get("queue_growth_req_s"),
                         "wall_s": t.wall_s})
    return rows


def _config(s: ConfigSearch) -> dict:
    return {"gpu": s.case.gpu, "tensor_parallel_size": s.tp, "chunk": s.case.chunk,
            "policy": s.case.policy}


def _dollars(result: FleetResult, s: ConfigSearch) -> float | None:
    price = result.query.price_per_gpu_hour(s.case.gpu)
    return None if price is None else (s.replicas or 0) * s.tp * price


def _table(result: FleetResult) -> Table:
    table = Table(title="configurations (trials: replicas -> verdict)")
    for header in ("gpu", "TP", "chunk", "policy", "bound", "trials", "answer"):
        table.add_column(header, justify="right" if header != "trials" else "left")
    for s in result.searches:
        case = s.case
        answer = gpus_text(s) if s.status is Status.FOUND else s.status.value
        bound = "-" if s.status is Status.UNFIT else f">= {s.bound_replicas}"
        trials = "; ".join(_trial_text(t) for t in s.trials) or "-"
        table.add_row(case.gpu, str(case.tp), f"{case.chunk:,}" if case.chunk else "-",
                      case.policy, bound, trials, answer)
    return table


def _trial_text(trial: Trial) -> str:
    verdict = "meets" if trial.verdict.ok else trial.verdict.text
    return f"{trial.num_replicas}: {verdict}"


def _config_label(s: ConfigSearch) -> str:
    chunk = f"{s.case.chunk:,}" if s.case.chunk else "default"
    return f"{s.case.gpu} TP {s.tp} chunk {chunk} {s.case.policy}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} s"
