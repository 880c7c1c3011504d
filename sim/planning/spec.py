"""A sweep described as data (YAML or flags) and its expansion into cases.

The YAML schema is documented, with an example, in ``examples/sweep.yaml``. Every value is
read with its type checked (sim.planning.yaml_values), and the engine config of every grid
point is built before any case runs, so that the engine's own range checks
(sim.core.engine_checks) refuse an engine value out of range; a wrong value, an empty grid
list or a grid value given twice is an error naming the file and the key, before any case
runs. Engine settings left out take `EngineConfig`'s defaults (vLLM's), as they do on the
command line.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from sim.core.catalog import MIB, get_gpu, get_model
from sim.core.config_flags import given_once, setting_default
from sim.core.elastic import Policy
from sim.core.engine_checks import SettingRangeError
from sim.core.engine_config import DEFAULT_GPU, DEFAULT_MODEL, EngineConfig
from sim.core.settings import BOOL, FLOAT, INT, setting_of
from sim.planning.cases import (
    Case,
    EngineOptions,
    SyntheticSpec,
    TraceSpec,
    check_settings,
    parse_length,
)
from sim.planning.yaml_values import Reader, as_list, axis, check_keys, count, positive, read, text
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
# the piecewise keys, not EngineConfig settings (sim.planning.cases.EngineOptions.engine
# makes piecewise_graph_sizes from them), each with its reader
PIECEWISE_KEYS: dict[str, Reader] = {"piecewise_graphs": BOOL.decode,
                                     "piecewise_max_tokens": count}
# the `engine:` keys given in whole MiB (EngineConfig holds bytes), and what each accepts
MIB_KEYS = {"vmm_handle_mib": INT, "mixed_split_mib": INT}
# the YAML key that gives each EngineConfig setting, named when the engine refuses its value
YAML_KEYS = {**{name: f"engine.{key}" for key, name in OPTION_SETTINGS.items()},
             "tensor_parallel_size": "grid.tp", "max_num_batched_tokens": "grid.chunk"}
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
    check_keys("sweep config", data, TOP_KEYS)
    grid = data.get("grid") or {}
    check_keys("grid", grid, GRID_KEYS)
    trace_items = as_list(grid.get("trace", data.get("trace")))
    if not trace_items:
        raise ValueError("the sweep needs a trace: grid.trace (or trace) as a bundled name, "
                         "a file, {source: ...} or {synthetic: ...}")
    where = "grid.trace" if "trace" in grid else "trace"
    traces = tuple(t for i, item in enumerate(trace_items)
                   for t in _indexed(f"{where}[{i}]", trace_specs, item, base_dir))
    given_once(list(traces), [t.label for t in traces], where)
    slo = data.get("slo") or {}
    check_keys("slo", slo, ("ttft_s", "tpot_s"))
    calibration = read(data, "calibration", text, "sweep config", None)
    out = read(data, "out", text, "sweep config", None)
    spec = SweepSpec(
        models=axis(grid, "model", _known(get_model), (DEFAULT_MODEL,)),
        gpus=axis(grid, "gpu", _known(get_gpu), (DEFAULT_GPU,)),
        tps=axis(grid, "tp", count, (setting_default("tensor_parallel_size"),)),
        chunks=axis(grid, "chunk", count, (None,)),
        policies=tuple(p.value for p in axis(grid, "policy", _policy,
                                                   (Policy.STATIC, Policy.ELASTIC))),
        rate_scales=axis(grid, "rate_scale", positive, (1.0,)),
        traces=traces,
        options=options_from_yaml(data.get("engine") or {}),
        slo=Slo(read(slo, "ttft_s", positive, "slo", None),
                read(slo, "tpot_s", positive, "slo", None)),
        num_replicas=read(data, "num_replicas", count, "sweep config", 1),
        calibration=None if calibration is None else base_dir / calibration,
        workers=read(data, "workers", count, "sweep config", None),
        out=None if out is None else Path(out),
    )
    return _settings_checked(spec)


def _settings_checked(spec: SweepSpec) -> SweepSpec:
    """`spec`, once the engine config of each of its grid points is built: a value the engine
    refuses as out of range is an error naming the YAML key that gave it."""
    points = itertools.product(spec.models, spec.gpus, spec.tps, spec.chunks)
    try:
        check_settings(spec.options, points)
    except SettingRangeError as exc:
        raise ValueError(exc.at(YAML_KEYS.get(exc.setting, exc.flag))) from None
    return spec


def options_from_yaml(data: dict) -> EngineOptions:
    """The `engine:` section: EngineOptions' keys, each read as its EngineConfig setting."""
    check_keys("engine", data, (*OPTION_SETTINGS, *PIECEWISE_KEYS))
    settings = {}
    for key, name in OPTION_SETTINGS.items():
        if key in data:
            codec = MIB_KEYS.get(key, _SETTINGS[name].codec)
            value = read(data, key, codec.decode, "engine", None)
            if value is not None:  # null: the default, as when the key is left out
                settings[name] = value * MIB if key in MIB_KEYS else value
    piecewise = {k: read(data, k, reader, "engine", None)
                 for k, reader in PIECEWISE_KEYS.items() if k in data}
    return engine_options(settings, **piecewise)


