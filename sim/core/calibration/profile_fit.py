"""Fit the cost model to a profile's step grid (`python -m gpu_backend profile`, or a refit of
its stored measurements), and the elastic transitions' costs to their timings.

The fit: the `sim.core.cost_model.FIT_PARAMETERS` fields of `Efficiency`, by
`fit.fit_efficiency` (scipy least squares) on the relative error of `CostModel.step(out)`
against the measured medians. Where the profile timed every prefill launch's attention alone,
the attention's own terms are fitted to those times first and held (`attention_fit`). A step
timed faster than its roofline at the datasheet peaks is left out and named
(`beyond_roofline`), and so is a step whose KV outgrew the profile's pool (`outgrew_pool`).

Weight streaming is pinned, not fitted: on one GPU every decode step reads the same weights,
so "weights at bandwidth x" and "a fixed cost per step" fit the grid equally well, and a fit
free to choose put the engine's kernel-launch overhead into the bandwidth (memory 0.40,
step overhead 0). That split matters the moment the weights change size, as under tensor
parallelism (TP=2 halves them, not the launches). So `memory` is the measured bandwidth of
a large device-to-device copy over the preset's HBM bandwidth, and the per-step terms take
the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np
from scipy.optimize import nnls

from sim.core.calibration.attention_fit import TRITON_ATTENTION_PARAMETERS, attention_start
from sim.core.calibration.fit import (
    fit_with_program_term,
    launch_terms,
    num_program_bound,
    split_run_terms_fixed,
    split_term_fixed,
)
from sim.core.catalog import get_gpu, get_model
from sim.core.cost_model import CostArgs, Efficiency, step_extents
from sim.core.efficiency import measured_gaps
from sim.core.split_shapes import TRITON_ATTENTION
from sim.core.step import SchedulerOutput


def fit_profile(cost_args: CostArgs, outputs: Sequence[SchedulerOutput], measured_s: np.ndarray,
                start: Efficiency | None = None, copy_bandwidth_bytes_s: float | None = None,
                token_graph_sizes: Sequence[int] = (), hold: Sequence[str] = (),
                outgrew: np.ndarray | None = None) -> tuple[Efficiency, dict]:
    """Least squares on relative error; returns (fitted Efficiency, error report).

    `token_graph_sizes`: the piecewise graphs' sizes the profile ran its eager steps at
    (CostModel prices the padded tokens); empty without piecewise graphs. `hold`: fitted
    parameters kept at `start`'s values (measured elsewhere). With `copy_bandwidth_bytes_s`,
    `memory` is held at that bandwidth over the GPU preset's (module docstring); without it,
    `memory` is fitted like the rest. `outgrew`: the steps `outgrew_pool` leaves out (none
    where None).
    """
    start, fixed = pinned_memory(cost_args, start or Efficiency(), tuple(hold),
                                 copy_bandwidth_bytes_s)
    beyond = beyond_roofline(cost_args, outputs, measured_s, token_graph_sizes)
    outgrew = np.zeros(len(outputs), dtype=bool) if outgrew is None else outgrew & ~beyond
    left = beyond | outgrew
    kept = [o for o, b in zip(outputs, left) if not b]
    kept_s = measured_s[~left]

    def times(eff: Efficiency, steps: Sequence[SchedulerOutput] = kept) -> np.ndarray:
        cost = cost_args.cost_model(eff, token_graph_sizes)
        return np.array([cost.step(o).total_s for o in steps])

    start, held = held_terms(cost_args, kept, kept_s, start, token_graph_sizes)
    before = times(start) / kept_s - 1.0
    fitted, _ = fit_with_program_term(
        start, lambda eff: times(eff) / kept_s - 1.0,
        lambda eff: num_program_bound(times(eff), times(replace(eff, attention_program=None))),
        (*fixed, *held), x_scale="jac")
    after = times(fitted) / kept_s - 1.0
    per_point = times(fitted, outputs) / measured_s - 1.0  # the steps left out included
    return fitted, fit_report(before, after, per_point, beyond, outgrew)


def pinned_memory(cost_args: CostArgs, start: Efficiency, fixed: tuple[str, ...],
                  copy_bandwidth_bytes_s: float | None) -> tuple[Efficiency, tuple[str, ...]]:
    """`start` and the terms `fixed`, with `memory` held at the copy bandwidth over the GPU
    preset's (at most 1) where the profile measured one (module docstring); unchanged
    without it."""
    if copy_bandwidth_bytes_s is None:
        return start, fixed
    gpu = cost_args[1]
    start = replace(start, memory=min(1.0, copy_bandwidth_bytes_s
                                      / gpu.memory_bandwidth_bytes_s))
    return start, (*fixed, "memory")


def fit_report(before: np.ndarray, after: np.ndarray, per_point: np.ndarray,
               beyond: np.ndarray, outgrew: np.ndarray) -> dict:
    """`fit_profile`'s error report: the relative errors of the steps fitted at the start
    (`before`) and after the fit (`after`), every grid point's after the fit (`per_point`, the
    ones left out included) and the positions of the steps left out (bool masks)."""
    return {
        "median_abs_rel": float(np.median(np.abs(after))),
        "max_abs_rel": float(np.max(np.abs(after))),
        "default_median_abs_rel": float(np.median(np.abs(before))),
        "default_max_abs_rel": float(np.max(np.abs(before))),
        "per_point_rel": [float(r) for r in per_point],
        "beyond_roofline": [int(i) for i in np.flatnonzero(beyond)],
        "outgrew_pool": [int(i) for i in np.flatnonzero(outgrew)],
    }


def outgrew_pool(setup: Mapping, outputs: Sequence[SchedulerOutput]) -> np.ndarray:
    """Which grid steps needed more KV blocks than the profile's pool (`setup`'s pool_blocks
    of block_size tokens) holds.

    The pool holds 60% of what the GPU had free, less than a replay's, and the grid's largest
    decodes (256 x 8,192 tokens of Llama-3.1-8B is 256 GiB) outgrow it several times, larger
    than the steps replays run. They are left out for two reasons, both measured on an H100.
    Laid round-robin (every profile before gpu_backend's shapes.pool_tables), rows a pool apart
    walk the same blocks together and the cache serves part of their KV: drawn at random
    instead, three of the eight such steps ran 10-15% longer on the device. And even read
    from memory, they stream KV faster than the long-context steps replays run: fitted with
    them, `kv_memory` came out 0.94-0.95 and decodes of 9-32 sequences over 2,000-30,000 keys
    (benchmarks/decode_gap.py --long, which no fit saw) were priced 5-7% short; without them,
    0.89 and 2-4%."""
    outgrew = np.zeros(len(outputs), dtype=bool)
    if not setup.get("pool_blocks"):
        return outgrew
    block = int(setup.get("block_size", 16))
    for i, out in enumerate(outputs):
        need = sum(-(-(item.num_computed_tokens + item.num_new_tokens) // block)
                   for item in out.scheduled)
        outgrew[i] = need > int(setup["pool_blocks"]) - 1
    return outgrew


def beyond_roofline(cost_args: CostArgs, outputs: Sequence[SchedulerOutput],
                    measured_s: np.ndarray, token_graph_sizes: Sequence[int] = ()) -> np.ndarray:
    """Which steps were measured faster than their roofline at the GPU's datasheet peaks:
    every GEMM, attention and logits kernel at peak compute or peak bandwidth, whichever
    binds, and no overhead. No step reads its bytes from memory that fast; a grid step whose KV
    outgrows the profile's pool reuses blocks, and where rows reuse them together (laid
    round-robin) the cache holds them, a speed no replay, whose KV fits its pool, sees. The
    fit leaves such steps out and says which."""
    peak = Efficiency(linear_compute=1.0, memory=1.0, kv_memory=1.0, attention_compute=1.0,
                      split_attention_compute=1.0, step_overhead_s=0.0, per_seq_overhead_s=0.0)
    cost = cost_args.cost_model(peak, token_graph_sizes)
    floor = np.array([c.linear_s + c.attention_s + c.logits_s
                      for c in (cost.step(o) for o in outputs)])
    return np.asarray(measured_s < floor, dtype=bool)


def held_terms(cost_args: CostArgs, outputs: Sequence[SchedulerOutput], measured_s: np.ndarray,
               start: Efficiency, token_graph_sizes: Sequence[int]
               ) -> tuple[Efficiency, tuple[str, ...]]:
    """`start` with usable launch terms, and the terms the grid cannot tell (fit.launch_terms,
    fit.split_term_fixed). The profile's decode steps run exact-size graphs; a step with
    prefill tokens runs the piecewise graphs where one holds it, else fully eager
    (CostModel.eager_step)."""
    eager = np.array([o.num_prefill_tokens > 0 for o in outputs], dtype=bool)
    cost = cost_args.cost_model(start, token_graph_sizes)
    _, piecewise = cost.eager_step_array(
        np.array([o.num_prefill_tokens + o.num_decode_tokens for o in outputs], dtype=np.int64))
    start, held = launch_terms(start, measured_s[eager & ~piecewise],
                               measured_s[eager & piecewise])
    num_split = sum(cost.splits(o.num_prefill_tokens + o.num_decode_tokens, len(o.scheduled),
                                *step_extents(o)) for o in outputs if o.num_prefill_tokens)
    num_split_run = sum(1 for o in outputs
                        if o.num_prefill_tokens and cost.split_chunks(o.prefill_chunks))
    return start, (*held, *split_term_fixed(num_split), *split_run_terms_fixed(num_split_run))


def grid_cost_args(data: Mapping) -> CostArgs:
    """What a calibration's grid steps are priced with (synchronously): its model, GPU,
    attention backend and the keys from which its mixed steps ran their decode rows apart
    (a profile without the record ran one launch: 0)."""
    apart = int((data.get("setup") or {}).get("mixed_split_min_keys") or 0)
    return CostArgs(get_model(data["model"]), get_gpu(data["gpu_preset"]), 1,
                    data.get("attention_backend", TRITON_ATTENTION), apart)


def refit_profile(data: dict, outputs: Sequence[SchedulerOutput],
                  attention: tuple[Sequence[SchedulerOutput], np.ndarray] | None,
                  copy_bandwidth_bytes_s: float | None = None,
                  program_from: tuple[str, dict] | None = None,
                  attention_from: tuple[str, dict] | None = None) -> dict:
    """Fit the cost model again to a calibration's stored measurements (no GPU needed).

    For when the cost model gains a term: the grid measured on the GPU stays valid, only the
    fitted efficiencies change. `outputs`: the steps of `data["measurements"]`; `attention`:
    those of its "attention_measurements" and their seconds (None where it has none).
    `memory` is pinned to `copy_bandwidth_bytes_s`, else to the calibration's own
    "copy_bandwidth_bytes_s", else fitted. `program_from`: (name, calibration) whose
    attention_program is held, not fitted (`program_term_of`); `attention_from`: one whose
    Triton kernel's attention terms are all held (`triton_terms_of`). Returns the calibration
    with new efficiency and errors, and its elastic transitions' costs fitted again to their
    stored points (`transition_costs`).
    """
    bandwidth = copy_bandwidth_bytes_s or data.get("copy_bandwidth_bytes_s")
    times = np.array([m["measured_s"] for m in data["measurements"]])
    cost_args = grid_cost_args(data)
    token_sizes = data.get("piecewise_sizes") or ()
    start, hold, provenance = borrowed_terms(data, program_from, attention_from)
    start, hold, attention_error = attention_start(cost_args, attention, start, hold)
    efficiency, fit_error = fit_profile(cost_args, outputs, times, start=start,
                                        copy_bandwidth_bytes_s=bandwidth,
                                        token_graph_sizes=token_sizes, hold=hold,
                                        outgrew=outgrew_pool(data.get("setup") or {}, outputs))
    efficiency = with_host_gap(efficiency, data["measurements"])
    cost = cost_args.cost_model(efficiency, token_sizes)
    measurements = [{**m, "predicted_s": cost.step(out).total_s}
                    for m, out in zip(data["measurements"], outputs)]
    errors = {"attention_fit_error": attention_error} if attention_error is not None else {}
    # a term held by an earlier refit is fitted now unless held again
    kept = {k: v for k, v in data.items() if k not in HELD_PROVENANCE}
    vmm = data.get("vmm")
    if isinstance(vmm, dict) and vmm.get("points"):  # the transitions' costs fitted again too
        kept["vmm"] = {**vmm, "costs": transition_costs(vmm["points"])}
    return {**kept, "efficiency": asdict(efficiency), "fit_error": fit_error,
            "copy_bandwidth_bytes_s": bandwidth, "measurements": measurements, **errors,
            **provenance}


def with_host_gap(efficiency: Efficiency, measurements: Sequence[Mapping]) -> Efficiency:
    """`efficiency` with the host gaps its grid measured (`measured_host_gap_s` where the grid
    timed the device span, `measured_decode_gap_s` where it timed steps launched ahead)."""
    return replace(efficiency, **measured_gaps(measurements))


# what a calibration records of terms a refit held at another calibration's (`borrowed_terms`)
HELD_PROVENANCE = ("attention_program_from", "attention_terms_from")


def borrowed_terms(data: dict, program_from: tuple[str, dict] | None,
                   attention_from: tuple[str, dict] | None
                   ) -> tuple[Efficiency, tuple[str, ...], dict]:
    """The fit's start, the terms it holds there and the provenance that says where they came
    from: `refit_profile`'s `program_from` or `attention_from` (not both), else nothing held."""
    if program_from is not None and attention_from is not None:
        raise ValueError("take attention_program from one calibration or every Triton "
                         "attention term from one (attention_from holds attention_program too)")
    if program_from is not None:
        source, other = program_from
        value = program_term_of(source, other, data)
        return (replace(Efficiency(), attention_program=value), ("attention_program",),
                {"attention_program_from": {"calibration": source, "model": other["model"],
                                            "attention_program": value}})
    if attention_from is not None:
        source, other = attention_from
        terms = triton_terms_of(source, other, data)
        return (replace(Efficiency(), **terms), TRITON_ATTENTION_PARAMETERS,
                {"attention_terms_from": {"calibration": source, "model": other["model"],
                                          "terms": terms}})
    return Efficiency(), (), {}


