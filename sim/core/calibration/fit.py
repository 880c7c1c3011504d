"""Fit the cost model's efficiencies to measured step times (scipy least squares).

Both the GPU engine's `profile` (a synthetic step grid, `profile_fit`) and `validation`
(replayed steps) fit the `FIT_PARAMETERS` of `sim.core.cost_model.Efficiency`; they differ only
in which steps they price and in the loss they choose, so the parameter handling lives here once.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

import numpy as np
from scipy.optimize import OptimizeResult, least_squares

from sim.core.cost_model import FIT_PARAMETERS, Efficiency
from sim.core.efficiency import SPLIT_PARAMETERS

# Fewer steps than this that launch one way (fully eager, or through piecewise graphs): a
# fit holds that launch term at its start. A profile without a cap still runs its largest
# grid step (16,384 tokens, past the 8,192-token chunk's graphs) fully eager; that one
# device-bound step says nothing about the launch time.
MIN_LAUNCH_STEPS = 3


def fit_efficiency(start: Efficiency, relative_errors: Callable[[Efficiency], np.ndarray],
                   fixed: Collection[str] = (),
                   **least_squares_options) -> tuple[Efficiency, OptimizeResult]:
    """Efficiency minimising `relative_errors(eff)` within each parameter's bounds.

    Parameters are scaled by their typical unit, so the optimiser sees numbers of order one;
    the start is nudged strictly inside the bounds. `fixed` names FIT_PARAMETERS held at
    their start value (measured elsewhere, or not identifiable from these steps). Options go
    to `scipy.optimize.least_squares`.
    """
    unknown = set(fixed) - {name for name, _, _ in FIT_PARAMETERS}
    if unknown:
        raise ValueError(f"cannot hold {sorted(unknown)} fixed: not fitted parameters")
    if "mixed_decode_compute" not in fixed and start.mixed_decode_compute is None:
        # unset prices at attention_compute: a fit of it starts there
        start = replace(start, mixed_decode_compute=start.attention_compute)
    params = [p for p in FIT_PARAMETERS if p[0] not in fixed]
    units = np.array([unit for _, _, unit in params])
    lower = np.array([bounds[0] for _, bounds, _ in params]) / units
    upper = np.array([bounds[1] for _, bounds, _ in params]) / units
    x0 = np.array([getattr(start, name) for name, _, _ in params]) / units
    inset = 1e-6 * (upper - lower)
    x0 = np.clip(x0, lower + inset, upper - inset)

    def efficiency(x: np.ndarray) -> Efficiency:
        return replace(start, **{name: float(v) * unit
                                 for (name, _, unit), v in zip(params, x)})

    solution = least_squares(lambda x: relative_errors(efficiency(x)), x0,
                             bounds=(lower, upper), **least_squares_options)
    return efficiency(solution.x), solution


# Fewer steps than this whose attention splits its keys (CostModel.splits): split_launch_s is
# held at its start, not fitted (one such step, as in a Llama-3.1-8B profile grid, would set it
# to whatever that step's noise needs).
MIN_SPLIT_STEPS = 3


def split_term_fixed(num_split_steps: int) -> tuple[str, ...]:
    """("split_launch_s",) when too few steps split their attention to fit it, else ()."""
    return ("split_launch_s",) if num_split_steps < MIN_SPLIT_STEPS else ()


# Fewer steps than this that run SPLIT (OperatorCosts.split_chunks): SPLIT's terms are held
# at their start (defaults from one H200's measurement), not fitted.
MIN_SPLIT_RUN_STEPS = 3


def split_run_terms_fixed(num_split_run_steps: int) -> tuple[str, ...]:
    """SPLIT_PARAMETERS when too few steps run SPLIT to fit them, else ()."""
    return SPLIT_PARAMETERS if num_split_run_steps < MIN_SPLIT_RUN_STEPS else ()


def launch_terms(start: Efficiency, eager_s: np.ndarray,
                 piecewise_s: np.ndarray) -> tuple[Efficiency, tuple[str, ...]]:
    """`start` with usable launch terms, and the launch terms a fit must hold, for steps of
    which the fully eager ones took `eager_s` and the piecewise-graph ones `piecewise_s`
    (seconds; CostModel.eager_step tells them apart).

    A term that fewer than MIN_LAUNCH_STEPS steps launch with is held at its start: a profile
    whose piecewise graphs reach the chunk times one fully eager step (the grid's largest,
    device-bound), an eager engine's none with piecewise graphs. A free term without a usable
    start starts at the shortest of its steps: a step costs max(device, launch), so from
    launch 0 every step is device-bound and the launch time has no gradient, while the
    shortest step bounds it from above, a start the fit can walk down from.
    """
    held = []
    if eager_s.size < MIN_LAUNCH_STEPS:
        held.append("eager_launch_s")
    elif start.eager_launch_s <= 0:
        start = replace(start, eager_launch_s=float(np.min(eager_s)))
    if piecewise_s.size < MIN_LAUNCH_STEPS:
        held.append("piecewise_launch_s")
    elif start.piecewise_launch_s is None or start.piecewise_launch_s <= 0:
        begin = start.piecewise_launch if start.piecewise_launch > 0 else float(np.min(piecewise_s))
        start = replace(start, piecewise_launch_s=begin)
    return start, tuple(held)


# Fewer steps than this that the longest attention program binds (num_program_bound, at
# program_start): attention_program is held at its start, not fitted (None stays None: not
# priced).
MIN_PROGRAM_STEPS = 3
# A longest program binds a step when it makes the step longer by more than this share: a fit
# that leaves the term a hair past every step's work, or on steps it hardly moves, moved it
# out of the way.
PROGRAM_BIND_MARGIN = 0.02


def num_program_bound(with_term_s: np.ndarray, without_s: np.ndarray) -> int:
    """How many steps the longest attention program binds: step times priced with the term
    over those priced without it (attention_program None), longer by PROGRAM_BIND_MARGIN."""
    longer = np.asarray(with_term_s) > np.asarray(without_s) * (1.0 + PROGRAM_BIND_MARGIN)
    return int(np.sum(longer))


# A fit's start for attention_program where the start leaves it unset, and the value at which
# a fit judges whether its steps can tell the term at all: slow (a lone program at 15% of its
# SM's share of the peak; the H200 profiles fit 0.16-0.29, the Mooncake replays' steps
# 0.23-0.25), so that the steps it could bind do bind and the fit walks up from there; from a
# start that binds no step the term has no gradient.
PROGRAM_START = 0.15


def program_start(start: Efficiency) -> Efficiency:
    """`start` with attention_program at PROGRAM_START, or below where it is set slower."""
    value = start.attention_program
    return replace(start, attention_program=min(value or PROGRAM_START, PROGRAM_START))


def fit_with_program_term(start: Efficiency, relative_errors: Callable[[Efficiency], np.ndarray],
                          num_bound: Callable[[Efficiency], int], fixed: Collection[str] = (),
                          **least_squares_options) -> tuple[Efficiency, OptimizeResult]:
    """`fit_efficiency`, with attention_program fitted only where the steps tell it.

    `num_bound(eff)`: how many steps the longest attention program binds at `eff`
    (`num_program_bound`). Fewer than MIN_PROGRAM_STEPS at `program_start`: the term is held at
    `start`'s value (None: not priced). Else it is fitted from `program_start`; where the fitted
    value binds fewer than MIN_PROGRAM_STEPS steps the fit moved it out of every step's way
    (a bound, not a value: those steps say only that a program is at least that fast), so the
    steps are fitted again with the term held at `start`'s value.
    """
    if "attention_program" not in fixed:
        if num_bound(program_start(start)) >= MIN_PROGRAM_STEPS:
            fitted, solution = fit_efficiency(program_start(start), relative_errors, fixed,
                                              **least_squares_options)
            if num_bound(fitted) >= MIN_PROGRAM_STEPS:
                return fitted, solution
        fixed = (*fixed, "attention_program")
    # the share of the longest program not hidden under the work: told by the same steps only
    fixed = (*fixed, "attention_program_serial")
    return fit_efficiency(start, relative_errors, fixed, **least_squares_options)
