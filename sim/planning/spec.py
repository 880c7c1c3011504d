"""A sweep described as data (YAML or flags) and its expansion into cases.

The YAML schema is documented, with an example, in ``examples/sweep.yaml``. Every value is
read with its type checked; a wrong one is an error naming the file and the key. Engine
settings left out take `EngineConfig`'s defaults (vLLM's), as they do on the command line.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from sim.core.catalog import MIB
from sim.core.config_flags import setting_default
from sim.core.elastic import Policy
from sim.core.engine_config import DEFAULT_GPU, DEFAULT_MODEL, EngineConfig
from sim.core.settings import BOOL, COUNT, FLOAT, INT, optional, setting_of
from sim.planning.cases import Case, EngineOptions, SyntheticSpec, TraceSpec, parse_length
from sim.recording.metrics import Slo

GRID_KEYS = ("model", "gpu", "tp", "chunk", "policy", "rate_scale", "trace")
TOP_KEYS = ("grid", "engine", "slo", "num_replicas", "calibration", "workers", "out", "trace")
# EngineConfig settings a sweep's cases (sim.planning.cases.EngineOptions) do not carry: a
# sweep runs at their defaults, and its flags and YAML leave them out.
SWEEP_FIXED = ("dtype", "kv_cache_dtype", "quantization", "enable_chunked_prefill",
               "hash_block_tokens")
# The `engine:` keys: EngineOptions' fields, each read as this EngineConfig setting.
OPTION_SETTINGS = {"max_num_seqs": "max_num_seqs",
                   "gpu_memory_utilization": "gpu_memory_utilization",
                   "max_model_len": "max_model_len",
                   "allow_long_max_model_len": "allow_long_max_model_len",
                   "block_size": "block_size",
                   "drain": "drain", "vmm_handle_mib": "vmm_handle_bytes", "reclaim": "reclaim",
                   "detach_behind_step": "detach_behind_step",
                   "enable_prefix_caching": "enable_prefix_caching",
                   "cuda_graph_sizes": "cuda_graph_sizes",
                   "attention_backend": "attention_backend",
                   "async_scheduling": "async_scheduling",
                   "mixed_split_mib": "mixed_split_bytes"}
PIECEWISE_KEYS = {"piecewise_graphs": BOOL, "piecewise_max_tokens": optional(INT)}
# the `engine:` keys given in whole MiB (EngineConfig holds bytes), and what each accepts
MIB_KEYS = {"vmm_handle_mib": COUNT, "mixed_split_mib": INT}
_SETTINGS = {f.name: setting_of(f) for f in fields(EngineConfig)}


@dataclass(frozen=True)
class SweepSpec:
    models: tuple[str, ...]
    gpus: tuple[str, ...]
    tps: tuple[int, ...]
    chunks: tuple[int | None, ...]  # None: vLLM's default for the case's GPU
    policies: tuple[str, ...]
    rate_scales: tuple[float, ...]
    traces: tuple[TraceSpec, ...]
    options: EngineOptions = field(default_factory=EngineOptions)
    slo: Slo = field(default_factory=Slo)
    num_replicas: int = 1
    calibration: Path | None = None
    workers: int | None = None
    out: Path | None = None

    def __post_init__(self) -> None:
        for name in ("models", "gpus", "tps", "chunks", "policies", "rate_scales", "traces"):
            if not getattr(self, name):
                raise ValueError(f"the sweep grid needs at least one value for {name}")
        if self.options.piecewise_graphs and None in self.chunks:
            raise ValueError("piecewise graphs are captured at each case's chunk: give the "
                             "grid's chunk values (--chunk, or grid.chunk)")

    def cases(self, efficiency=None, profile=None, vmm_costs=None) -> list[Case]:
        """One case per grid point, in a fixed nested order (model outermost, policy innermost)."""
        grid = itertools.product(self.models, self.gpus, self.tps, self.traces,
                                 self.rate_scales, self.chunks, self.policies)
        return [
            Case(model=m, gpu=g, tp=tp, chunk=c, policy=p, trace=t, rate_scale=r,
                 options=self.options, slo=self.slo, num_replicas=self.num_replicas,
                 efficiency=efficiency, profile=profile, vmm_costs=vmm_costs)
            for m, g, tp, t, r, c, p in grid
        ]


def engine_options(settings: Mapping[str, Any], piecewise_graphs: bool = False,
                   piecewise_max_tokens: int | None = None) -> EngineOptions:
    """A sweep's fixed engine options from EngineConfig settings (keyed by field name, values
    as EngineConfig holds them); a setting left out takes EngineConfig's default."""
    def get(name: str) -> Any:
        return settings[name] if name in settings else setting_default(name)

    return EngineOptions(
        max_num_seqs=get("max_num_seqs"), gpu_memory_utilization=get("gpu_memory_utilization"),
        max_model_len=get("max_model_len"),
        allow_long_max_model_len=get("allow_long_max_model_len"), block_size=get("block_size"),
        drain=get("drain").value, vmm_handle_mib=get("vmm_handle_bytes") // MIB,
        reclaim=get("reclaim"), detach_behind_step=get("detach_behind_step"),
        enable_prefix_caching=get("enable_prefix_caching"),
        cuda_graph_sizes=get("cuda_graph_sizes"), piecewise_graphs=piecewise_graphs,
        piecewise_max_tokens=piecewise_max_tokens,
        attention_backend=get("attention_backend"), async_scheduling=get("async_scheduling"),
        mixed_split_mib=get("mixed_split_bytes") // MIB)


def load_sweep(path: Path) -> SweepSpec:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read sweep config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with a 'grid' key")
    try:
        return sweep_from_dict(data, base_dir=path.parent)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def sweep_from_dict(data: dict, base_dir: Path = Path(".")) -> SweepSpec:
    _check_keys("sweep config", data, TOP_KEYS)
    grid = data.get("grid") or {}
    _check_keys("grid", grid, GRID_KEYS)
    trace_items = _as_list(grid.get("trace", data.get("trace")))
    if not trace_items:
        raise ValueError("the sweep needs a trace: grid.trace (or trace) as a bundled name, "
                         "a file, {source: ...} or {synthetic: ...}")
    traces = tuple(t for item in trace_items for t in trace_specs(item, base_dir))
    slo = data.get("slo") or {}
    _check_keys("slo", slo, ("ttft_s", "tpot_s"))
    calibration = _read(data, "calibration", _text, "sweep config", None)
    out = _read(data, "out", _text, "sweep config", None)
    return SweepSpec(
        models=_axis(grid, "model", _text, (DEFAULT_MODEL,)),
        gpus=_axis(grid, "gpu", _text, (DEFAULT_GPU,)),
        tps=_axis(grid, "tp", COUNT.decode, (setting_default("tensor_parallel_size"),)),
        chunks=_axis(grid, "chunk", COUNT.decode, (None,)),
        policies=tuple(p.value for p in _axis(grid, "policy", _policy,
                                                   (Policy.STATIC, Policy.ELASTIC))),
        rate_scales=_axis(grid, "rate_scale", _positive, (1.0,)),
        traces=traces,
        options=options_from_yaml(data.get("engine") or {}),
        slo=Slo(_read(slo, "ttft_s", _positive, "slo", None),
                _read(slo, "tpot_s", _positive, "slo", None)),
        num_replicas=_read(data, "num_replicas", COUNT.decode, "sweep config", 1),
        calibration=None if calibration is None else base_dir / calibration,
        workers=_read(data, "workers", COUNT.decode, "sweep config", None),
        out=None if out is None else Path(out),
    )


def options_from_yaml(data: dict) -> EngineOptions:
    """The `engine:` section: EngineOptions' keys, each read as its EngineConfig setting."""
    _check_keys("engine", data, (*OPTION_SETTINGS, *PIECEWISE_KEYS))
    settings = {}
    for key, name in OPTION_SETTINGS.items():
        if key in data:
            codec = MIB_KEYS.get(key, _SETTINGS[name].codec)
            settings[name] = _read(data, key, codec.decode, "engine", None)
            if key in MIB_KEYS:
                settings[name] *= MIB
    piecewise = {k: _read(data, k, codec.decode, "engine", None)
                 for k, codec in PIECEWISE_KEYS.items() if k in data}
    return engine_options(settings, **piecewise)


def trace_specs(item: str | dict, base_dir: Path = Path(".")) -> list[TraceSpec]:
    """Trace specs from one YAML item; a synthetic item with a list of prompts gives several."""
    if isinstance(item, str):
        return [TraceSpec(source=_resolve(item, base_dir))]
    if not isinstance(item, dict):
        raise ValueError(f"a trace is a name, a file or a mapping, got {item!r}")
    if "synthetic" in item:
        _check_keys("trace", item, ("synthetic",))
        return synthetic_specs(item["synthetic"])
    _check_keys("trace", item, ("source", "format", "window", "limit", "sort"))
    if "source" not in item:
        raise ValueError(f"a trace mapping needs 'source' or 'synthetic', got {item!r}")
    window = item.get("window")
    if window is not None and (not isinstance(window, list) or len(window) != 2):
        raise ValueError(f"trace.window is [start_s, end_s], got {window!r}")
    return [TraceSpec(
        source=_resolve(_read(item, "source", _text, "trace", None), base_dir),
        format=_read(item, "format", _text, "trace", None),
        window_s=None if window is None else (FLOAT.decode(window[0]), FLOAT.decode(window[1])),
        limit=_read(item, "limit", COUNT.decode, "trace", None),
        sort=_read(item, "sort", BOOL.decode, "trace", False))]


def synthetic_specs(data: dict) -> list[TraceSpec]:
    keys = ("num_requests", "rate_per_s", "prompt", "output", "arrival", "cv", "seed")
    _check_keys("synthetic", data, keys)
    for needed in ("num_requests", "rate_per_s", "prompt", "output"):
        if needed not in data:
            raise ValueError(f"a synthetic trace needs '{needed}'")
    output = parse_length(data["output"])
    rest = {k: _read(data, k, reader, "synthetic", None)
            for k, reader in (("arrival", _text), ("cv", _positive), ("seed", INT.decode))
            if k in data}
    return [
        TraceSpec(synthetic=SyntheticSpec(
            _read(data, "num_requests", COUNT.decode, "synthetic", None),
            _read(data, "rate_per_s", _positive, "synthetic", None),
            parse_length(prompt), output, **rest))
        for prompt in _as_list(data["prompt"])
    ]


# ------------------------------------------------------------------------ typed readers
def _read(data: Mapping, key: str, reader: Callable[[Any], Any], where: str,
          default: Any) -> Any:
    """data[key] read by `reader` (None or absent: `default`); a wrong type names the key."""
    value = data.get(key)
    if value is None:
        return default
    try:
        return reader(value)
    except ValueError as exc:
        raise ValueError(f"{where}.{key}: {exc}") from None


def _axis(grid: Mapping, key: str, reader: Callable[[Any], Any], default: tuple) -> tuple:
    """grid[key] as a tuple, each value read by `reader` (absent: `default`)."""
    values = _as_list(grid.get(key))
    if not values:
        return default
    out = []
    for i, value in enumerate(values):
        try:
            out.append(reader(value))
        except ValueError as exc:
            raise ValueError(f"grid.{key}[{i}]: {exc}") from None
    return tuple(out)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a name, got {value!r}")
    return value


def _positive(value: Any) -> float:
    number = FLOAT.decode(value)
    if not number > 0:
        raise ValueError(f"expected a number above 0, got {value!r}")
    return number


def _policy(value: Any) -> Policy:
    return Policy.parse(_text(value))


def _resolve(name: str, base_dir: Path) -> str:
    """A relative file path is taken relative to the YAML file; bundled names pass through."""
    candidate = base_dir / name
    return str(candidate) if candidate.is_file() else name


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _check_keys(where: str, data: dict, known: tuple[str, ...]) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping, got {data!r}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; known: {list(known)}")