def triton_terms_of(source: str, other: dict, data: dict) -> dict[str, Any]:
    """The Triton kernel's attention terms (TRITON_ATTENTION_PARAMETERS) of calibration
    `other` (read from `source`), for `data`, a profile on the split or auto backend: there
    only the launches under SPLIT_MIN_QUERY new tokens run the Triton kernel, a few short
    ones, while a profile on the triton backend times the same kernel on every launch of its
    grid. Checked: the same GPU and model, `other` profiled on the triton backend with its
    attention launches timed alone (the terms fitted to them)."""
    backend = data.get("attention_backend", TRITON_ATTENTION)
    if backend not in ("split", "auto"):
        raise ValueError(f"the calibration to refit runs the {backend} attention backend: its "
                         "own launches tell the Triton kernel's terms (take them from another "
                         "profile only for the split or auto backend)")
    require_same(source, other, data, (("gpu_preset", "GPU"), ("model", "model")),
                 "the Triton kernel's terms")
    if other.get("attention_backend", TRITON_ATTENTION) != TRITON_ATTENTION:
        raise ValueError(f"{source}: profiled on the {other.get('attention_backend')} "
                         "attention backend; take the Triton kernel's terms from a profile on "
                         "the triton backend")
    if not other.get("attention_measurements"):
        raise ValueError(f"{source}: no attention launches timed alone, so its Triton terms "
                         "were fitted on whole steps; take them from a profile that timed them")
    efficiency = other.get("efficiency") or {}
    return {name: efficiency.get(name) for name in TRITON_ATTENTION_PARAMETERS}


