"""The map: elastic's gain over the best static chunk across model x prompt length x TP.

Each cell is one (model, prompt length, TP degree) on one GPU. Its workload is a small
synthetic trace: ``num_requests`` Poisson arrivals (fewer for long prompts, see
``num_requests_for``), every prompt ``prompt_tokens`` long,
outputs uniform in ``OUTPUT_TOKENS``, at a rate that stresses the KV pool (``stress_rate``:
``load`` x the rate at which, by Little's law, the requests in flight would just fill the
static KV pool). Static and elastic run at every chunk size of the map; the cell's gain is
elastic's best goodput over static's best (both by the `plan` pick rule), in percent, and
"pays" means a gain of at least ``pays_pct``. ``max_model_len`` is set to the longest
request, so a cell whose KV pool cannot hold one request does not fit, and a cell whose
longest request is past the model's context (``max_position_embeddings``) is "beyond
context": vLLM refuses such a max_model_len, so the cell is not run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from sim.core.catalog import get_gpu, get_model
from sim.core.cost_model import CostModel
from sim.core.memory_plan import plan_memory
from sim.planning.cases import Case, EngineOptions, SyntheticSpec, TraceSpec
from sim.planning.parallel import Executor, iter_outcomes
from sim.planning.plan import pick
from sim.planning.sweep import BEYOND_CONTEXT, fit_error, fit_status, run_case
from sim.recording.metrics import Slo
from sim.recording.reclaims import reclaims_often, reclaims_per_s
from traces import LengthDist

DEFAULT_MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b",
                  "qwen2.5-72b", "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b",
                  "llama-3.1-70b")
DEFAULT_PROMPTS = (1024, 4096, 16384, 65536, 131072)
DEFAULT_TPS = (1, 2, 4, 8)
DEFAULT_MAP_CHUNKS = (2048, 8192, 32768)
OUTPUT_TOKENS = (128, 512)  # uniform, inclusive
# Per-cell work cap: long-prompt cells get fewer requests (prompt tokens per cell <= budget).
PROMPT_TOKEN_BUDGET = 1_600_000
MIN_REQUESTS = 48


@dataclass(frozen=True)
class MapQuery:
    gpu: str = "h200"
    models: tuple[str, ...] = DEFAULT_MODELS
    prompts: tuple[int, ...] = DEFAULT_PROMPTS
    tps: tuple[int, ...] = DEFAULT_TPS
    chunks: tuple[int, ...] = DEFAULT_MAP_CHUNKS
    num_requests: int = 200
    load: float = 1.5
    pays_pct: float = 5.0
    tie_pct: float = 1.0
    slo: Slo = field(default_factory=Slo)
    seed: int = 0
    # engine settings every case of the map runs with (EngineConfig's defaults)
    drain: str = EngineOptions.drain
    async_scheduling: bool = EngineOptions.async_scheduling
    mixed_split_mib: int = EngineOptions.mixed_split_mib


@dataclass(frozen=True)
class Cell:
    model: str
    prompt_tokens: int
    tp: int
    context_tokens: int  # the model's context: a longer request is beyond it
    status: str  # "ok", "does not fit" (memory), "invalid" (TP), "beyond context"
    reason: str = ""
    static_chunk: int | None = None
    static_goodput_req_s: float | None = None
    elastic_chunk: int | None = None
    elastic_goodput_req_s: float | None = None
    gain_pct: float | None = None
    pays: bool = False
    rate_per_s: float | None = None
    elastic_reclaims_per_s: float | None = None  # the elastic pick's (recording.reclaims)
    reclaims_often: bool = False  # so often that its own cost is least measured there


def cell_cases(query: MapQuery, model: str, prompt_tokens: int, tp: int) -> list[Case]:
    """Static and elastic cases of one cell (empty when the cell cannot run at all)."""
    if _longest(prompt_tokens) > get_model(model).max_position_embeddings:
        return []
    options = EngineOptions(max_model_len=_longest(prompt_tokens), drain=query.drain,
                            async_scheduling=query.async_scheduling,
                            mixed_split_mib=query.mixed_split_mib)
    probe = [Case(model, query.gpu, tp, c, "static", _trace(query, prompt_tokens, 1.0), 1.0,
                  options) for c in query.chunks]
    fitting = [c for c in probe if fit_error(c) is None]
    if not fitting:
        return []
    rate = stress_rate(fitting[-1], prompt_tokens, query.load)
    trace = _trace(query, prompt_tokens, rate)
    return [Case(model, query.gpu, tp, c, p, trace, 1.0, options, query.slo)
            for p in ("static", "elastic") for c in query.chunks]


def _longest(prompt_tokens: int) -> int:
    """The cell's longest request, its max_model_len."""
    return prompt_tokens + OUTPUT_TOKENS[1]