def trace_specs(item: str | dict, base_dir: Path = Path(".")) -> list[TraceSpec]:
    """Trace specs from one YAML item; a synthetic item with a list of prompts gives several."""
    if isinstance(item, str):
        return [TraceSpec(source=_resolve(item, base_dir))]
    if not isinstance(item, dict):
        raise ValueError(f"a trace is a name, a file or a mapping, got {item!r}")
    if "synthetic" in item:
        check_keys("trace", item, ("synthetic",))
        return synthetic_specs(item["synthetic"])
    check_keys("trace", item, ("source", "format", "window", "limit", "sort"))
    if "source" not in item:
        raise ValueError(f"a trace mapping needs 'source' or 'synthetic', got {item!r}")
    return [TraceSpec(
        source=_resolve(read(item, "source", text, "trace", None), base_dir),
        format=read(item, "format", text, "trace", None),
        window_s=read(item, "window", _window, "trace", None),
        limit=read(item, "limit", count, "trace", None),
        sort=read(item, "sort", BOOL.decode, "trace", False))]


def synthetic_specs(data: dict) -> list[TraceSpec]:
    keys = ("num_requests", "rate_per_s", "prompt", "output", "arrival", "cv", "seed")
    check_keys("synthetic", data, keys)
    for needed in ("num_requests", "rate_per_s", "prompt", "output"):
        if needed not in data:
            raise ValueError(f"a synthetic trace needs '{needed}'")
    output = parse_length(data["output"])
    if not as_list(data["prompt"]):
        raise ValueError(f"synthetic.prompt: give one or more prompt lengths, got "
                         f"{data['prompt']!r}")
    rest = {k: read(data, k, reader, "synthetic", None)
            for k, reader in (("arrival", text), ("cv", positive), ("seed", INT.decode))
            if k in data}
    return [
        TraceSpec(synthetic=SyntheticSpec(
            read(data, "num_requests", count, "synthetic", None),
            read(data, "rate_per_s", positive, "synthetic", None),
            parse_length(prompt), output, **rest))
        for prompt in as_list(data["prompt"])
    ]


# ------------------------------------------------------------------------ readers
def _policy(value: Any) -> Policy:
    return Policy.parse(text(value))


def _known(load: Callable[[str], Any]) -> Reader:
    """A name (or file) `load` finds, kept as given: one it does not is refused with its
    message (the known names, how to give a file) before any case runs."""
    def reader(value: Any) -> str:
        load(text(value))
        return value

    return reader


def _indexed(where: str, make, *args) -> list:
    """make(*args), an error prefixed with `where` (which list item it came from)."""
    try:
        return make(*args)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _window(value: Any) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"give [start_s, end_s], got {value!r}")
    start_s, end_s = FLOAT.decode(value[0]), FLOAT.decode(value[1])
    if not start_s < end_s:
        raise ValueError(f"give [start_s, end_s] with end_s after start_s, got {value!r}")
    return start_s, end_s


def _resolve(name: str, base_dir: Path) -> str:
    """A relative file path is taken relative to the YAML file; bundled names pass through."""
    candidate = base_dir / name
    return str(candidate) if candidate.is_file() else name
