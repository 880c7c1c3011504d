"""Which steps make a run's TPOT error: the measured step sequence re-timed class by class.

A request's TPOT is the time from its first token to its last over its output tokens less
one: the steps the engine ran in that window (and any elastic pause between them). Keeping
the measured sequence of steps and swapping the measured duration of some steps for the
cost model's gives the TPOT the run would have had if only those steps were priced as the
model prices them. Swapping every step gives the model's TPOT without any scheduling
difference; swapping one class of step (steps.step_classes) at a time says how much of the
error that class makes.
"""

from __future__ import annotations

import numpy as np

from validation.steps import StepTable, class_masks

MATCH_TOLERANCE_S = 1e-6  # a request's first/last token time equals a step's end time


def request_windows(steps: StepTable, requests: dict[str, np.ndarray]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(first, last, span_s, outputs) of every finished request with 2+ output tokens:
    the index of the step that produced its first token, of the step that produced its
    last, the measured time between them, and its output tokens. Requests whose token times
    match no step end (a run without step start times, say) are left out."""
    start = steps.start_s
    if start is None or len(steps) == 0:
        return (np.zeros(0, np.int64),) * 2 + (np.zeros(0), np.zeros(0))
    ends = start + steps.duration_s
    done = np.asarray(requests["status"]).astype(str) == "finished"
    outputs = np.asarray(requests["output_tokens"], dtype=np.float64)
    keep = done & (outputs >= 2)
    first_s = np.asarray(requests["first_token_s"], dtype=np.float64)[keep]
    last_s = np.asarray(requests["finish_s"], dtype=np.float64)[keep]
    first, ok_first = _step_ending_at(ends, first_s)
    last, ok_last = _step_ending_at(ends, last_s)
    ok = ok_first & ok_last & (last > first)
    return first[ok], last[ok], (last_s - first_s)[ok], outputs[keep][ok]


def _step_ending_at(ends: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    index = np.clip(np.searchsorted(ends, times - MATCH_TOLERANCE_S), 0, len(ends) - 1)
    return index, np.abs(ends[index] - times) <= MATCH_TOLERANCE_S


def tpot_p50(steps: StepTable, windows: tuple[np.ndarray, ...],
             durations_s: np.ndarray) -> float | None:
    """Median TPOT over `windows` (request_windows) with each step lasting `durations_s`."""
    first, last, span_s, outputs = windows
    if first.size == 0:
        return None
    shift = np.concatenate([[0.0], np.cumsum(np.asarray(durations_s) - steps.duration_s)])
    tpot = (span_s + shift[last + 1] - shift[first + 1]) / (outputs - 1)
    return float(np.median(tpot))


def tpot_attribution(steps: StepTable, requests: dict[str, np.ndarray] | None,
                     predicted_s: np.ndarray, apart: np.ndarray | None = None) -> dict | None:
    """TPOT p50 measured; with every step at the model's time; and with one class of step at
    the model's time, the rest measured, per class (error relative to the measured p50;
    `apart`: the mixed steps whose decode rows ran apart, a class of their own)."""
    if requests is None:
        return None
    windows = request_windows(steps, requests)
    measured = tpot_p50(steps, windows, steps.duration_s)
    if measured is None or measured <= 0:
        return None
    predicted_s = np.asarray(predicted_s, dtype=np.float64)

    def error(mask: np.ndarray) -> float:
        value = tpot_p50(steps, windows, np.where(mask, predicted_s, steps.duration_s))
        return float(value / measured - 1.0) if value is not None else float("nan")

    every = np.ones(len(steps), dtype=bool)
    return {"num_requests": int(windows[0].size),
            "measured_p50_s": measured, "all_steps_error": error(every),
            "by_class": {name: error(mask) for name, mask in class_masks(steps, apart)
                         if mask.any()}}
