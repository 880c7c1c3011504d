"""Compare GPU replays with simulations of the same trace slice and configuration.

For every GPU run folder: rebuild its EngineConfig and trace slice, simulate it (one replica,
same scheduler, same memory-plan inputs), and put side by side the summary metrics, every
measured step's time against the cost model's price of the same composition, and the
step-by-step alignment of the two runs. Then fit the cost model on part of the measured
steps and report the error on the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sim.core.calibration.coverage import StepExtent, grid_extent
from sim.core.cost_model import FIT_PARAMETERS, CostModel, Efficiency, host_slower, slower
from sim.core.elastic import VmmCosts
from sim.core.memory_plan import ActivationProfile
from sim.runner import RunResult, RunSpec
from validation.attribution import tpot_attribution, ttft_attribution
from validation.calibrate import (
    DEFAULT_HOLDOUT_FRACTION,
    FitResult,
    calibrate,
    concat,
    fit_pricing,
    split_tail,
    usable_steps,
)
from validation.compare import (
    RunPair,
    check_targets,
    compare_metrics,
    gains,
    machine_starts,
    mark_replayed_apart,
    metric_values,
)
from validation.divergence import Divergence, find_divergence
from validation.runs import GpuRun, TraceSlice, engine_config, trace_slice
from validation.simside import simulate_logged
from validation.step_table import StepTable
from validation.steps import (
    apart_steps,
    error_stats,
    predict_step_times,
    relative_errors,
    step_classes,
)

Log = Callable[[str], None]

# The held-out fit frees every fitted term but weight streaming, which stays at the
# calibration's value, as the profile holds it at the measured copy bandwidth: a replay's steps
# do not separate a lower bandwidth from a larger fixed cost per step (both price every step
# alike), so freeing both leaves a fit whose values depend on the numerics library's rounding.
HELD_OUT_FREE = tuple(name for name, _, _ in FIT_PARAMETERS if name != "memory")


@dataclass
class RunComparison:
    gpu: GpuRun
    sim: RunResult
    sim_steps: StepTable
    trace_slice: TraceSlice
    arrival_s: np.ndarray
    metrics: dict[str, dict]
    step_predicted_s: np.ndarray  # cost model on each measured step's composition
    step_error: dict[str, dict]  # error_stats: all, prefill (with prefill tokens), decode-only
    step_classes: list[dict]  # steps.step_classes: time and error per class of step
    tpot_attribution: dict | None  # attribution.tpot_attribution: TPOT error per class
    ttft_attribution: dict | None  # attribution.ttft_attribution: TTFT error per class
    divergence: Divergence
    # predicted metrics when every step takes SENSITIVITY_FACTOR times as long, relative to
    # the prediction: how much a metric amplifies a step-time error (None: not computed)
    sensitivity: dict[str, float | None] | None = None
    # the same with the host terms HOST_SENSITIVITY_FACTOR times as long (sim.core.cost_model.host_slower)
    host_sensitivity: dict[str, float | None] | None = None

    @property
    def label(self) -> str:
        return self.gpu.label

    def pair(self) -> RunPair:
        return RunPair(self.gpu.policy, self.gpu.chunk,
                       {k: v["predicted"] for k, v in self.metrics.items()},
                       {k: v["measured"] for k, v in self.metrics.items()})


@dataclass
class Validation:
    runs: list[RunComparison]
    efficiency: Efficiency
    calibration_source: str
    targets: list[dict] = field(default_factory=list)
    gains: list[dict] = field(default_factory=list)
    fit: FitResult | None = None
    fit_note: str = ""
    refit_runs: list[RunComparison] = field(default_factory=list)
    refit_targets: list[dict] = field(default_factory=list)
    vmm_costs: VmmCosts | None = None  # the calibration's transition costs, if it has them
    calibration_versions: dict | None = None  # the calibration's GPU-side versions, if any
    repeats: list[dict] = field(default_factory=list)  # repeats.repeat_rows: the same replays again
    profile_host_probe: dict | None = None  # the calibration's host speed (hostprobe.summarize)
    grid_extent: StepExtent | None = None  # the calibration's largest grid steps (coverage)

    def describe_calibration(self, data: dict) -> None:
        """Take what the report tells of the calibration file `data` beside its efficiencies:
        its profile's versions, its host's speed and how far its grid reached."""
        self.calibration_versions = data.get("versions")
        self.profile_host_probe = data.get("host_probe")
        self.grid_extent = grid_extent(data, self.calibration_source)


SENSITIVITY_FACTOR = 1.02
HOST_SENSITIVITY_FACTOR = 1.5  # a host half again as slow (one H200 host's swung up to 2x)
SENSITIVITY_METRICS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "throughput_tok_s")


def compare_run(gpu: GpuRun, efficiency: Efficiency | None, profile: ActivationProfile | None,
                slice_override: TraceSlice | None = None, gpu_name: str | None = None,
                vmm_costs: VmmCosts | None = None, sensitivity: bool = True) -> RunComparison:
    config = engine_config(gpu.summary, gpu_name)
    ts = trace_slice(gpu.summary, slice_override)
    trace = ts.load()
    spec = RunSpec(config, efficiency=efficiency, profile=profile, vmm_costs=vmm_costs)
    result, recorder = simulate_logged(spec, trace)
    predicted = metric_values(result.summary)
    measured = metric_values(gpu.summary, gpu.measured_kv_capacity_tokens())
    cost = CostModel.for_engine(config, efficiency)
    step_predicted = predict_step_times(cost, gpu.steps)
    apart = apart_steps(cost, gpu.steps)  # mixed steps whose decode rows ran apart
    sim_steps = recorder.table()
    moved = host_moved = None
    if sensitivity:
        def moves(eff: Efficiency) -> dict[str, float | None]:
            spec = RunSpec(config, efficiency=eff, profile=profile, vmm_costs=vmm_costs)
            values = metric_values(simulate_logged(spec, trace)[0].summary)
            return {k: (values[k] / predicted[k] - 1.0
                        if predicted[k] and values[k] is not None else None)
                    for k in SENSITIVITY_METRICS}

        moved = moves(slower(efficiency or Efficiency(), SENSITIVITY_FACTOR))
        host_moved = moves(host_slower(efficiency or Efficiency(), HOST_SENSITIVITY_FACTOR))
    return RunComparison(
        gpu=gpu, sim=result, sim_steps=sim_steps, trace_slice=ts, arrival_s=trace.arrival_s,
        metrics=compare_metrics(predicted, measured), step_predicted_s=step_predicted,
        step_error=step_error_breakdown(step_predicted, gpu.steps),
        step_classes=step_classes(step_predicted, gpu.steps, apart),
        tpot_attribution=tpot_attribution(gpu.steps, gpu.requests, step_predicted, apart),
        ttft_attribution=ttft_attribution(gpu.steps, gpu.requests, step_predicted, apart),
        divergence=find_divergence(sim_steps, gpu.steps, trace.arrival_s), sensitivity=moved,
        host_sensitivity=host_moved,
    )


def step_error_breakdown(predicted: np.ndarray, measured: StepTable) -> dict[str, dict]:
    errors = relative_errors(predicted, measured.duration_s)
    ran = measured.num_tokens > 0
    return {
        "all": error_stats(errors[ran]),
        "with_prefill": error_stats(errors[ran & measured.has_prefill]),
        "decode_only": error_stats(errors[ran & ~measured.has_prefill]),
    }


def validate(gpu_runs: Sequence[GpuRun], efficiency: Efficiency | None,
             profile: ActivationProfile | None, calibration_source: str, *,
             slice_override: TraceSlice | None = None, gpu_name: str | None = None,
             holdout_fraction: float = DEFAULT_HOLDOUT_FRACTION, fit: bool = True,
             resimulate_fitted: bool = False, vmm_costs: VmmCosts | None = None,
             replayed_apart: Sequence[str] = (), log: Log = print) -> Validation:
    """Simulate each GPU run's configuration and compare; `replayed_apart`: the run folders a
    slice replayed on another start of the machine (its slice.json), beside the starts the
    replays recorded (compare.mark_replayed_apart)."""
    runs = []
    for gpu in gpu_runs:
        log(f"simulating {gpu.label} ({gpu.path.name}) ...")
        runs.append(compare_run(gpu, efficiency, profile, slice_override, gpu_name, vmm_costs))
    result = Validation(runs, efficiency or Efficiency(), calibration_source,
                        vmm_costs=vmm_costs)
    result.targets = check_targets([r.metrics for r in runs])
    result.gains = gains([r.pair() for r in runs])
    mark_replayed_apart(result.gains, replayed_apart, machine_starts(gpu_runs))
    if fit:
        result.fit, result.fit_note = fit_on_runs(runs, result.efficiency, holdout_fraction)
    if resimulate_fitted and result.fit is not None:
        for gpu in gpu_runs:
            log(f"re-simulating {gpu.label} with the fitted efficiency ...")
            result.refit_runs.append(compare_run(gpu, result.fit.efficiency, profile,
                                                 slice_override, gpu_name, vmm_costs))
        result.refit_targets = check_targets([r.metrics for r in result.refit_runs])
    return result


def fit_on_runs(runs: Sequence[RunComparison], initial: Efficiency,
                holdout_fraction: float) -> tuple[FitResult | None, str]:
    """Fit on the first part of every run's measured steps; test on the rest of each."""
    try:
        cost_args, token_sizes = fit_pricing([r.sim.spec.engine for r in runs])
    except ValueError as exc:
        return None, f"not fitted: {exc}; fit each with `python -m validation fit`"
    splits = [split_tail(usable_steps(r.gpu.steps), holdout_fraction) for r in runs]
    fit_table = concat([s[0] for s in splits])
    holdout_table = concat([s[1] for s in splits])
    try:
        fitted = calibrate(cost_args, fit_table, holdout_table, initial,
                           free=HELD_OUT_FREE, token_graph_sizes=token_sizes)
    except ValueError as exc:
        return None, f"not fitted: {exc}"
    note = (f"fitted on the first {1 - holdout_fraction:.0%} of each run's steps "
            f"({fitted.num_fit_steps} steps); errors below are on the last "
            f"{holdout_fraction:.0%} ({fitted.num_holdout_steps} steps), never seen by the fit")
    return fitted, note
