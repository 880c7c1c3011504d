"""GPU replay outputs, one folder per run, and the simulator configuration they imply.

A folder written by `python -m gpu_backend replay --out DIR` holds:

    summary.json       the simulator's summary keys for the run, plus the run's configuration
                       (policy, chunk, model, gpu, tensor_parallel_size, max_num_seqs, ...), the
                       trace slice (trace, limit, window, rate_scale) and measured memory fields.
                       Either one summary object or the simulator's {"trace", "runs": [one]}.
    config.json        the EngineConfig the replay ran (EngineConfig.to_json), which the
                       simulation takes as it is; replays written before it are read from
                       summary.json's columns (legacy_config)
    steps.csv          one row per executed step (see validation.step_table)
    timeline*.csv      the simulator's timeline columns (optional)
    requests*.csv      the simulator's request columns (optional)
    transitions.csv    each elastic transition with its phases (optional)

Each CSV may be gzip-compressed (`steps.csv.gz`, ...), as the committed replays are.
validation.run_config rebuilds the EngineConfig a run ran, validation.slices its trace slice,
validation.run_csvs reads its CSVs other than steps.csv.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.core.calibration import Calibration, load_calibration, timed_launch_kinds
from sim.core.engine_config import EngineConfig
from validation.run_config import (
    CONFIG_FILE,
    ENGINE_CONFIG_KEY,
    LEGACY_DEFAULTS,
    MEASURED_SIZES,
    engine_config,
    legacy_config,
    measured_sizes,
)
from validation.run_csvs import first_file, read_csv_columns, read_numeric_csv, with_timeline
from validation.slices import REPO_ROOT, TraceSlice, trace_slice
from validation.step_table import StepTable, read_steps_csv
from validation.summary_check import check_summary, read_summary_json

# The run folders' readers, and (from validation.run_config and validation.slices) the
# configuration and trace slice a run implies, all importable from here.
__all__ = [
    "CONFIG_FILE", "ENGINE_CONFIG_KEY", "LEGACY_DEFAULTS", "MEASURED_KV_BLOCK_KEYS",
    "MEASURED_KV_KEYS", "MEASURED_SIZES", "REPO_ROOT", "GpuRun", "RunSummary", "TraceSlice",
    "check_calibration_graphs", "engine_config", "find_runs", "legacy_config", "load_run",
    "load_summary", "measured_sizes", "trace_slice",
]

# Where the measured KV capacity may sit in a GPU summary, most specific first.
MEASURED_KV_KEYS = ("measured_kv_capacity_tokens", "kv_capacity_tokens_measured",
                    "kv_capacity_tokens")
MEASURED_KV_BLOCK_KEYS = ("measured_num_kv_blocks", "num_kv_blocks_allocated", "num_kv_blocks")


@dataclass
class RunSummary:
    """A GPU run's summary.json alone: its configuration and measured metrics (what a repeat
    of a compared replay needs, `validation.repeats`)."""
    path: Path
    summary: dict

    @property
    def policy(self) -> str:
        return str(self.summary.get("policy", "static"))

    @property
    def chunk(self) -> int:
        return int(self.summary["chunk"])

    @property
    def label(self) -> str:
        return f"{self.policy}/chunk={self.chunk}"

    def measured_kv_capacity_tokens(self) -> float | None:
        nested = self.summary.get("measured")
        if isinstance(nested, dict) and nested.get("kv_tokens") is not None:
            return float(nested["kv_tokens"])  # gpu_backend: the blocks actually allocated
        for key in MEASURED_KV_KEYS:
            if self.summary.get(key) is not None:
                return float(self.summary[key])
        block_size = int(self.summary.get("block_size", 16))
        for key in MEASURED_KV_BLOCK_KEYS:
            if self.summary.get(key) is not None:
                return float(self.summary[key]) * block_size
        return None


@dataclass
class GpuRun(RunSummary):
    """A GPU run in full: its summary and the per-step, per-request and transition records."""
    steps: StepTable = field(kw_only=True)
    timeline: dict[str, np.ndarray] | None = field(kw_only=True)
    requests: dict[str, np.ndarray] | None = field(kw_only=True)
    # transitions.csv: every elastic transition with its phases (ElasticExecutor.Transition);
    # None for replays from before it
    transitions: dict[str, np.ndarray] | None = field(default=None, kw_only=True)


def find_runs(gpu_dir: Path) -> list[Path]:
    """Every folder under `gpu_dir` (itself included) that holds a summary.json. A folder
    beside them that holds none (a replay cut short, a summary.json renamed) is an error, not
    a run left out."""
    folders = sorted({p.parent for p in gpu_dir.rglob("summary.json")})
    if not folders:
        raise ValueError(f"{gpu_dir}: no summary.json found; expected one folder per GPU run "
                         "written by `python -m gpu_backend replay --out DIR`")
    for folder in sorted(p for p in gpu_dir.rglob("*") if p.is_dir()):
        hidden = any(part.startswith(".") for part in folder.relative_to(gpu_dir).parts)
        if not hidden and not _part_of_a_run(folder, folders):
            files = sorted(p.name for p in folder.iterdir())
            holds = f"holds {', '.join(files)} but" if files else "is empty and holds"
            raise ValueError(f"{folder}: {holds} no summary.json; every run folder needs the "
                             "summary.json `python -m gpu_backend replay --out DIR` writes: "
                             "replay the run again, or remove the folder")
    return folders


def _part_of_a_run(folder: Path, runs: list[Path]) -> bool:
    """Whether `folder` is a run folder, holds one, or sits inside one."""
    return any(folder == run or folder in run.parents or run in folder.parents for run in runs)


def load_summary(folder: Path) -> RunSummary:
    """A run folder's summary.json (one run), checked as load_run checks it; its CSVs are not
    read (a repeat's, kept as summary.json alone: validation/evidence/README.md)."""
    path = folder / "summary.json"
    data = read_summary_json(path)
    summary = dict(data)
    if isinstance(data.get("runs"), list):
        if len(data["runs"]) != 1:
            raise ValueError(f"{path} holds {len(data['runs'])} runs; "
                             "validation expects one run per folder")
        summary = {**{k: v for k, v in data.items() if k != "runs"}, **data["runs"][0]}
    if "chunk" not in summary:
        raise ValueError(f"{path} has no 'chunk': the run's config is missing")
    check_summary(summary, path)
    for key in MEASURED_SIZES:
        measured_sizes(summary, key, path)  # malformed: named with its path
    config_path = folder / CONFIG_FILE
    if config_path.is_file():  # checked here, so that a bad one is named with its path
        config = EngineConfig.from_json(config_path.read_text(), source=config_path,
                                         recorded=True)
        summary[ENGINE_CONFIG_KEY] = config.to_dict()
    return RunSummary(folder, summary)


def load_run(folder: Path) -> GpuRun:
    """A run folder in full (load_summary's checks, and a replay from before config.json must
    give its engine configuration from its summary's columns, since its simulation needs
    it), with its steps, timeline, requests and transitions."""
    run = load_summary(folder)
    if ENGINE_CONFIG_KEY not in run.summary:
        try:
            legacy_config(run.summary)
        except ValueError as exc:
            raise ValueError(f"{folder / 'summary.json'}: no {CONFIG_FILE} beside it, and its "
                             f"columns do not give the run's engine configuration: "
                             f"{exc}") from None
    steps_path = first_file(folder, "steps.csv")
    if steps_path is None:
        raise ValueError(f"{folder}: no steps.csv (per-step measured times)")
    steps = read_steps_csv(steps_path)
    recorded = run.summary.get("num_engine_steps")
    if not len(steps) and isinstance(recorded, int) and recorded > 0:
        raise ValueError(f"{steps_path}: no steps, but summary.json records num_engine_steps "
                         f"{recorded}; the file was cut short: write it again with the replay")
    timeline = read_numeric_csv(first_file(folder, "timeline*.csv"))
    return GpuRun(folder, run.summary, steps=with_timeline(steps, timeline), timeline=timeline,
                  requests=read_csv_columns(first_file(folder, "requests*.csv")),
                  transitions=read_csv_columns(first_file(folder, "transitions.csv")))


def check_calibration_graphs(calibration: Calibration | Path | None,
                             runs: Sequence[GpuRun]) -> None:
    """Refuse a calibration profiled with piecewise prefill graphs for replays run without
    them, or the other way round: its eager_launch_s was fitted on steps with prefill tokens
    that launch every kernel (eager) or only attention's between graph pieces (piecewise).
    A path is read as sim.core.calibration reads it."""
    if calibration is None:
        return
    if not isinstance(calibration, Calibration):
        calibration = load_calibration(calibration)
    profiled = bool(calibration.piecewise_sizes)
    for run in runs:
        replayed = bool(measured_sizes(run.summary, "piecewise_sizes"))
        if replayed != profiled:
            cal, rep = ("with", "without") if profiled else ("without", "with")
            raise ValueError(
                f"the calibration {calibration.source} was profiled {cal} piecewise CUDA graphs "
                f"but the replay in {run.path} ran {rep} them; re-profile {rep} --piecewise-graphs "
                "(`python -m gpu_backend profile`) to compare these replays")
    kinds = timed_launch_kinds(calibration.data, calibration.source) if profiled else None
    if kinds is None or kinds[0]:
        return
    for run in runs:  # graphs that stop short of the chunk: its longer steps ran fully eager
        sizes = measured_sizes(run.summary, "piecewise_sizes")
        if sizes and max(sizes) < int(run.summary["chunk"]):
            raise ValueError(
                f"the replay in {run.path} captured piecewise graphs up to {max(sizes)} tokens "
                f"and ran its longer steps fully eager, but the calibration {calibration.source} "
                "timed "
                "every step through piecewise graphs, so its eager_launch_s was not measured; "
                f"re-profile with --piecewise-max-tokens {max(sizes)}")
