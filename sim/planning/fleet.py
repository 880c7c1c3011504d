"""Fleet sizing: the fewest GPUs (or the lowest $/hour) that serve a trace within SLO targets.

The grid is GPU type x TP degree x chunk size x policy; each point is a configuration of one
replica, and the search finds for each the fewest replicas that meet the targets
(`sim.planning.sustain.Sustain`: not overloaded, p99 TTFT and TPOT, attainment). The answer
is "N replicas x TP k = G GPUs", with runners-up (the next cheapest configurations).

Before anything runs, the analytic bounds (`sim.planning.bounds`) drop configurations that do
not fit in memory and every replica count below the throughput bound. The search is then
best-first, in rounds: each round runs, in parallel (`sim.planning.parallel`: local
processes or Ray), the next trial of the open configurations that could still cost least
(`sim.planning.fleet_search`), as many as there are workers. Once 1 + `num_runners_up`
configurations have passed at some count, any configuration whose cheapest untried count
costs more than the last of them is closed unrun (equal costs stay: they may win the
tie-break). A trial stops as soon as it cannot meet the targets, so most failing counts cost
a fraction of a run.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field, replace

from sim.core.catalog import get_gpu
from sim.planning.bounds import work_bound
from sim.planning.cases import Case, EngineOptions, TraceSpec, build_trace, trace_length
from sim.planning.fleet_search import ConfigSearch, Status
from sim.planning.parallel import Executor, run_parallel
from sim.planning.pricing import price_cases, pricing_lines
from sim.planning.stretch import DEFAULT_MAX_REQUESTS, Stretch, choose_stretch
from sim.planning.sustain import Sustain, Trial, run_watched
from sim.planning.sweep import fit_error


class Objective(enum.Enum):
    GPUS = "gpus"
    COST = "cost"


@dataclass(frozen=True)
class FleetQuery:
    model: str
    gpus: tuple[str, ...]
    tps: tuple[int, ...]
    chunks: tuple[int | None, ...]  # None: vLLM's default chunk for the GPU
    policies: tuple[str, ...]
    trace: TraceSpec
    rule: Sustain
    rate_scale: float = 1.0
    options: EngineOptions = field(default_factory=EngineOptions)
    router: str = "round-robin"
    gpu_costs: tuple[tuple[str, float], ...] = ()  # (GPU name, $ per GPU-hour)
    objective: Objective = Objective.GPUS
    max_replicas: int = 64
    num_runners_up: int = 2
    max_requests: int | None = DEFAULT_MAX_REQUESTS  # None: every request (--full-trace)
    calibration: str | None = None  # FILE, "none", or None: each case's shipped one

    def __post_init__(self) -> None:
        for name in ("gpus", "tps", "chunks", "policies"):
            if not getattr(self, name):
                raise ValueError(f"the fleet search needs at least one value for {name}")
        if self.max_replicas < 1 or self.num_runners_up < 0:
            raise ValueError("max_replicas must be >= 1 and num_runners_up >= 0")
        if self.objective is Objective.COST:
            priced = {get_gpu(name).name for name, _ in self.gpu_costs}
            missing = [g for g in self.gpus if get_gpu(g).name not in priced]
            if missing:
                raise ValueError(f"--gpu-cost has no price for {', '.join(missing)}: add "
                                 f"{missing[0]}=DOLLARS_PER_GPU_HOUR")

    def price_per_gpu_hour(self, gpu: str) -> float | None:
        wanted = get_gpu(gpu).name
        return next((p for name, p in self.gpu_costs if get_gpu(name).name == wanted), None)


@dataclass(frozen=True)
class FleetResult:
    query: FleetQuery
    searches: list[ConfigSearch]  # grid order
    ranked: list[ConfigSearch]  # found, cheapest first: the answer, then the runners-up
    stretch: Stretch | None
    num_runs: int
    num_stopped_early: int
    wall_s: float
    pricing: tuple[str, ...] = ()  # which calibration priced the runs
    warnings: tuple[str, ...] = ()  # configurations priced by the datasheet roofline
    length_note: str | None = None  # the trace's requests longer than max_model_len, if any

    @property
    def answer(self) -> ConfigSearch | None:
        return self.ranked[0] if self.ranked else None

    @property
    def runners_up(self) -> list[ConfigSearch]:
        return self.ranked[1: 1 + self.query.num_runners_up]


def run_fleet(query: FleetQuery, executor: Executor | None = None,
              cases: list[Case] | None = None) -> FleetResult:
    """The search; `cases`: the grid's cases already priced (default: `grid_cases`)."""
    executor = executor or Executor()
    start_s = time.perf_counter()
    pricing: tuple[list[str], list[str]] = ([], [])
    if cases is None:
        cases, calibrations = grid_cases(query)
        pricing = pricing_lines(cases, calibrations, forced=query.calibration is not None)
    spec, stretch = _searched_trace(query, cases)
    cases = [replace(c, trace=spec) for c in cases]
    trace = build_trace(spec).scaled(query.rate_scale)
    searches = [_config_search(i, case, query, trace) for i, case in enumerate(cases)]
    num_runs = num_stopped = 0
    keep = 1 + query.num_runners_up
    while True:
        cap = _cap_cost(searches, keep)
        for s in searches:
            s.settle(query.max_replicas, cap)
        open_ = sorted((s for s in searches if s.status is Status.SEARCHING),
                       key=lambda s: (s.optimistic_cost(), s.index))[: executor.num_workers]
        if not open_:
            break
        items = [(replace(s.case, num_replicas=s.next_probe(query.max_replicas, cap)), query.rule)
                 for s in open_]
        trials: list[Trial] = run_parallel(trial_task, items, executor, label="fleet: runs")
        for s, trial in zip(open_, trials):
            s.record(trial)
            num_runs += 1
            num_stopped += trial.stopped_early
    ranked = sorted((s for s in searches if s.status is Status.FOUND), key=ConfigSearch.rank_key)
    length = trace_length(query.trace, query.options, query.model)
    return FleetResult(query, searches, ranked, stretch, num_runs, num_stopped,
                       time.perf_counter() - start_s, tuple(pricing[0]), tuple(pricing[1]),
                       length.note())


