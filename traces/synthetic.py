"""Synthetic traces: Poisson or Gamma arrivals with chosen prompt and output lengths.

Gamma inter-arrival gaps with shape ``k = 1 / cv**2`` and mean ``1 / rate`` have
coefficient of variation ``cv``: cv = 1 is Poisson, cv > 1 is bursty (Azure code is ~13),
cv < 1 is smoother than Poisson. All randomness comes from one ``numpy`` Generator seeded
by ``seed``, drawn in a fixed order (gaps, prompts, outputs), so a seed fixes the trace.
"""

from __future__ import annotations

import numpy as np

from traces.lengths import LengthDist
from traces.trace import Trace

ARRIVALS = ("poisson", "gamma", "constant")


def synthetic(
    num_requests: int,
    rate_per_s: float,
    *,
    arrival: str = "poisson",
    cv: float = 1.0,
    prompt: LengthDist,
    output: LengthDist,
    seed: int = 0,
) -> Trace:
    """A trace of ``num_requests`` arriving at ``rate_per_s`` on average, first at 0.0 s.

    ``arrival``: "poisson" (exponential gaps, ``cv`` ignored), "gamma" (gaps with
    coefficient of variation ``cv``) or "constant" (every ``1 / rate_per_s`` seconds).
    """
    if num_requests < 1 or not rate_per_s > 0:
        raise ValueError(f"need num_requests >= 1 and rate_per_s > 0, got {num_requests}, {rate_per_s}")
    rng = np.random.default_rng(seed)
    gaps_s = _gaps_s(num_requests - 1, rate_per_s, arrival, cv, rng)
    arrival_s = np.concatenate(([0.0], np.cumsum(gaps_s)))
    label = f"synthetic:{arrival},rate={rate_per_s:g}/s,cv={cv:g},n={num_requests},seed={seed}"
    return Trace(
        arrival_s=arrival_s,
        prompt_tokens=prompt.sample(num_requests, rng),
        output_tokens=output.sample(num_requests, rng),
        source=label,
        format="synthetic",
        notes=[f"prompt {prompt.kind}, output {output.kind}"],
    )


def _gaps_s(num: int, rate_per_s: float, arrival: str, cv: float, rng) -> np.ndarray:
    mean_gap_s = 1.0 / rate_per_s
    if arrival == "poisson":
        return rng.exponential(mean_gap_s, size=num)
    if arrival == "constant":
        return np.full(num, mean_gap_s)
    if arrival == "gamma":
        if not cv > 0:
            raise ValueError(f"gamma arrivals need cv > 0, got {cv}")
        shape = 1.0 / cv**2
        return rng.gamma(shape, mean_gap_s / shape, size=num)
    raise ValueError(f"unknown arrival process '{arrival}'; use one of {ARRIVALS}")
