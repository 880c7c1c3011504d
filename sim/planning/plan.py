"""`plan`: which chunk size to pick for a model, GPU, TP degree and trace, and whether
elastic reclamation adds anything beyond that choice.

Every (policy, chunk) configuration runs once over the trace (goodput, KV capacity,
TTFT, ...) and, unless disabled, gets a max-rate search (see `capacity`).

Pick rule (``pick``): the largest goodput; configurations within ``tie_pct`` percent of
the best goodput tie, and among ties the lowest p99 TTFT wins. Static and elastic rows
are picked separately by the same rule; elastic "pays" when its pick beats the static
pick by at least ``pays_pct`` percent in goodput or in max sustained rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sim.core.memory_plan import DEFAULT_MAX_MODEL_LEN
from sim.planning.capacity import MaxRate, RateSearch, Sustain, search_task
from sim.planning.cases import Case, EngineOptions, TraceSpec, build_trace
from sim.planning.parallel import Executor, run_parallel
from sim.planning.sweep import run_case
from sim.recording.metrics import Slo

DEFAULT_CHUNKS = tuple(2**k for k in range(9, 16))  # 512 .. 32768
PICK_RULE = ("largest goodput; rows within {tie_pct:g}% of the best goodput tie and the lowest "
             "p99 TTFT among them wins")
PAYS_RULE = ("elastic pays when its pick beats the static pick by >= {pays_pct:g}% in goodput "
             "or in max sustained rate")


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
    search_max_rate: bool = True
    rel_tol: float = 0.05
    min_attainment: float = 0.95
    tie_pct: float = 1.0
    pays_pct: float = 5.0
    efficiency: object | None = None
    profile: object | None = None
    vmm_costs: object | None = None

    def cases(self) -> list[Case]:
        options = replace(self.options, max_model_len=self.max_model_len())
        return [Case(model=self.model, gpu=self.gpu, tp=self.tp, chunk=chunk, policy=policy,
                     trace=self.trace, rate_scale=self.rate_scale, options=options,
                     slo=self.slo, efficiency=self.efficiency, profile=self.profile,
                     vmm_costs=self.vmm_costs)
                for policy in ("static", "elastic") for chunk in self.chunks]

    def max_model_len(self) -> int | None:
        """The user's value, else vLLM's default raised to the trace's longest request."""
        if self.options.max_model_len is not None:
            return self.options.max_model_len
        trace = build_trace(self.trace)
        longest = int((trace.prompt_tokens + trace.output_tokens).max()) if len(trace) else 0
        return None if longest <= DEFAULT_MAX_MODEL_LEN else longest


@dataclass(frozen=True)
class PlanResult:
    query: PlanQuery
    rows: list[dict]  # one per (policy, chunk), fits=False rows included
    static_pick: dict | None
    elastic_pick: dict | None
    gains_pct: dict[str, float | None]  # elastic pick over static pick
    elastic_pays: bool
    rules: dict[str, str]

    def as_dict(self) -> dict:
        q = self.query
        return {
            "model": q.model, "gpu": q.gpu, "tensor_parallel_size": q.tp, "trace": q.trace.label,
            "slo_ttft_s": q.slo.ttft_s, "slo_tpot_s": q.slo.tpot_s,
            "pick_chunk": None if self.static_pick is None else self.static_pick["chunk"],
            "elastic_pick_chunk": None if self.elastic_pick is None else self.elastic_pick["chunk"],
            "elastic_gain_pct": self.gains_pct, "elastic_pays": self.elastic_pays,
            "rules": self.rules, "rows": self.rows,
        }


def run_plan(query: PlanQuery, executor: Executor | None = None) -> PlanResult:
    executor = executor or Executor()
    cases = query.cases()
    rows = run_parallel(run_case, cases, executor, label="plan: runs")
    if query.search_max_rate:
        _add_max_rates(query, cases, rows, executor)
    static = pick([r for r in rows if r["policy"] == "static"], query.tie_pct)
    elastic = pick([r for r in rows if r["policy"] == "elastic"], query.tie_pct)
    gains = elastic_gains(static, elastic)
    pays = any(g is not None and g >= query.pays_pct
               for k, g in gains.items() if k in ("goodput_req_s", "max_rate_req_s"))
    rules = {"pick": PICK_RULE.format(tie_pct=query.tie_pct),
             "pays": PAYS_RULE.format(pays_pct=query.pays_pct)}
    if query.search_max_rate:
        rules["sustains"] = (f"SLO attainment >= {query.min_attainment:.0%} of requests and "
                             f"p99 TTFT <= SLO; bisection on rate scale to {query.rel_tol:.0%}")
    return PlanResult(query, rows, static, elastic, gains, pays, rules)


def _add_max_rates(query: PlanQuery, cases: list[Case], rows: list[dict],
                   executor: Executor) -> None:
    rule = Sustain(query.slo, query.min_attainment)
    search = RateSearch(rule, start_scale=query.rate_scale, rel_tol=query.rel_tol)
    fitting = [i for i, row in enumerate(rows) if row["fits"]]
    found: list[MaxRate] = run_parallel(search_task, [(cases[i], search) for i in fitting],
                                        executor, label="plan: max rate")
    for i, result in zip(fitting, found):
        rows[i].update(result.as_row())


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
