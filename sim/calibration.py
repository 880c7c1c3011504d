"""Fit the cost model's efficiencies to measured step times (scipy least squares).

Both the GPU engine's `profile` (a synthetic step grid) and `validation` (replayed steps) fit
the `FIT_PARAMETERS` of `sim.cost_model.Efficiency`; they differ only in which steps they price
and in the loss they choose, so the parameter handling lives here once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
from scipy.optimize import OptimizeResult, least_squares

from sim.cost_model import FIT_PARAMETERS, Efficiency


def fit_efficiency(start: Efficiency, relative_errors: Callable[[Efficiency], np.ndarray],
                   **least_squares_options) -> tuple[Efficiency, OptimizeResult]:
    """Efficiency minimising `relative_errors(eff)` within each parameter's bounds.

    Parameters are scaled by their typical unit, so the optimiser sees numbers of order one;
    the start is nudged strictly inside the bounds. Options go to `scipy.optimize.least_squares`.
    """
    units = np.array([unit for _, _, unit in FIT_PARAMETERS])
    lower = np.array([bounds[0] for _, bounds, _ in FIT_PARAMETERS]) / units
    upper = np.array([bounds[1] for _, bounds, _ in FIT_PARAMETERS]) / units
    x0 = np.array([getattr(start, name) for name, _, _ in FIT_PARAMETERS]) / units
    inset = 1e-6 * (upper - lower)
    x0 = np.clip(x0, lower + inset, upper - inset)

    def efficiency(x: np.ndarray) -> Efficiency:
        return replace(start, **{name: float(v) * unit
                                 for (name, _, unit), v in zip(FIT_PARAMETERS, x)})

    solution = least_squares(lambda x: relative_errors(efficiency(x)), x0,
                             bounds=(lower, upper), **least_squares_options)
    return efficiency(solution.x), solution
