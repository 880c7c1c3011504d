"""Run a grid of cases and keep one tidy row per case: every input, every scalar metric.

A case that does not fit the GPU (weights and reserve exceed memory, KV pool below
max_model_len, a TP degree that does not divide the heads) is a row with ``fits=False``
and the reason in ``fit_error``; its metric columns are empty.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

from sim.core.memory_plan import plan_memory
from sim.planning.cases import Case
from sim.planning.parallel import Executor, run_parallel
from sim.runner import simulate

# Summary entries that are per-run diagnostics rather than metrics of the configuration:
# they differ between two runs of the same case, so comparisons leave them out.
WALL_CLOCK_COLUMNS = ("sim_wall_s",)


def fit_error(case: Case) -> str | None:
    """Why the case cannot run (as plan_memory or the config checks say), or None if it fits."""
    try:
        engine = case.engine()
        plan_memory(engine.memory_config(), case.profile)
    except ValueError as exc:
        return str(exc)
    return None


def fit_status(error: str | None) -> str:
    """"fits", "invalid" (a TP degree that does not divide the heads, an unknown name) or
    "does not fit" (memory), from `fit_error`'s message."""
    if error is None:
        return "fits"
    return "invalid" if "must divide" in error or "unknown" in error else "does not fit"


def run_case(case: Case) -> dict:
    """Simulate one case; a row of inputs, ``fits`` and the flattened summary."""
    row = case.input_fields()
    error = fit_error(case)
    row["fits"] = error is None
    row["fit_error"] = error or ""
    if error is not None:
        return row
    spec = case.run_spec()
    row["max_model_len"] = spec.engine.memory_config().effective_max_model_len
    result = simulate(spec, case.scaled_trace())
    for key, value in flatten(result.summary).items():
        if row.get(key) is None:  # inputs win; None inputs (vLLM defaults) get resolved
            row[key] = value
    return row


def flatten(summary: dict) -> dict:
    """{'ttft_s': {'p50': x}} -> {'ttft_s_p50': x}; scalars pass through."""
    flat: dict = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            for sub, sub_value in value.items():
                flat[f"{key}_{sub}"] = sub_value
        else:
            flat[key] = value
    return flat


def run_sweep(cases: Sequence[Case], executor: Executor | None = None) -> list[dict]:
    """Rows in case order, computed in parallel as ``executor`` says (local cores by default)."""
    return run_parallel(run_case, list(cases), executor or Executor(), label="sweep")


def columns(rows: Sequence[dict]) -> list[str]:
    """Union of the rows' keys, first-seen order (inputs, then fits, then metrics)."""
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            seen.setdefault(key, None)
    return list(seen)


def missing_metrics(row: dict) -> list[str]:
    """Metric columns of a fitting row that are empty (None or NaN)."""
    return [k for k, v in row.items()
            if (v is None and k not in _INPUT_NONE_OK) or (isinstance(v, float) and math.isnan(v))]


_INPUT_NONE_OK = ("slo_ttft_s", "slo_tpot_s")


def write_table(rows: Sequence[dict], out_dir: Path, stem: str = "sweep") -> list[Path]:
    """Write ``stem.csv`` (and ``stem.parquet`` when pyarrow is importable); return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = columns(rows)
    csv_path = out_dir / f"{stem}.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in names})
    written = [csv_path]
    parquet_path = _write_parquet(rows, names, out_dir / f"{stem}.parquet")
    if parquet_path is not None:
        written.append(parquet_path)
    return written


def _write_parquet(rows: Sequence[dict], names: list[str], path: Path) -> Path | None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    data = {name: _one_type([row.get(name) for row in rows]) for name in names}
    pq.write_table(pa.table(data), path)
    return path


def _one_type(values: list) -> list:
    """Parquet columns need one type: a column mixing ints and floats becomes floats."""
    def is_number(v) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    if any(isinstance(v, float) for v in values):
        return [float(v) if is_number(v) else v for v in values]
    return values
