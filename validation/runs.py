"""GPU replay outputs, one folder per run, and the simulator configuration they imply.

A folder written by `python -m gpu_backend replay --out DIR` holds:

    summary.json       the simulator's summary keys for the run, plus the run's configuration
                       (policy, chunk, model, gpu, tensor_parallel_size, max_num_seqs, ...), the
                       trace slice (trace, limit, window, rate_scale) and measured memory fields.
                       Either one summary object or the simulator's {"trace", "runs": [one]}.
    config.json        the EngineConfig the replay ran (EngineConfig.to_json), which the
                       simulation takes as it is; replays written before it are read from
                       summary.json's columns (legacy_config)
    steps.csv          one row per executed step (see validation.steps)
    timeline*.csv      the simulator's timeline columns (optional)
    requests*.csv      the simulator's request columns (optional)
    transitions.csv    each elastic transition with its phases (optional)

Each CSV may be gzip-compressed (`steps.csv.gz`, ...), as the committed replays are.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sim.core.calibration import Calibration, load_calibration, timed_launch_kinds
from sim.core.catalog import GPUS, get_gpu, get_model
from sim.core.elastic import DrainStrategy, Policy
from sim.core.engine_config import EngineConfig
from traces import Trace, load_trace
from traces.bundled import BUNDLED
from validation.steps import StepTable, open_csv, read_steps_csv

REPO_ROOT = Path(__file__).resolve().parents[1]
# Where the measured KV capacity may sit in a GPU summary, most specific first.
MEASURED_KV_KEYS = ("measured_kv_capacity_tokens", "kv_capacity_tokens_measured",
                    "kv_capacity_tokens")
MEASURED_KV_BLOCK_KEYS = ("measured_num_kv_blocks", "num_kv_blocks_allocated", "num_kv_blocks")
# The EngineConfig a replay ran (gpu_backend.engine.replay.CONFIG_FILE), and the summary key
# load_summary keeps it under.
CONFIG_FILE = "config.json"
ENGINE_CONFIG_KEY = "engine_config"


@dataclass
class TraceSlice:
    """Which requests of which trace a run replayed (the GPU summary records it)."""

    trace: str
    format: str | None = None
    limit: int | None = None
    window_s: tuple[float, float] | None = None
    rate_scale: float = 1.0
    num_requests: int | None = None  # what the GPU run replayed, to check the slice against

    def load(self) -> Trace:
        trace = load_trace(_resolve_trace(self.trace), self.format, window_s=self.window_s,
                           limit=self.limit, rate_scale=self.rate_scale)
        if self.num_requests is not None and len(trace) != self.num_requests:
            raise ValueError(
                f"the trace slice ({self.describe()}) has {len(trace)} requests but the GPU run "
                f"replayed {self.num_requests}; pass the replay's --trace/--limit/--window/"
                f"--rate-scale to compare")
        return trace

    def describe(self) -> str:
        return (f"{self.trace}, limit {self.limit}, window {self.window_s}, "
                f"rate x{self.rate_scale:g}")

    def to_dict(self) -> dict:
        return {"trace": self.trace, "format": self.format, "limit": self.limit,
                "window_s": list(self.window_s) if self.window_s else None,
                "rate_scale": self.rate_scale, "num_requests": self.num_requests}


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
    """Every folder under `gpu_dir` (itself included) that holds a summary.json."""
    folders = sorted({p.parent for p in gpu_dir.rglob("summary.json")})
    if not folders:
        raise ValueError(f"{gpu_dir}: no summary.json found; expected one folder per GPU run "
                         "written by `python -m gpu_backend replay --out DIR`")
    return folders


def load_summary(folder: Path) -> RunSummary:
    """A run folder's summary.json (one run), checked as load_run checks it; its CSVs are not
    read (a repeat's, kept as summary.json alone: validation/evidence/README.md)."""
    data = json.loads((folder / "summary.json").read_text())
    summary = dict(data)
    if isinstance(data.get("runs"), list):
        if len(data["runs"]) != 1:
            raise ValueError(f"{folder}/summary.json holds {len(data['runs'])} runs; "
                             "validation expects one run per folder")
        summary = {**{k: v for k, v in data.items() if k != "runs"}, **data["runs"][0]}
    if "chunk" not in summary:
        raise ValueError(f"{folder}/summary.json has no 'chunk': the run's config is missing")
    for key in MEASURED_SIZES:
        measured_sizes(summary, key, folder / "summary.json")  # malformed: named with its path
    config_path = folder / CONFIG_FILE
    if config_path.is_file():  # checked here, so that a bad one is named with its path
        config = EngineConfig.from_json(config_path.read_text(), source=config_path)
        summary[ENGINE_CONFIG_KEY] = config.to_dict()
    return RunSummary(folder, summary)


def load_run(folder: Path) -> GpuRun:
    run = load_summary(folder)
    steps_path = _first(folder, "steps.csv")
    if steps_path is None:
        raise ValueError(f"{folder}: no steps.csv (per-step measured times)")
    steps = read_steps_csv(steps_path)
    timeline = _read_numeric_csv(_first(folder, "timeline*.csv"))
    return GpuRun(folder, run.summary, steps=_with_timeline(steps, timeline), timeline=timeline,
                  requests=_read_csv_columns(_first(folder, "requests*.csv")),
                  transitions=_read_csv_columns(_first(folder, "transitions.csv")))


def _with_timeline(steps: StepTable, timeline: dict[str, np.ndarray] | None) -> StepTable:
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


def engine_config(summary: dict, gpu_name: str | None = None) -> EngineConfig:
    """The EngineConfig a GPU run used: its config.json (which `load_summary` puts in the
    summary under ENGINE_CONFIG_KEY), else, for a replay written before config.json, one
    rebuilt from its summary's columns (`legacy_config`). `gpu_name` (a preset or a device
    name) replaces its GPU."""
    saved = summary.get(ENGINE_CONFIG_KEY)
    config = (EngineConfig.from_dict(saved, CONFIG_FILE) if saved is not None
              else legacy_config(summary))
    return config if gpu_name is None else config.with_(gpu=_gpu(gpu_name))


# The defaults a replay written before config.json ran under where its summary has no value:
# max_model_len 32,768 (the memory plan's then), prefix caching off, the preempt drain.
LEGACY_DEFAULTS = {"max_model_len": 32768, "enable_prefix_caching": False, "drain": "preempt",
                   "gpu": "h200", "tensor_parallel_size": 1, "gpu_memory_utilization": 0.9,
                   "block_size": 16, "policy": "static", "vmm_handle_bytes": 512 * 1024**2}


def legacy_config(summary: dict) -> EngineConfig:
    """The configuration of a replay without config.json, from its summary's columns (the
    graph sizes from what it measured), with LEGACY_DEFAULTS where a column is missing."""
    def get(key: str):
        value = summary.get(key)
        return LEGACY_DEFAULTS.get(key) if value is None else value

    return EngineConfig(
        model=get_model(str(summary["model"])), gpu=_gpu(str(get("gpu"))),
        tensor_parallel_size=int(get("tensor_parallel_size")),
        max_num_batched_tokens=int(summary["chunk"]), max_num_seqs=get("max_num_seqs"),
        gpu_memory_utilization=float(get("gpu_memory_utilization")),
        max_model_len=int(get("max_model_len")), block_size=int(get("block_size")),
        policy=Policy.parse(str(get("policy"))), drain=DrainStrategy.parse(str(get("drain"))),
        vmm_handle_bytes=int(get("vmm_handle_bytes")),
        reclaim=str(summary.get("reclaim") or _default_reclaim(summary)),
        enable_prefix_caching=bool(get("enable_prefix_caching")),
        cuda_graph_sizes=measured_sizes(summary, "graph_sizes"),
        piecewise_graph_sizes=measured_sizes(summary, "piecewise_sizes"),
    )


# What the capture sizes a replay records under "measured" count.
MEASURED_SIZES = {"graph_sizes": "batch sizes (decode graphs)",
                  "piecewise_sizes": "token counts (piecewise prefill graphs)"}


def measured_sizes(summary: dict, key: str, source: object = "summary.json") -> tuple[int, ...]:
    """The capture sizes a gpu_backend replay recorded as measured.`key` (a MEASURED_SIZES
    key), ascending; () when absent or null (nothing padded). `source` names the file in
    errors."""
    measured = summary.get("measured")
    sizes = measured.get(key) if isinstance(measured, dict) else None
    return _sizes(sizes, source, f"measured.{key}", MEASURED_SIZES[key])


def _sizes(sizes: object, source: object, field: str, what: str) -> tuple[int, ...]:
    if sizes is None:
        return ()
    if not isinstance(sizes, list) or not all(isinstance(s, int) and not isinstance(s, bool)
                                              and s > 0 for s in sizes):
        raise ValueError(f"{source}: {field} is {sizes!r}; expected null or a list of positive "
                         f"{what}, as `python -m gpu_backend` writes it")
    return tuple(sorted(sizes))


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


def _default_reclaim(summary: dict) -> str:
    """What a summary without a reclaim column ran: gpu_backend replays release the
    reserve's handles; the simulator then remapped them."""
    return "release" if summary.get("executor") == "gpu" else "remap"


def trace_slice(summary: dict, override: TraceSlice | None = None) -> TraceSlice:
    """The trace slice recorded in a GPU summary; `override` (from flags) wins if given."""
    expected = summary.get("num_trace_requests")
    expected = int(expected) if expected is not None else None
    if override is not None:
        return replace(override, num_requests=expected)
    trace = summary.get("trace_path") or summary.get("trace")
    if not trace:
        raise ValueError("the GPU summary does not record its trace; pass --trace (and "
                         "--limit/--window/--rate-scale as used for the replay)")
    window = summary.get("window_s") or summary.get("window")
    if isinstance(window, str):
        start, _, end = window.partition(":")
        window = (float(start or 0), float(end or "inf"))
    limit = summary.get("limit", summary.get("trace_limit"))
    rate_scale = float(summary.get("rate_scale") or 1.0)
    if limit is None and not window and "rate_scale" not in summary and expected is not None:
        # gpu_backend records only the trace file and its request count; a run of the first
        # N requests (--limit N) is the one slice that count pins down, checked on load.
        limit = expected
    return TraceSlice(str(trace), summary.get("trace_format") or summary.get("format"),
                      int(limit) if limit is not None else None,
                      tuple(window) if window else None, rate_scale, expected)


def _gpu(name: str):
    """A GPU preset from a preset name or a device name such as 'NVIDIA H200'."""
    try:
        return get_gpu(name)
    except ValueError:
        lowered = name.lower().replace(" ", "-")
        for preset in sorted(GPUS, key=len, reverse=True):
            if preset.split("-")[0] in lowered:
                return GPUS[preset]
        raise


def _resolve_trace(name: str) -> str:
    """A recorded trace path that exists here (or under the repository, as a slice's own
    trace is named), else the bundled trace with that file name."""
    if Path(name).is_file() or name.strip().lower() in BUNDLED:
        return name
    if (REPO_ROOT / name).is_file():
        return str(REPO_ROOT / name)
    for bundled_name, path in BUNDLED.items():
        if Path(name).name == path.name:
            return bundled_name
    return name  # load_trace says plainly that it is missing


def _first(folder: Path, pattern: str) -> Path | None:
    """The first file matching `pattern`, or its gzip-compressed twin (`pattern`.gz)."""
    matches = sorted(folder.glob(pattern)) or sorted(folder.glob(pattern + ".gz"))
    return matches[0] if matches else None


def _read_numeric_csv(path: Path | None) -> dict[str, np.ndarray] | None:
    if path is None:
        return None
    with open_csv(path) as f:
        data = np.genfromtxt(f, delimiter=",", names=True, ndmin=1)
    return {name: np.atleast_1d(data[name]).astype(np.float64) for name in data.dtype.names}


def _read_csv_columns(path: Path | None) -> dict[str, np.ndarray] | None:
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
