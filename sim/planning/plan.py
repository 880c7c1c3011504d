"""`plan`: which chunk size to pick for a model, GPU, TP degree and trace, and whether
elastic reclamation adds anything beyond that choice.

Every (policy, chunk) configuration runs once over the trace (goodput, KV capacity, TTFT,
...; a trace longer than ``max_requests`` is run on its busiest stretch, `sim.planning.
stretch`, and the result says so). The picks then get a max-rate search (see `capacity`),
or every row does with ``max_rate=MaxRateRows.ALL``.

Pick rule (``pick``): among rows that fit and are not overloaded (a queue that grows through
the trace makes every figure of the run the trace's length, not the engine's), the largest
goodput; configurations within ``tie_pct`` percent of the best goodput tie, and among ties
the lowest p99 TTFT wins. Static and elastic rows are picked separately by the same rule;
elastic "pays" when its pick beats the static pick by at least ``pays_pct`` percent in
goodput or in max sustained rate. When every fitting row is overloaded there is no pick: the
plan says that no configuration sustains the load and, given SLO targets, asks the fleet
search (`sim.planning.fleet`) how many replicas would.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from sim.core.cost_model import Efficiency
from sim.core.elastic import VmmCosts
from sim.core.memory_plan import ActivationProfile
from sim.planning.bounds import work_bound
from sim.planning.capacity import MaxRate, RateSearch, search_task
from sim.planning.cases import (
    Case,
    EngineOptions,
    TraceLength,
    TraceSpec,
    build_trace,
    trace_length,
)
from sim.planning.fleet import FleetQuery, FleetResult, run_fleet
from sim.planning.parallel import Executor, run_parallel
from sim.planning.stretch import DEFAULT_MAX_REQUESTS, Stretch, choose_stretch
from sim.planning.sustain import Sustain
from sim.planning.sweep import fit_error, run_case
from sim.recording import reclaims
from sim.recording.metrics import Slo

DEFAULT_CHUNKS = tuple(2**k for k in range(9, 16))  # 512 .. 32768
PICK_RULE = ("among rows that fit and are not overloaded, the largest goodput; rows within "
             "{tie_pct:g}% of the best goodput tie and the lowest p99 TTFT among them wins")
PAYS_RULE = ("elastic pays when its pick beats the static pick by >= {pays_pct:g}% in goodput "
             "or in max sustained rate")


class MaxRateRows(enum.Enum):
    """Which rows get a max-rate search: the two picks (default), every fitting row, none."""

    PICKS = "picks"
    ALL = "all"
    NONE = "none"


@dataclass(frozen=True)
class PlanQuery:
    model: str
    gpu: str
    tp: int
    trace: TraceSpec
    slo: Slo = field(default_factory=Slo)
    chunks: tuple[int, ...] = DEFAULT_CHUNKS
    options: EngineOptions = field(default_factory=EngineOptions)
    rate_scale: float = 1.0
    max_rate: MaxRateRows = MaxRateRows.PICKS
    rel_tol: float = 0.05
    min_attainment: float = 0.95
    tie_pct: float = 1.0
    pays_pct: float = 5.0
    max_requests: int | None = DEFAULT_MAX_REQUESTS  # None: every request (--full-trace)
    efficiency: Efficiency | None = None
    profile: ActivationProfile | None = None
    vmm_costs: VmmCosts | None = None

    def cases(self, trace: TraceSpec | None = None) -> list[Case]:
        options = replace(self.options, max_model_len=self.max_model_len())
        return [Case(model=self.model, gpu=self.gpu, tp=self.tp, chunk=chunk, policy=policy,
                     trace=trace or self.trace, rate_scale=self.rate_scale, options=options,
                     slo=self.slo, efficiency=self.efficiency, profile=self.profile,
                     vmm_costs=self.vmm_costs)
                for policy in ("static", "elastic") for chunk in self.chunks]

    def max_model_len(self) -> int | None:
        """The user's value, else vLLM's default raised to the trace's longest request, no
        further than the model's context (`trace_length`)."""
        return self.length().max_model_len

    def length(self) -> TraceLength:
        return trace_length(self.trace, self.options, self.model)

    def rule(self) -> Sustain | None:
        """The SLO rule for the max rate and the fleet search (None: no SLO given)."""
        if self.slo.ttft_s is None and self.slo.tpot_s is None:
            return None
        return Sustain(self.slo, self.min_attainment)


