"""Fit the cost model's efficiencies to measured step times, judged on held-out steps only.

The fit minimises the relative error of `predict_step_times` against `measured_s` over the
fit steps with `scipy.optimize.least_squares` (soft-L1 loss, so a few outliers such as a
first-step warm-up do not steer it), through `sim.core.calibration.fit_efficiency`. The
`Efficiency` fields in `sim.core.cost_model.FIT_PARAMETERS` are free; interconnect and all-reduce
latency stay as given (a TP-1 run cannot see them). Held out by default: the
second half of every run's steps, so the report's error is on steps the fit never saw.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from sim.core.calibration import (
    Calibration,
    EngineKind,
    Provenance,
    carried_to,
    choose_calibration,
    engine_kinds_of,
    fit_with_program_term,
    given_calibration,
    invoked_command,
    launch_terms,
    num_program_bound,
    save_calibration,
    split_run_terms_fixed,
    split_term_fixed,
)
from sim.core.cost_model import FIT_PARAMETERS, CostArgs, Efficiency
from sim.core.elastic import VmmCosts
from sim.core.engine_config import EngineConfig
from sim.core.memory_plan import ActivationProfile
from validation.runs import GpuRun, engine_config
from validation.step_table import StepTable
from validation.steps import (
    attention_terms,
    error_stats,
    predict_step_times,
    relative_errors,
    split_attention,
)

DEFAULT_HOLDOUT_FRACTION = 0.5


@dataclass(frozen=True)
class FitResult:
    efficiency: Efficiency
    initial: Efficiency
    num_fit_steps: int
    num_holdout_steps: int
    fit_error: dict  # error_stats on the fit steps, fitted efficiency
    holdout_before: dict  # error_stats on the held-out steps, initial efficiency
    holdout_after: dict  # error_stats on the held-out steps, fitted efficiency
    success: bool
    message: str
    token_graph_sizes: tuple[int, ...] = ()  # the piecewise graph sizes the steps were priced at

    def to_dict(self) -> dict:
        data = asdict(self)
        data["efficiency"] = asdict(self.efficiency)
        data["initial"] = asdict(self.initial)
        return data


def usable_steps(table: StepTable) -> StepTable:
    """Steps that computed tokens and have a positive measured time."""
    return table.take((table.num_tokens > 0) & (table.duration_s > 0))


def split_tail(table: StepTable, holdout_fraction: float) -> tuple[StepTable, StepTable]:
    """(first 1 - fraction of the steps, the rest): fit on the past, test on the future."""
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"holdout fraction must be in (0, 1), got {holdout_fraction}")
    cut = int(round(len(table) * (1.0 - holdout_fraction)))
    return table.take(slice(0, cut)), table.take(slice(cut, None))


def concat(tables: list[StepTable]) -> StepTable:
    first = tables[0]
    arrays: dict[str, np.ndarray | None] = {name: np.concatenate([getattr(t, name) for t in tables])
              for name in ("num_prefill_tokens", "num_decode_tokens", "decode_context_tokens",
                           "num_seqs", "num_sampled_rows", "prefill_pairs", "duration_s")}
    for name in ("max_query_len", "max_seq_len", "prefill_chunks"):  # known where all know them
        parts = [getattr(t, name) for t in tables]
        arrays[name] = None if any(p is None for p in parts) else np.concatenate(parts)
    common = set.intersection(*(set(t.extra) for t in tables))
    extra = {k: np.concatenate([t.extra[k] for t in tables]) for k in sorted(common)}
    return replace(first, **arrays, chunks_exact=all(t.chunks_exact for t in tables), extra=extra)


def step_errors(args: CostArgs, eff: Efficiency, table: StepTable,
                token_graph_sizes: Sequence[int] = ()) -> np.ndarray:
    cost = args.cost_model(eff, token_graph_sizes)
    return relative_errors(predict_step_times(cost, table), table.duration_s)


def pooled_token_sizes(sizes_per_run: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
    """One list of piecewise graph sizes that prices the steps pooled from several replays
    as each replay padded them, or None when there is none.

    A replay captures sizes up to its chunk (`piecewise_capture_sizes`), and none of its
    steps is longer. A chunk on the capture grid (2048 beside 8192) has a prefix of a larger
    chunk's sizes, so the longest list pads every step to the same size as its own replay's
    did. Replays without piecewise graphs pool only with replays without them.
    """
    runs = [tuple(sorted(sizes)) for sizes in sizes_per_run]
    longest = max(runs, key=len, default=())
    if all(sizes == longest[:len(sizes)] and bool(sizes) == bool(longest) for sizes in runs):
        return longest
    return None


def fit_pricing(engines: Sequence[EngineConfig]) -> tuple[CostArgs, tuple[int, ...]]:
    """What one fit prices the steps of runs on these engines with: their one
    `CostArgs.for_engine` (model, GPU, TP size, attention backend, mixed split, decode graph
    sizes, async scheduling) and their pooled piecewise graph sizes (`pooled_token_sizes`).

    A fit prices every step with one cost model, so runs that differ in any of those cannot be
    fitted together: ValueError naming what differs and how."""
    args = [CostArgs.for_engine(engine) for engine in engines]
    differ = [name for name in CostArgs._fields
              if any(getattr(a, name) != getattr(args[0], name) for a in args[1:])]
    if differ:
        shown = "; ".join(f"{name}: " + ", ".join(sorted({_shown(getattr(a, name)) for a in args}))
                          for name in differ)
        raise ValueError(f"the runs' engines differ ({shown}); fit the runs of one engine at "
                         "a time")
    token_sizes = pooled_token_sizes([engine.piecewise_graph_sizes for engine in engines])
    if token_sizes is None:
        raise ValueError("the runs' piecewise graph sizes differ beyond their chunks (or some "
                         "ran without them); fit the runs of one chunk at a time")
    return args[0], token_sizes


def _shown(value: object) -> str:
    """A CostArgs field as an error names it: a model or GPU by its name."""
    return str(getattr(value, "name", value))


def fit_efficiency(args: CostArgs, fit: StepTable, initial: Efficiency | None = None,
                   free: Collection[str] | None = None,
                   token_graph_sizes: Sequence[int] = ()) -> tuple[Efficiency, bool, str]:
    """Least-squares efficiencies for the steps in `fit` (relative error, soft-L1 loss).
    `args`: the engine the steps ran on (`CostArgs.for_engine`); `token_graph_sizes`: its
    piecewise graph sizes (CostModel). `free`: the FIT_PARAMETERS to fit (default all); the
    others keep `initial`'s values."""
    initial = initial or Efficiency()
    names = [name for name, _, _ in FIT_PARAMETERS]
    free = names if free is None else list(free)
    unknown = sorted(set(free) - set(names))
    if unknown or not free:
        raise ValueError(f"cannot fit {unknown or 'no parameter'}: choose from {names}")
    fit = usable_steps(fit)
    if len(fit) < len(free):
        raise ValueError(f"{len(fit)} usable steps cannot fit {len(free)} parameters")
    held = [n for n in names if n not in free]
    # steps that run no decode graph: piecewise graphs where a size holds them, else eager
    cost = args.cost_model(initial, token_graph_sizes)
    ran = fit.num_tokens > 0
    eager = ran & (fit.has_prefill | cost.decode_rows_array(fit.num_tokens)[1])
    piecewise = eager & cost.eager_step_array(fit.num_tokens)[1]
    started, idle = launch_terms(initial, fit.duration_s[eager & ~piecewise],
                                 fit.duration_s[piecewise])
    initial = replace(initial, **{n: getattr(started, n) for n in (
        "eager_launch_s", "piecewise_launch_s") if n in free})  # a held term keeps its value
    held += [n for n in idle if n in free]
    def num_bound(eff: Efficiency) -> int:  # steps whose longest attention program binds
        def times(e: Efficiency) -> np.ndarray:
            return predict_step_times(args.cost_model(e, token_graph_sizes), fit)
        return num_program_bound(times(eff), times(replace(eff, attention_program=None)))

    _, _, splits = attention_terms(cost, fit)  # splits need no efficiency
    if "split_launch_s" in free:  # held where too few steps split to fit it
        held += split_term_fixed(int((splits > 1).sum()))
    split = split_attention(cost, fit)  # SPLIT's terms held where too few steps run it
    held += [n for n in split_run_terms_fixed(0 if split is None else int(np.isfinite(split).sum()))
             if n in free]
    fitted, solution = fit_with_program_term(
        initial, lambda eff: step_errors(args, eff, fit, token_graph_sizes),
        num_bound, fixed=held,
        loss="soft_l1", f_scale=0.05, diff_step=1e-3, x_scale=1.0)
    return fitted, bool(solution.success), str(solution.message)