def require_same(source: str, other: dict, data: dict, fields: Sequence[tuple[str, str]],
                 taking: str) -> None:
    """Refuse to take `taking` from calibration `other` (read from `source`) into `data`
    where they differ in one of `fields` ((key, what it is) pairs)."""
    for field, what in fields:
        if other.get(field) != data.get(field):
            raise ValueError(f"{source}: {what} {other.get(field)!r}, not {data.get(field)!r}; "
                             f"take {taking} from the same {what}")


def program_term_of(source: str, other: dict, data: dict) -> float:
    """The attention_program of calibration `other` (read from `source`), checked to fit
    `data`'s: the same GPU, a model of the same head_dim (the kernel's tile and its work per
    key), and the term fitted there."""
    require_same(source, other, data, (("gpu_preset", "GPU"),), "attention_program")
    mine, theirs = get_model(data["model"]), get_model(other["model"])
    if mine.head_dim != theirs.head_dim:
        raise ValueError(f"{source}: {theirs.name} has head_dim {theirs.head_dim}, "
                         f"{mine.name} {mine.head_dim}: its attention programs do other work "
                         "per key; take attention_program from a model of the same head_dim")
    value = (other.get("efficiency") or {}).get("attention_program")
    if value is None:
        raise ValueError(f"{source}: no fitted attention_program (its grid did not tell it); "
                         "take it from a profile whose grid did")
    return float(value)