@dataclass(frozen=True)
class PlanResult:
    query: PlanQuery
    rows: list[dict]  # one per (policy, chunk), fits=False rows included
    static_pick: dict | None
    elastic_pick: dict | None
    gains_pct: dict[str, float | None]  # elastic pick over static pick
    elastic_pays: bool
    rules: dict[str, str]
    stretch: Stretch | None = None  # the stretch of the trace run, when not all of it
    fleet: FleetResult | None = None  # replicas that would sustain it, when nothing does
    length_note: str | None = None  # the trace's requests longer than max_model_len, if any

    @property
    def elastic_note(self) -> str | None:
        """What the plan says of an elastic pick that reclaims often (`reclaim_note`)."""
        return reclaim_note(self.elastic_pick)

    @property
    def overloaded_rows(self) -> list[dict]:
        return [r for r in self.rows if r["fits"] and r.get("overloaded")]

    @property
    def nothing_sustains(self) -> bool:
        """Every fitting row is overloaded (and some row fits)."""
        fitting = [r for r in self.rows if r["fits"]]
        return bool(fitting) and len(self.overloaded_rows) == len(fitting)

    def as_dict(self) -> dict:
        q = self.query
        fleet = self.fleet.answer if self.fleet is not None else None
        return {
            "model": q.model, "gpu": q.gpu, "tensor_parallel_size": q.tp, "trace": q.trace.label,
            "stretch": None if self.stretch is None else self.stretch.note(),
            "rejected_too_long": self.length_note,
            "slo_ttft_s": q.slo.ttft_s, "slo_tpot_s": q.slo.tpot_s,
            "pick_chunk": None if self.static_pick is None else self.static_pick["chunk"],
            "elastic_pick_chunk": None if self.elastic_pick is None else self.elastic_pick["chunk"],
            "nothing_sustains": self.nothing_sustains,
            "fleet_replicas": None if fleet is None else fleet.replicas,
            "fleet_chunk": None if fleet is None else fleet.case.chunk,
            "elastic_gain_pct": self.gains_pct, "elastic_pays": self.elastic_pays,
            "elastic_note": self.elastic_note,
            "rules": self.rules, "rows": self.rows,
        }


def run_plan(query: PlanQuery, executor: Executor | None = None) -> PlanResult:
    executor = executor or Executor()
    spec, stretch = _searched_trace(query)
    cases = query.cases(spec)
    rows = run_parallel(run_case, cases, executor, label="plan: runs")
    static = pick(sustained_rows(rows, "static"), query.tie_pct)
    elastic = pick(sustained_rows(rows, "elastic"), query.tie_pct)
    rule = query.rule()
    if rule is not None and query.max_rate is not MaxRateRows.NONE:
        chosen = [r for r in rows if r["fits"]] if query.max_rate is MaxRateRows.ALL else [
            r for r in (static, elastic) if r is not None]
        _add_max_rates(query, rule, cases, rows, [rows.index(r) for r in chosen], executor)
    gains = elastic_gains(static, elastic)
    pays = any(g is not None and g >= query.pays_pct
               for k, g in gains.items() if k in ("goodput_req_s", "max_rate_req_s"))
    rules = {"pick": PICK_RULE.format(tie_pct=query.tie_pct),
             "pays": PAYS_RULE.format(pays_pct=query.pays_pct)}
    if rule is not None and query.max_rate is not MaxRateRows.NONE:
        rules["sustains"] = (f"{rule.describe()}; bisection on rate scale to "
                             f"{query.rel_tol:.0%}")
    fitting = [r for r in rows if r["fits"]]
    fleet = None
    if rule is not None and fitting and all(r.get("overloaded") for r in fitting):
        statics = [c for c in query.cases() if c.policy == "static"]
        fleet = run_fleet(_fleet_query(query, rule), executor, statics)
    return PlanResult(query, rows, static, elastic, gains, pays, rules, stretch, fleet,
                      query.length().note())