def num_requests_for(query: MapQuery, prompt_tokens: int) -> int:
    """``num_requests``, capped so a cell simulates at most PROMPT_TOKEN_BUDGET prompt tokens
    (but never fewer than MIN_REQUESTS requests)."""
    capped = max(MIN_REQUESTS, PROMPT_TOKEN_BUDGET // prompt_tokens)
    return min(query.num_requests, capped)


def _trace(query: MapQuery, prompt_tokens: int, rate_per_s: float) -> TraceSpec:
    spec = SyntheticSpec(num_requests_for(query, prompt_tokens), rate_per_s, LengthDist.fixed(prompt_tokens),
                         LengthDist.uniform(*OUTPUT_TOKENS), seed=query.seed)
    return TraceSpec(synthetic=spec)


def stress_rate(case: Case, prompt_tokens: int, load: float) -> float:
    """``load`` x the arrival rate whose requests in flight would just fill the static KV pool.

    A request holds prompt + half its output on average while decoding, so the pool holds
    ``concurrency = kv_tokens / (prompt + output/2)`` of them (at most max_num_seqs); each
    lives one prefill plus ``output`` decode steps of a batch that size; Little's law gives
    rate = concurrency / lifetime.
    """
    engine = case.engine()
    plan = plan_memory(engine.memory_config())
    cost = CostModel.for_engine(engine)
    output_mean = sum(OUTPUT_TOKENS) / 2
    held = prompt_tokens + output_mean / 2
    concurrency = max(1, min(engine.num_seqs, int(plan.kv_capacity_tokens // held)))
    decode_step_s = float(cost.decode_run_s(concurrency, int(concurrency * held), 1)[0])
    prefill_s = (cost.linear_s(cost.prefill_tokens(prompt_tokens))
                 + cost.prefill_attention_s(((prompt_tokens, 0),)))
    lifetime_s = prefill_s + output_mean * decode_step_s
    return load * concurrency / lifetime_s


@dataclass(frozen=True)
class FinishedCell:
    """One cell and its runs' rows, handed back as soon as its last run ends."""

    position: int  # in (model, prompt, tp) order
    cell: Cell
    rows: list[dict]


def run_map(query: MapQuery, executor: Executor | None = None) -> tuple[list[Cell], list[dict]]:
    """Cells in (model, prompt, tp) order, and every simulated row (for the table)."""
    return in_order(list(iter_cells(query, executor)))


def in_order(finished: Sequence[FinishedCell]) -> tuple[list[Cell], list[dict]]:
    """The cells in (model, prompt, tp) order, and their rows in the same order."""
    ordered = sorted(finished, key=lambda f: f.position)
    return [f.cell for f in ordered], [row for f in ordered for row in f.rows]


def num_cells(query: MapQuery) -> int:
    return len(query.models) * len(query.prompts) * len(query.tps)


def iter_cells(query: MapQuery, executor: Executor | None = None) -> Iterator[FinishedCell]:
    """Each cell as soon as all its runs have ended (cells that need no run first), so that
    a stopped map still holds every cell it finished. RuntimeError names a run that failed."""
    keys = list(itertools.product(query.models, query.prompts, query.tps))
    per_cell = [cell_cases(query, *key) for key in keys]
    for position, cases in enumerate(per_cell):
        if not cases:
            yield FinishedCell(position, _cell(query, keys[position], [], []), [])
    runs = [(position, case) for position, cases in enumerate(per_cell) for case in cases]
    starts = list(itertools.accumulate((len(cases) for cases in per_cell), initial=0))
    runs_left = [len(cases) for cases in per_cell]
    ended: dict[int, dict] = {}  # run index -> its row, until its cell is finished
    for outcome in iter_outcomes(run_case, [case for _, case in runs], executor or Executor(),
                                 label="map"):
        position, case = runs[outcome.index]
        if outcome.error is not None:
            raise RuntimeError(f"map: the run of {_run_label(case)} failed: {outcome.error}")
        ended[outcome.index] = outcome.value
        runs_left[position] -= 1
        if runs_left[position] == 0:
            cases = per_cell[position]
            rows = [ended.pop(starts[position] + i) for i in range(len(cases))]
            yield FinishedCell(position, _cell(query, keys[position], cases, rows), rows)


def _run_label(case: Case) -> str:
    return (f"{case.model} TP {case.tp}, {case.trace.prompt_label} prompts, {case.policy} "
            f"chunk {case.chunk}")


def _cell(query: MapQuery, key: tuple[str, int, int], cases: list[Case],
          rows: list[dict]) -> Cell:
    model, prompt_tokens, tp = key
    context = get_model(model).max_position_embeddings
    if not rows:
        return _unrun_cell(query, key, context)
    static = pick([r for r in rows if r["policy"] == "static"], query.tie_pct)
    elastic = pick([r for r in rows if r["policy"] == "elastic"], query.tie_pct)
    assert static is not None and elastic is not None  # both policies share the base plan
    base, value = static["goodput_req_s"], elastic["goodput_req_s"]
    gain = 100.0 * (value / base - 1.0) if base else None
    rate = cases[0].trace.synthetic.rate_per_s if cases[0].trace.synthetic else None
    return Cell(model, prompt_tokens, tp, context, "ok", "", static["chunk"], base,
                elastic["chunk"], value, gain, gain is not None and gain >= query.pays_pct,
                rate, reclaims_per_s(elastic),
                reclaims_often(elastic, bool(elastic.get("async_scheduling"))))


def _unrun_cell(query: MapQuery, key: tuple[str, int, int], context: int) -> Cell:
    """A cell with no run, and why: a TP degree that does not divide the heads first (the
    whole row at that TP), then a request past the model's context, then memory."""
    model, prompt_tokens, tp = key
    options = EngineOptions(max_model_len=_longest(prompt_tokens),
                            allow_long_max_model_len=True)  # the context is checked below
    case = Case(model, query.gpu, tp, min(query.chunks), "static",
                _trace(query, prompt_tokens, 1.0), 1.0, options)
    reason = fit_error(case) or ""
    status = fit_status(reason)
    if status != "invalid" and _longest(prompt_tokens) > context:
        status = BEYOND_CONTEXT
        reason = (f"prompt + output up to {_longest(prompt_tokens):,} tokens, past {model}'s "
                  f"context of {context:,} tokens (max_position_embeddings): vLLM refuses "
                  "that max_model_len")
    return Cell(model, prompt_tokens, tp, context, status, reason)


def cell_row(cell: Cell) -> dict:
    return dict(cell.__dict__)


def check_names(query: MapQuery) -> None:
    """Fail early on unknown model or GPU names (a typo should not read as 'does not fit')."""
    get_gpu(query.gpu)
    for model in query.models:
        get_model(model)
