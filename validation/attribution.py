"""Which steps make a run's TPOT and TTFT error: the measured step sequence re-timed class by
class.

A request's TPOT is the time from its first token to its last over its output tokens less
one: the steps the engine ran in that window (and any elastic pause between them). Keeping
the measured sequence of steps and swapping the measured duration of some steps for the
cost model's gives the TPOT the run would have had if only those steps were priced as the
model prices them. Swapping every step gives the model's TPOT without any scheduling
difference; swapping one class of step (steps.step_classes) at a time says how much of the
error that class makes.

A request's TTFT runs from its arrival to the end of the step that gave its first token. What
the steps before its arrival cost reaches it through the queue: re-timed, a step starts when
the one before it ends (after the gap measured between them, an elastic pause say) while some
request that had arrived waited for its first token, and at its measured start otherwise,
when the steps were set by the arrivals rather than by a backlog. The TTFT so re-timed,
against the simulator's, says how much of a TTFT error is the steps' prices and how much the
schedule the simulator ran.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from validation.step_table import StepTable
from validation.steps import class_masks

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

    return _attribution(steps, apart, int(windows[0].size), measured, error)


def _attribution(steps: StepTable, apart: np.ndarray | None, num_requests: int,
                 measured_p50_s: float, error: Callable[[np.ndarray], float]) -> dict:
    """An attribution's record: `error` of the steps re-timed all at once, then one class of
    step at a time (steps.class_masks)."""
    return {"num_requests": num_requests, "measured_p50_s": measured_p50_s,
            "all_steps_error": error(np.ones(len(steps), dtype=bool)),
            "by_class": {name: error(mask) for name, mask in class_masks(steps, apart)
                         if mask.any()}}


def retimed_ends(steps: StepTable, arrival_s: np.ndarray, first_token_s: np.ndarray,
                 durations_s: np.ndarray) -> np.ndarray:
    """Each step's end with the steps lasting `durations_s`, in the measured order (module
    doc): `arrival_s` and `first_token_s`, the requests that got a first token, say where a
    backlog carries the re-timing from one step to the next."""
    start = steps.start_s
    assert start is not None, "re-timing needs the steps' start times"
    arrivals = np.sort(arrival_s)
    before = np.concatenate(([start[0]], (start + steps.duration_s)[:-1]))  # the last step's end
    arrived = np.searchsorted(arrivals, start, side="right")
    backlog = arrived > np.searchsorted(np.sort(first_token_s), start, side="right")
    # idle before the step: a request arrived after the step before it ended
    waited = arrived > np.searchsorted(arrivals, before, side="right")
    gaps = np.maximum(start - before, 0.0)
    ends = np.empty(len(steps))
    new_end = 0.0
    for i, duration in enumerate(np.asarray(durations_s, dtype=np.float64)):
        if i == 0 or not backlog[i]:  # set by the arrivals: at its measured start
            new_start = start[i]
        elif waited[i]:  # idle until an arrival, or until the step before ends
            new_start = max(start[i], new_end)
        else:  # a backlog: after the step before, and any pause between them
            new_start = new_end + gaps[i]
        new_end = ends[i] = new_start + duration
    return ends


def ttft_attribution(steps: StepTable, requests: dict[str, np.ndarray] | None,
                     predicted_s: np.ndarray, apart: np.ndarray | None = None) -> dict | None:
    """TTFT p50 measured; on the measured step sequence with every step at the model's time;
    and with one class of step at the model's time, the rest measured, per class (error
    relative to the measured p50). None without request times or step start times."""
    if requests is None or steps.start_s is None or len(steps) == 0:
        return None
    done = np.asarray(requests["status"]).astype(str) == "finished"
    arrival = np.asarray(requests["arrival_s"], dtype=np.float64)
    first_s = np.asarray(requests["first_token_s"], dtype=np.float64)[done]
    first, matched = _step_ending_at(steps.start_s + steps.duration_s, first_s)
    if not matched.any():
        return None
    first, arrived_s, first_s = first[matched], arrival[done][matched], first_s[matched]
    measured = float(np.median(first_s - arrived_s))
    if measured <= 0:
        return None
    predicted_s = np.asarray(predicted_s, dtype=np.float64)

    def error(mask: np.ndarray) -> float:
        ends = retimed_ends(steps, arrived_s, first_s,
                            np.where(mask, predicted_s, steps.duration_s))
        return float(np.median(ends[first] - arrived_s) / measured - 1.0)

    return _attribution(steps, apart, int(first.size), measured, error)