# the least spread of freed bytes over a profile's transitions that fits a cost per cached GiB
# (VmmCosts.attach_cache_gib_s): at the 0.5-1.5 ms per GiB measured where the points spread
# over 1.3-1.5 GiB, a smaller spread moves an attach by less than one attach's timing noise
CACHE_SPREAD_MIN_GIB = 0.25


def transition_costs(points: list[dict]) -> dict[str, float]:
    """Non-negative least squares through the attach and detach medians: attach = fixed +
    handles x per_handle + cached GiB x per_cached_GiB, detach = fixed + handles x per_handle
    (VmmCosts' fields; the per-GiB terms of the reserve stay 0 at one handle size). The
    per-cached-GiB term is fitted only where the points' freed bytes spread over
    CACHE_SPREAD_MIN_GIB or more: a slope fitted over a few MiB is the attaches' noise, and
    the simulator would price it on every GiB of activations an attach hands back."""
    handles = np.array([p["handles"] for p in points], dtype=float)
    freed = np.array([p.get("freed_bytes", 0) for p in points], dtype=float) / 2**30
    costs: dict[str, float] = {"attach_cache_gib_s": 0.0}
    for kind in ("attach", "detach"):
        columns = [np.ones_like(handles), handles]
        if kind == "attach" and np.ptp(freed) >= CACHE_SPREAD_MIN_GIB:
            columns.append(freed)
        solution, _ = nnls(np.column_stack(columns), np.array([p[f"{kind}_s"] for p in points]))
        costs[f"{kind}_fixed_s"] = float(solution[0])
        costs[f"{kind}_handle_s"] = float(solution[1])
        costs[f"{kind}_gib_s"] = 0.0
        if len(solution) == 3:
            costs["attach_cache_gib_s"] = float(solution[2])
    return costs
