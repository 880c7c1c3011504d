"""Run a grid of cases and keep one tidy row per case: every input, every scalar metric.

A case that cannot run (weights and reserve exceed memory, KV pool below max_model_len, a
max_model_len past the model's context, a TP degree that does not divide the heads) is a row
with ``fits=False`` and the reason in ``fit_error``; its metric columns are empty. A case
that failed (it raised, or its worker was lost) is a row with the reason in ``error``, and
the sweep goes on. Rows go to sweep.csv as cases end (sim.planning.sweep_file).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from sim.core.memory_plan import plan_memory
from sim.planning.cases import Case, build_trace
from sim.planning.parallel import Executor, iter_outcomes
from sim.planning.sweep_file import CASE_ID, ERROR, SweepCsv, case_id, columns, write_rows
from sim.recording.folder import OutputFolder, atomic_path
from sim.runner import simulate

# Summary entries that are per-run diagnostics rather than metrics of the configuration:
# they differ between two runs of the same case, so comparisons leave them out.
WALL_CLOCK_COLUMNS = ("sim_wall_s",)
SWEEP_FILES = ("sweep.csv", "sweep.parquet")


def fit_error(case: Case) -> str | None:
    """Why the case cannot run (as plan_memory or the config checks say), or None if it fits."""
    try:
        engine = case.engine()
        plan_memory(engine.memory_config(), case.profile)
    except ValueError as exc:
        return str(exc)
    return None


BEYOND_CONTEXT = "beyond context"
# What EngineConfig's refusal of a max_model_len past the model's context says
# (sim.core.engine_checks); tests tie the two together.
_CONTEXT_REFUSAL = "context (max_position_embeddings"


def fit_status(error: str | None) -> str:
    """"fits", "invalid" (a TP degree that does not divide the heads, an unknown name),
    "beyond context" (max_model_len past the model's context, which vLLM refuses) or
    "does not fit" (memory), from `fit_error`'s message."""
    if error is None:
        return "fits"
    if "must divide" in error or "unknown" in error:
        return "invalid"
    return BEYOND_CONTEXT if _CONTEXT_REFUSAL in error else "does not fit"


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


def run_sweep(cases: Sequence[Case], executor: Executor | None = None, *,
              table: SweepCsv | None = None, extra: Sequence[dict] | None = None) -> list[dict]:
    """Rows in case order, computed in parallel as ``executor`` says (local cores by default).

    Each case's row goes to ``table`` as soon as it ends; cases the table already holds are
    not run again (their rows come from it). A case that raises, or whose worker is lost,
    is a row with the reason in ``error`` (empty for the others). ``extra``: columns per case
    (what priced it), part of what identifies it for a resumed sweep."""
    extra = extra or [{} for _ in cases]
    ids = [case_id({**case.input_fields(), **more}) for case, more in zip(cases, extra)]
    done = table.done() if table is not None else {}
    rows: list[dict | None] = [done.get(cid) for cid in ids]
    todo = [i for i, cid in enumerate(ids) if cid not in done]
    for trace in dict.fromkeys(cases[i].trace for i in todo):
        build_trace(trace)  # a trace that cannot load fails the sweep now, not every case
    for outcome in iter_outcomes(run_case, [cases[i] for i in todo], executor or Executor(),
                                 label="sweep"):
        i = todo[outcome.index]
        if outcome.error is None:
            row = {**outcome.value, ERROR: ""}
        else:
            row = {**cases[i].input_fields(), "fits": None, ERROR: outcome.error}
        row = {**row, **extra[i], CASE_ID: ids[i]}
        if table is not None:
            table.append(row)
        rows[i] = row
    return [row for row in rows if row is not None]


def open_table(out: Path, *, resume: bool, overwrite: bool) -> SweepCsv:
    """Claim the sweep's --out before any case runs and open its sweep.csv: kept (its failed
    cases dropped) with `resume`, else new; a folder holding results is refused unless
    `overwrite`."""
    if resume and overwrite:
        raise ValueError("--resume keeps the finished cases in --out and --overwrite removes "
                         "them: give one of the two")
    OutputFolder.claim(out, flag="--out", overwrite=overwrite, patterns=SWEEP_FILES,
                       keep=SWEEP_FILES if resume else (),
                       remedy="pass --resume to run the cases it lacks, --overwrite to start "
                              "over, or give a new folder")
    path = out / "sweep.csv"
    return SweepCsv.resume(path) if resume else SweepCsv(path)


def failed_rows(rows: Sequence[dict]) -> list[dict]:
    """The rows of cases that failed (raised, or lost their worker)."""
    return [row for row in rows if row.get(ERROR)]


def missing_metrics(row: dict) -> list[str]:
    """Metric columns of a fitting row that are empty (None or NaN)."""
    return [k for k, v in row.items()
            if (v is None and k not in _INPUT_NONE_OK) or (isinstance(v, float) and math.isnan(v))]


_INPUT_NONE_OK = ("slo_ttft_s", "slo_tpot_s")


def write_table(rows: Sequence[dict], out_dir: Path, stem: str = "sweep") -> list[Path]:
    """Write ``stem.csv`` (and ``stem.parquet`` when pyarrow is importable), each atomically;
    return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = columns(rows)
    csv_path = out_dir / f"{stem}.csv"
    with atomic_path(csv_path) as tmp, tmp.open("w", newline="") as f:
        write_rows(f, rows, names)
    written = [csv_path]
    parquet_path = write_parquet(rows, out_dir / f"{stem}.parquet")
    if parquet_path is not None:
        written.append(parquet_path)
    return written


def write_parquet(rows: Sequence[dict], path: Path) -> Path | None:
    """The rows as Parquet (atomically), or None when pyarrow is not installed."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    data = {name: _one_type([row.get(name) for row in rows]) for name in columns(rows)}
    with atomic_path(path) as tmp:
        pq.write_table(pa.table(data), tmp)
    return path


def _one_type(values: list) -> list:
    """Parquet columns need one type: a column mixing ints and floats becomes floats."""
    def is_number(v) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    if any(isinstance(v, float) for v in values):
        return [float(v) if is_number(v) else v for v in values]
    return values
