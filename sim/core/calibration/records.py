"""The records a refit fits (`python -m gpu_backend refit`), checked before a fit reads them:
each grid step's shape and times ("measurements"), the attention launches timed alone
("attention_measurements") and the elastic transitions ("vmm": {"points": [...]}). A
hand-edited or truncated calibration gets an error naming the file, the record and the field,
never a traceback from inside the fit."""

from __future__ import annotations

import math
from collections.abc import Mapping

from sim.core.calibration.schema import is_count, is_number

STEP_KINDS = ("prefill", "decode", "mixed")
# a grid step's phases and periods, as the profile writes them (null or NaN: not timed)
STEP_TIMES = ("build_s", "enqueue_s", "device_s", "ahead_s", "ahead_device_s", "host_probe_s")
WRITTEN_BY = "as `python -m gpu_backend profile` writes it"


def check_fit_records(data: Mapping, source: str) -> None:
    """Raise ValueError naming `source`, the record and its field where a record a refit
    reads is missing or malformed."""
    records = data.get("measurements")
    if not isinstance(records, list) or not records:
        raise ValueError(f'{source}: no "measurements" to fit: a list of the grid\'s timed '
                         f"steps, {WRITTEN_BY}")
    grid = data.get("grid_of")  # written by sim.core.calibration.transfer
    if isinstance(grid, Mapping):
        raise ValueError(f"{source}: carried to {data.get('model')} on {data.get('gpu_preset')} "
                         f"from a calibration whose grid ran {grid.get('model')} on "
                         f"{grid.get('gpu_preset')}; its measurements are that run's times: "
                         "refit the source calibration and carry it again")
    _check_steps(records, "measurements", source)
    attention = data.get("attention_measurements")
    if attention:
        if not isinstance(attention, list):
            raise ValueError(f"{source}: attention_measurements is {attention!r}; expected a "
                             f"list of timed attention launches, {WRITTEN_BY}")
        _check_steps(attention, "attention_measurements", source)
    vmm = data.get("vmm")
    if isinstance(vmm, Mapping) and vmm.get("points") is not None:
        _check_points(vmm["points"], source)


def _check_steps(records: list, key: str, source: str) -> None:
    for index, record in enumerate(records):
        where = f"{source}: {key}[{index}]"
        if not isinstance(record, Mapping):
            raise ValueError(f"{where} is {record!r}; expected a step object, {WRITTEN_BY}")
        if record.get("kind") not in STEP_KINDS:
            raise ValueError(f"{where}.kind is {record.get('kind')!r}; expected one of "
                             f"{', '.join(STEP_KINDS)}")
        _check_pairs(record.get("prefills"), f"{where}.prefills", "[new tokens, prefix tokens]")
        groups = record.get("decode_groups")
        if groups is not None:
            _check_pairs(groups, f"{where}.decode_groups", "[sequences, context tokens]")
        else:  # records from before decode_groups: one context for every decode row
            for name in ("num_decodes", "decode_context"):
                if not is_count(record.get(name), zero=True):
                    raise ValueError(f"{where}.{name} is {record.get(name)!r}; expected a "
                                     "count >= 0 (or give decode_groups)")
        seconds = _finite(record.get("measured_s"))
        if seconds is None or seconds <= 0:
            raise ValueError(f"{where}.measured_s is {record.get('measured_s')!r}; expected the "
                             "step's time in seconds, a number > 0")
        for name in STEP_TIMES:
            value = record.get(name)
            if value is not None and not is_number(value):
                raise ValueError(f"{where}.{name} is {value!r}; expected seconds, or null "
                                 "where not timed")


def _check_pairs(pairs: object, where: str, form: str) -> None:
    if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(is_count(x, zero=True) for x in p)
            for p in pairs):
        raise ValueError(f"{where} is {pairs!r}; expected a list of {form} pairs of counts "
                         ">= 0")


def _check_points(points: object, source: str) -> None:
    if not isinstance(points, list):
        raise ValueError(f"{source}: vmm.points is {points!r}; expected a list of timed "
                         f"transitions, {WRITTEN_BY}")
    for index, point in enumerate(points):
        where = f"{source}: vmm.points[{index}]"
        if not isinstance(point, Mapping):
            raise ValueError(f"{where} is {point!r}; expected a transition object")
        if not is_count(point.get("handles")):
            raise ValueError(f"{where}.handles is {point.get('handles')!r}; expected the "
                             "handles lent, a count >= 1")
        for name in ("attach_s", "detach_s"):
            value = _finite(point.get(name))
            if value is None or value < 0:
                raise ValueError(f"{where}.{name} is {point.get(name)!r}; expected seconds >= 0")
        freed = point.get("freed_bytes", 0)
        if not is_count(freed, zero=True):
            raise ValueError(f"{where}.freed_bytes is {freed!r}; expected bytes >= 0")


def _finite(value: object) -> float | None:
    """`value` as seconds where it is a finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
