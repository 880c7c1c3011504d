"""A sweep described as data (YAML or flags) and its expansion into cases.

The YAML schema is documented, with an example, in ``examples/sweep.yaml``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from sim.planning.cases import Case, EngineOptions, SyntheticSpec, TraceSpec, parse_length
from sim.recording.metrics import Slo

GRID_KEYS = ("model", "gpu", "tp", "chunk", "policy", "rate_scale", "trace")
TOP_KEYS = ("grid", "engine", "slo", "num_replicas", "calibration", "workers", "out", "trace")


@dataclass(frozen=True)
class SweepSpec:
    models: tuple[str, ...]
    gpus: tuple[str, ...]
    tps: tuple[int, ...]
    chunks: tuple[int, ...]
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


def load_sweep(path: Path) -> SweepSpec:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read sweep config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with a 'grid' key")
    return sweep_from_dict(data, base_dir=path.parent)


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
    calibration = data.get("calibration")
    out = data.get("out")
    return SweepSpec(
        models=tuple(str(m) for m in _as_list(grid.get("model", "llama-3.1-8b"))),
        gpus=tuple(str(g) for g in _as_list(grid.get("gpu", "h200"))),
        tps=tuple(int(t) for t in _as_list(grid.get("tp", 1))),
        chunks=tuple(int(c) for c in _as_list(grid.get("chunk", 8192))),
        policies=tuple(str(p) for p in _as_list(grid.get("policy", ["static", "elastic"]))),
        rate_scales=tuple(float(r) for r in _as_list(grid.get("rate_scale", 1.0))),
        traces=traces,
        options=engine_options(data.get("engine") or {}),
        slo=Slo(slo.get("ttft_s"), slo.get("tpot_s")),
        num_replicas=int(data.get("num_replicas", 1)),
        calibration=None if calibration is None else base_dir / calibration,
        workers=data.get("workers"),
        out=None if out is None else Path(out),
    )


def engine_options(data: dict) -> EngineOptions:
    known = tuple(f.name for f in fields(EngineOptions))
    _check_keys("engine", data, known)
    return EngineOptions(**data)


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
    if window is not None and len(window) != 2:
        raise ValueError(f"trace window is [start_s, end_s], got {window!r}")
    return [TraceSpec(source=_resolve(str(item["source"]), base_dir), format=item.get("format"),
                      window_s=None if window is None else (float(window[0]), float(window[1])),
                      limit=item.get("limit"), sort=bool(item.get("sort", False)))]


def synthetic_specs(data: dict) -> list[TraceSpec]:
    keys = ("num_requests", "rate_per_s", "prompt", "output", "arrival", "cv", "seed")
    _check_keys("synthetic", data, keys)
    for needed in ("num_requests", "rate_per_s", "prompt", "output"):
        if needed not in data:
            raise ValueError(f"a synthetic trace needs '{needed}'")
    output = parse_length(data["output"])
    rest = {k: data[k] for k in ("arrival", "cv", "seed") if k in data}
    return [
        TraceSpec(synthetic=SyntheticSpec(int(data["num_requests"]), float(data["rate_per_s"]),
                                          parse_length(prompt), output, **rest))
        for prompt in _as_list(data["prompt"])
    ]


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
