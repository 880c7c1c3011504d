"""A run folder's CSVs other than steps.csv (validation.step_table reads that one): the timeline,
the requests and the elastic transitions, each plain or gzip-compressed, as columns."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from validation.csv_rows import read_csv_rows
from validation.step_table import StepTable


def first_file(folder: Path, pattern: str) -> Path | None:
    """The first file matching `pattern`, or its gzip-compressed twin (`pattern`.gz)."""
    matches = sorted(folder.glob(pattern)) or sorted(folder.glob(pattern + ".gz"))
    return matches[0] if matches else None


def read_numeric_csv(path: Path | None) -> dict[str, np.ndarray] | None:
    """Every column of the CSV at `path` as float64 (ValueError naming the file, line and
    field of a value that is not a number)."""
    if path is None:
        return None
    table = read_csv_rows(path)
    return {name: np.array(table.column(name), dtype=np.float64) for name in table.header}


def read_csv_columns(path: Path | None) -> dict[str, np.ndarray] | None:
    """The columns of the CSV at `path`, float64 where they hold numbers and text where they
    hold none (CsvRows.is_numeric: a number column with a text value is an error naming it);
    None where the file has no rows."""
    if path is None:
        return None
    table = read_csv_rows(path)
    if not table.rows:
        return None
    return {name: (np.array(table.column(name), dtype=np.float64) if table.is_numeric(name)
                   else np.array(table.column(name, str)))
            for name in table.header}


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