def calibrate(args: CostArgs, fit: StepTable, holdout: StepTable,
              initial: Efficiency | None = None, free: Collection[str] | None = None,
              token_graph_sizes: Sequence[int] = ()) -> FitResult:
    """Fit on `fit` (the `free` parameters, default all), then report the error on
    `holdout` before and after (`fit_efficiency`'s arguments)."""
    initial = initial or Efficiency()
    fitted, success, message = fit_efficiency(args, fit, initial, free, token_graph_sizes)
    fit, holdout = usable_steps(fit), usable_steps(holdout)

    def errors(eff: Efficiency, table: StepTable) -> dict:
        return error_stats(step_errors(args, eff, table, token_graph_sizes))

    return FitResult(
        efficiency=fitted, initial=initial, num_fit_steps=len(fit),
        num_holdout_steps=len(holdout), fit_error=errors(fitted, fit),
        holdout_before=errors(initial, holdout), holdout_after=errors(fitted, holdout),
        success=success, message=message, token_graph_sizes=tuple(sorted(token_graph_sizes)),
    )


def write_calibration(path: Path, result: FitResult, profile: ActivationProfile | None,
                      fit_record: dict, vmm_costs: VmmCosts | None = None,
                      engine: EngineKind | None = None) -> None:
    """A calibration that `python -m sim --calibration FILE` loads; the starting
    calibration's activation profile and measured VMM costs are carried over. Fitted on
    replays with piecewise graphs, it says so as a profile taken with them does
    ("piecewise_sizes"), so validation pairs it with such replays only. `fit_record`: what
    the fit was made from ("fit"); `engine`: the replays' engine kind (default: piecewise
    where the steps were priced at piecewise sizes, else eager)."""
    sizes = list(result.token_graph_sizes) or None
    data: dict = {"efficiency": asdict(result.efficiency), "piecewise_sizes": sizes}
    if profile is not None:
        data["activation"] = asdict(profile)
    if vmm_costs is not None:
        data["vmm"] = {"costs": asdict(vmm_costs), "source": "the starting calibration"}
    data["fit"] = {**fit_record, "num_fit_steps": result.num_fit_steps,
                   "num_holdout_steps": result.num_holdout_steps,
                   "holdout_before": result.holdout_before, "holdout_after": result.holdout_after}
    data["provenance"] = Provenance(
        model=fit_record.get("model"), gpu_preset=fit_record.get("gpu"),
        engine=engine or EngineKind(bool(sizes)), command=invoked_command(),
        derived_from=f"fitted on the replays in {fit_record.get('gpu_dir', 'unrecorded runs')}",
    ).to_dict()
    save_calibration(path, data)