def _searched_trace(query: PlanQuery) -> tuple[TraceSpec, Stretch | None]:
    fitting = [c for c in query.cases() if fit_error(c) is None]
    if not fitting:
        return query.trace, None
    return choose_stretch(query.trace, fitting[0], query.max_requests)


def _add_max_rates(query: PlanQuery, rule: Sustain, cases: list[Case], rows: list[dict],
                   chosen: list[int], executor: Executor) -> None:
    """Each chosen row's max sustained rate, bracketed from its own run at the plan's rate
    and capped by the throughput bound (a scale above it cannot sustain)."""
    search = RateSearch(rule, start_scale=query.rate_scale, rel_tol=query.rel_tol)
    items = []
    for i in chosen:
        trace = build_trace(cases[i].trace)
        ceiling = work_bound(cases[i], trace, rule).max_rate_scale(trace, rule)
        known = {query.rate_scale: rule.holds(rows[i])}
        items.append((cases[i], search, known, ceiling))
    found: list[MaxRate] = run_parallel(search_task, items, executor, label="plan: max rate")
    for i, result in zip(chosen, found):
        rows[i].update(result.as_row())


def _fleet_query(query: PlanQuery, rule: Sustain) -> FleetQuery:
    return FleetQuery(model=query.model, gpus=(query.gpu,), tps=(query.tp,),
                      chunks=query.chunks, policies=("static",), trace=query.trace, rule=rule,
                      rate_scale=query.rate_scale, options=query.options, num_runners_up=0,
                      max_requests=query.max_requests, calibration=None)


def reclaim_note(row: dict | None) -> str | None:
    """What the plan says of an elastic row that reclaims often (`sim.recording.reclaims`)."""
    return reclaims.reclaim_note(row, bool(row and row.get("async_scheduling")),
                                 "elastic's pick", bool(row and row.get("detach_behind_step", True)))


def sustained_rows(rows: list[dict], policy: str) -> list[dict]:
    """The policy's rows that fit and whose queue did not grow through the trace."""
    return [r for r in rows if r["policy"] == policy and r["fits"] and not r.get("overloaded")]


def pick(rows: list[dict], tie_pct: float) -> dict | None:
    """The row the pick rule chooses among fitting rows (see the module docstring)."""
    fitting = [r for r in rows if r["fits"]]
    if not fitting:
        return None
    best = max(r["goodput_req_s"] for r in fitting)
    tied = [r for r in fitting if r["goodput_req_s"] >= best * (1 - tie_pct / 100)]
    return min(tied, key=lambda r: (_ttft_p99(r), -r["goodput_req_s"]))


def _ttft_p99(row: dict) -> float:
    value = row.get("ttft_s_p99")
    return float("inf") if value is None else value


GAIN_METRICS = ("goodput_req_s", "throughput_tok_s", "max_rate_req_s", "kv_capacity_lent_tokens")


def elastic_gains(static: dict | None, elastic: dict | None) -> dict[str, float | None]:
    """Percent gain of the elastic pick over the static pick per metric (None if unknown)."""
    gains: dict[str, float | None] = {}
    for key in GAIN_METRICS:
        base = None if static is None else static.get(key)
        value = None if elastic is None else elastic.get(key)
        gains[key] = (100.0 * (value / base - 1.0)
                      if base and value is not None else None)
    return gains
