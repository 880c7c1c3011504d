"""Step-by-step alignment of a simulated and a measured run, and why they part ways.

Both executors drive the same scheduler with the same trace, so they make the same decisions
step after step until something the scheduler sees differs. The usual cause is time: an
arrival falls before a step starts in one run and after it in the other, because predicted
and measured step times have drifted apart. Other causes: KV pools of different sizes
(a preemption in one run only), or the elastic reserve lent in one run only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from validation.step_table import StepTable
from validation.steps import error_stats, relative_errors

COMPOSITION = ("num_prefill_tokens", "num_decode_tokens", "num_seqs", "decode_context_tokens")


@dataclass(frozen=True)
class Divergence:
    num_sim_steps: int
    num_gpu_steps: int
    num_matching_steps: int  # the runs agree on steps [0, num_matching_steps)
    diverged: bool
    step_index: int | None  # first differing step (0-based), None if none
    sim_step: dict | None  # composition of that step in each run
    gpu_step: dict | None
    sim_start_s: float | None
    gpu_start_s: float | None
    cause: str  # "arrival_timing", "kv_pool", "preemption", "elastic", "length", "other", "none"
    explanation: str
    aligned_step_error: dict  # predicted vs measured time of the matching steps

    def to_dict(self) -> dict:
        return asdict(self)


def _composition(table: StepTable, i: int) -> dict:
    return {name: int(getattr(table, name)[i]) for name in COMPOSITION}


def first_difference(sim: StepTable, gpu: StepTable) -> int | None:
    """Index of the first step whose composition differs (or where one run ends), or None."""
    n = min(len(sim), len(gpu))
    differs = np.zeros(n, dtype=bool)
    for name in COMPOSITION:
        differs |= getattr(sim, name)[:n] != getattr(gpu, name)[:n]
    hits = np.flatnonzero(differs)
    if hits.size:
        return int(hits[0])
    return None if len(sim) == len(gpu) else n


def find_divergence(sim: StepTable, gpu: StepTable, arrival_s: np.ndarray) -> Divergence:
    k = first_difference(sim, gpu)
    matching = min(len(sim), len(gpu)) if k is None else k
    aligned = error_stats(relative_errors(sim.duration_s[:matching], gpu.duration_s[:matching]))
    if k is None:
        return Divergence(len(sim), len(gpu), matching, False, None, None, None, None, None,
                          "none", f"the runs execute the same {matching} steps", aligned)
    sim_start = _start(sim, k)
    gpu_start = _start(gpu, k)
    cause, text = _explain(k, sim, gpu, sim_start, gpu_start, arrival_s)
    return Divergence(
        len(sim), len(gpu), matching, True, k,
        _composition(sim, k) if k < len(sim) else None,
        _composition(gpu, k) if k < len(gpu) else None,
        sim_start, gpu_start, cause, text, aligned)


def _start(table: StepTable, i: int) -> float | None:
    starts = table.start_s
    if starts is None or i >= len(table):
        return None
    return float(starts[i])


def _explain(k: int, sim: StepTable, gpu: StepTable, sim_start: float | None,
             gpu_start: float | None, arrival_s: np.ndarray) -> tuple[str, str]:
    predicted_s = float(sim.duration_s[:k].sum())
    measured_s = float(gpu.duration_s[:k].sum())
    drift = (f"over the {k} matching steps the simulator predicted {predicted_s:.4f} s of step "
             f"time and the GPU took {measured_s:.4f} s ({_pct(predicted_s, measured_s)})")
    if k >= len(sim) or k >= len(gpu):
        shorter = "simulated" if k >= len(sim) else "measured"
        return "length", (f"step {k}: the {shorter} run ended after {k} steps while the other "
                          f"continued; {drift}")
    if sim_start is not None and gpu_start is not None:
        low, high = sorted((sim_start, gpu_start))
        between = np.flatnonzero((arrival_s > low) & (arrival_s <= high))
        if between.size:
            early = "simulated" if sim_start < gpu_start else "measured"
            late = "measured" if early == "simulated" else "simulated"
            ids = ", ".join(str(i) for i in between[:5]) + (" ..." if between.size > 5 else "")
            return "arrival_timing", (
                f"step {k}: request(s) {ids} arrived at {arrival_s[between[0]]:.4f} s, after the "
                f"step began in the {early} run ({low:.4f} s) but before it began in the {late} "
                f"run ({high:.4f} s), so only the {late} run could schedule it; {drift}")
    for name, cause, what in (("num_preempted", "preemption", "preempted requests"),
                              ("reserve_lent_blocks", "elastic", "lent reserve blocks"),
                              ("kv_blocks_usable", "kv_pool", "usable KV blocks")):
        if name in sim.extra and name in gpu.extra and sim.extra[name][k] != gpu.extra[name][k]:
            return cause, (f"step {k}: {what} differ (simulated {sim.extra[name][k]:.0f}, "
                           f"measured {gpu.extra[name][k]:.0f}); {drift}")
    return "other", (f"step {k}: simulated {_composition(sim, k)} vs measured "
                     f"{_composition(gpu, k)} with no arrival between the two step starts; "
                     f"{drift}")


def _pct(predicted: float, measured: float) -> str:
    if measured <= 0:
        return "no measured time"
    return f"{(predicted - measured) / measured:+.1%}"