def shared_pair(configs: Sequence) -> tuple[str, str] | None:
    """The (model, GPU) names every one of `configs` (EngineConfigs) runs; None where they
    run several."""
    pairs = {(c.model.name, c.gpu.name) for c in configs}
    return pairs.pop() if len(pairs) == 1 else None


def carried_for(calibration: Calibration | None,
                runs: Sequence[GpuRun]) -> Calibration | None:
    """`calibration` carried to the model and GPU `runs` replayed, as `python -m sim` carries
    a calibration of another model or GPU (sim.core.calibration.carried_to); as it is where
    the runs are of several."""
    pair = shared_pair([engine_config(r.summary) for r in runs])
    return calibration if calibration is None or pair is None else carried_to(calibration, *pair)


def replay_calibration(choice: str | Path | None, runs: Sequence[GpuRun],
                       gpu_name: str | None = None) -> Calibration | None:
    """What prices the simulations of `runs` given `--calibration choice`
    (sim.core.calibration.choose_calibration): without one, the calibration shipped for the
    runs' model, GPU and engine kind, where they share them; 'none': the roofline; a file,
    carried to the runs' model and GPU where they share them."""
    configs = [engine_config(r.summary, gpu_name) for r in runs]
    pair = shared_pair(configs)
    if pair is None:  # no one model and GPU: nothing ships or carries
        return None if choice is None else given_calibration(choice)
    return choose_calibration(choice, *pair, engine_kinds_of(configs),
                              attention_backend=configs[0].attention_backend)
