"""Fit the attention's own terms to a profile's attention launches timed alone.

A whole step's time holds its linear layers and its attention; a fit of whole steps alone
cannot tell them apart where both grow with the chunk, and on the H200 it did not: with
Llama-3.1-8B's profile the Mooncake replays' chunk-2,048 steps, their attention timed alone
(benchmarks/replay_attention.py), ran 23-45% over the fitted attention while the whole steps
came out within 7%, the linear layers priced long by as much. So `python -m gpu_backend
profile` also times one layer's attention launch of every grid step with prefill tokens
(gpu_backend.engine.attention_profile); the attention's terms are fitted to those times first
and the whole-step fit (`profile_fit`) holds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from scipy.optimize import minimize_scalar

from sim.core.calibration.fit import (
    fit_with_program_term,
    num_program_bound,
    split_run_terms_fixed,
)
from sim.core.cost_model import FIT_PARAMETERS, CostArgs, Efficiency
from sim.core.efficiency import SPLIT_PARAMETERS
from sim.core.step import SchedulerOutput

# What one launch's attention time tells: its work rate, the speed of one program (the
# longest binds a chunk beside long decode rows) and how much of the shorter of the two the
# longer does not hide (CostModel.launch_attention_s); on the split and auto backends also
# SPLIT's rate and its cost per call.
TRITON_ATTENTION_PARAMETERS = ("attention_compute", "attention_program",
                               "attention_program_serial", "attention_query_s",
                               "mixed_decode_compute")
ATTENTION_PARAMETERS = (*TRITON_ATTENTION_PARAMETERS, *SPLIT_PARAMETERS)


def fit_attention_terms(cost_args: CostArgs, outputs: Sequence[SchedulerOutput],
                        measured_s: np.ndarray, start: Efficiency | None = None,
                        hold: Sequence[str] = ()) -> tuple[Efficiency, dict]:
    """`start` with ATTENTION_PARAMETERS fitted to the attention times `measured_s` of the
    steps `outputs` (CostModel.step's attention_s against them, least squares on relative
    error; the program's terms only where the steps tell them, `fit_with_program_term`), and
    the fit's errors and the launch's fixed device time fitted beside them (`launch_floor_s`,
    not a cost-model term). `hold`: terms kept at `start`'s values (attention_program taken
    from another profile, `python -m gpu_backend refit --program-from`)."""
    start = start or Efficiency()
    measured_s = np.asarray(measured_s, dtype=np.float64)
    if len(outputs) != len(measured_s) or not len(outputs):
        raise ValueError(f"{len(measured_s)} attention times for {len(outputs)} shapes")

    def times(eff: Efficiency) -> np.ndarray:
        cost = cost_args.cost_model(eff)
        return np.array([cost.step(o).attention_s for o in outputs])

    def num_bound(eff: Efficiency) -> int:
        return num_program_bound(times(eff), times(replace(eff, attention_program=None)))

    fixed = (*(name for name, _, _ in FIT_PARAMETERS if name not in ATTENTION_PARAMETERS),
             *hold, *held_attention_terms(cost_args, outputs))

    def fit_at(floor: float) -> tuple[Efficiency, np.ndarray]:
        fitted, _ = fit_with_program_term(
            start, lambda e: (times(e) + floor) / measured_s - 1.0, num_bound, fixed,
            x_scale="jac")
        return fitted, (times(fitted) + floor) / measured_s - 1.0

    # A launch's fixed device time (kernel start, the combine, over all layers): the whole-step
    # fit prices it in its per-step terms; fitted here beside the rates, or the smallest
    # launches (16-token prefills: a few us of work, tens of us timed) would set them.
    best = minimize_scalar(lambda floor: float(np.sum(fit_at(floor)[1] ** 2)),
                           bounds=(0.0, float(measured_s.min())), method="bounded",
                           options={"xatol": 1e-4 * float(measured_s.min())})
    floor = float(best.x)
    fitted, after = fit_at(floor)
    return fitted, {"median_abs_rel": float(np.median(np.abs(after))),
                    "max_abs_rel": float(np.max(np.abs(after))),
                    "launch_floor_s": floor, "per_point_rel": [float(r) for r in after]}


def held_attention_terms(cost_args: CostArgs, outputs: Sequence[SchedulerOutput]
                         ) -> tuple[str, ...]:
    """The attention terms `outputs` cannot tell: SPLIT's where too few steps run SPLIT, the
    Triton kernel's where no step with prefill tokens runs it (the split backend's), the
    decode rows' rate beside a chunk where no step runs them there."""
    cost = cost_args.cost_model(Efficiency())
    split = [cost.split_chunks(o.prefill_chunks) for o in outputs if o.num_prefill_tokens]
    triton = sum(1 for parts in split if parts is None or parts[1])
    # where every step with prefill tokens runs its decode rows apart (flashinfer), none
    # prices decode rows beside a chunk
    beside = any(o.num_prefill_tokens and o.decode_context_tokens
                 and not cost.runs_apart(o.decode_context_tokens) for o in outputs)
    return (*split_run_terms_fixed(sum(1 for parts in split if parts is not None)),
            *(TRITON_ATTENTION_PARAMETERS if not triton else ()),
            *(("mixed_decode_compute",) if triton and not beside else ()))


def attention_start(cost_args: CostArgs,
                    attention: tuple[Sequence[SchedulerOutput], np.ndarray] | None,
                    start: Efficiency, hold: tuple[str, ...]
                    ) -> tuple[Efficiency, tuple[str, ...], dict | None]:
    """The whole-step fit's start and held terms: with a profile's attention timed alone
    (`attention`: the steps and their seconds), `start` with the attention's own terms fitted
    to it (those in `hold` kept) and held from then on, and that fit's errors; without, as
    given, with the terms only launches timed alone tell (a query token's share and the
    decode rows' rate beside a chunk) held at theirs."""
    if attention is None:
        return start, (*hold, "attention_query_s", "mixed_decode_compute"), None
    # each launch was timed alone (attention_profile.launch_ms): on the Triton kernel as one
    # launch, decode rows and chunks together, whatever the engine's mixed split; flashinfer
    # runs its decode rows apart in any case (CostModel.apart_min_keys)
    single = cost_args._replace(mixed_split_min_keys=0)
    fitted, error = fit_attention_terms(single, *attention, start=start, hold=hold)
    return fitted, (*hold, *ATTENTION_PARAMETERS), error