def grid_cases(query: FleetQuery) -> tuple[list[Case], list]:
    """One single-replica case per grid point (GPU > TP > chunk > policy), priced by its
    calibration, the chunk resolved where vLLM's default was asked for; and the
    calibrations (None: the roofline)."""
    options = replace(query.options, max_model_len=trace_length(
        query.trace, query.options, query.model).max_model_len)
    cases = []
    for gpu, tp, chunk, policy in itertools.product(query.gpus, query.tps, query.chunks,
                                                    query.policies):
        case = Case(model=query.model, gpu=gpu, tp=tp, chunk=chunk, policy=policy,
                    trace=query.trace, rate_scale=query.rate_scale, options=options,
                    slo=query.rule.slo, router=query.router)
        if chunk is None:
            try:
                case = replace(case, chunk=case.engine().chunk_tokens)
            except ValueError:
                pass  # its fit error says why
        cases.append(case)
    return price_cases(cases, query.calibration)


def _searched_trace(query: FleetQuery, cases: list[Case]) -> tuple[TraceSpec, Stretch | None]:
    fitting = [c for c in cases if fit_error(c) is None]
    if not fitting:
        return query.trace, None
    return choose_stretch(query.trace, fitting[0], query.max_requests)


def _config_search(index: int, case: Case, query: FleetQuery, trace) -> ConfigSearch:
    error = fit_error(case)
    unit = float(case.tp)
    if query.objective is Objective.COST:
        unit *= query.price_per_gpu_hour(case.gpu) or 0.0
    bound = 1
    if error is None:
        bound = work_bound(case, trace, query.rule).min_replicas(query.rule.min_attainment)
    return ConfigSearch(index, case, unit, error, bound_replicas=bound)


def _cap_cost(searches: list[ConfigSearch], keep: int) -> float | None:
    """The `keep`-th lowest cost some configuration is known to reach (None: too few yet)."""
    reached = sorted(s.cost(s.passed.num_replicas) for s in searches if s.passed is not None)
    return reached[keep - 1] if len(reached) >= keep else None


def trial_task(item: tuple[Case, Sustain]) -> Trial:
    """Picklable entry point for `run_parallel`: one trial of one replica count."""
    case, rule = item
    return run_watched(case, build_trace(case.trace).scaled(case.rate_scale), rule)


def gpus_text(search: ConfigSearch) -> str:
    n = search.replicas
    assert n is not None
    gpus = n * search.tp
    return (f"{n} replica{'s' if n > 1 else ''} x TP {search.tp} = {gpus} "
            f"GPU{'s' if gpus > 1 else ''}")


def needs_more_text(search: ConfigSearch, max_replicas: int) -> str:
    """Why a configuration has no answer, in words."""
    if search.status is Status.UNFIT:
        return f"does not fit: {search.fit_error}"
    if search.bound_replicas > max_replicas:
        return (f"needs at least {search.bound_replicas} replicas by the throughput bound, "
                f"above --max-replicas {max_replicas}")
    last = search.trials[-1] if search.trials else None
    if search.status is Status.BEYOND:
        why = last.verdict.text if last is not None else "the throughput bound"
        return f"fails at {search.failed_at} replicas ({why}); more than --max-replicas needed"
    return (f"not run further: {search.failed_at + 1} or more replicas cost more than the "
            "answer and its runners-up")
