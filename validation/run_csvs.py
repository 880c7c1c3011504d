"""A run folder's CSVs other than steps.csv (validation.step_table reads that one): the timeline,
the requests and the elastic transitions, each plain or gzip-compressed, as columns."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np

from validation.step_table import StepTable, open_csv


def first_file(folder: Path, pattern: str) -> Path | None:
    """The first file matching `pattern`, or its gzip-compressed twin (`pattern`.gz)."""
    matches = sorted(folder.glob(pattern)) or sorted(folder.glob(pattern + ".gz"))
    return matches[0] if matches else None


def read_numeric_csv(path: Path | None) -> dict[str, np.ndarray] | None:
    if path is None:
        return None
    with open_csv(path) as f:
        data = np.genfromtxt(f, delimiter=",", names=True, ndmin=1)
    return {name: np.atleast_1d(data[name]).astype(np.float64) for name in data.dtype.names}


def read_csv_columns(path: Path | None) -> dict[str, np.ndarray] | None:
    if path is None:
        return None
    with open_csv(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    columns: dict[str, np.ndarray] = {}
    for name in rows[0]:
        values = [r[name] for r in rows]
        try:
            columns[name] = np.array([float(v) for v in values])
        except ValueError:
            columns[name] = np.array(values)
    return columns


def with_timeline(steps: StepTable, timeline: dict[str, np.ndarray] | None) -> StepTable:
    """Take KV use, preemptions and lent blocks from the timeline when steps.csv lacks them:
    the GPU engine writes one timeline row per step, so the rows line up."""
    extra = dict(steps.extra)
    if "lent_blocks" in extra and "reserve_lent_blocks" not in extra:
        extra["reserve_lent_blocks"] = extra.pop("lent_blocks")
    if timeline is not None and len(timeline.get("start_s", ())) == len(steps):
        if np.all(timeline.get("num_steps", np.ones(len(steps))) == 1):
            for name in ("start_s", "kv_blocks_used", "kv_blocks_usable", "num_preempted",
                         "reserve_lent_blocks"):
                if name in timeline and name not in extra:
                    extra[name] = timeline[name]
    return replace(steps, extra=extra)
