"""The calibration file: read, checked and written in one place.

A calibration is a JSON object. The parts the simulator prices with:

    efficiency       sim.core.cost_model.Efficiency's fields (unknown keys are an error)
    activation       the engine's measured activation profile (memory plan), optional
    vmm.costs        measured elastic transition costs (sim.core.elastic.VmmCosts), optional
    piecewise_sizes  the piecewise graphs' token sizes the steps ran at; null: none
    provenance       GPU, versions, date, command, engine kind, model (provenance.py)

and what the fit was made from, kept for refits and reports: model, gpu_preset, gpu,
versions, measurements, attention_measurements, fit_error, setup, host_probe,
attention_backend (the engine's; not the Triton kernel's: every output names it), ...

Every check names the file and the key, and says what to put there: a bad calibration is a
one-line error, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from sim.core.calibration.fit import MIN_LAUNCH_STEPS
from sim.core.calibration.provenance import ENGINE_LABEL, JSON_KEYS, EngineKind, Provenance
from sim.core.cost_model import Efficiency
from sim.core.efficiency import GAP_TERMS, OPTIONAL_FIELDS, measured_gaps
from sim.core.elastic import VmmCosts
from sim.core.memory_plan import ActivationProfile
from sim.core.split_shapes import ATTENTION_BACKENDS, TRITON_ATTENTION

OPTIONAL_EFFICIENCIES = OPTIONAL_FIELDS  # Efficiency's fields that may be null
CARRIED = " -> "  # a carried calibration's source: FILE -> the model (on the GPU) it prices


@dataclass(frozen=True)
class Calibration:
    """A checked calibration: what prices a run, and where it comes from."""

    source: str  # the file it was read from, as the outputs name it
    efficiency: Efficiency
    activation: ActivationProfile | None
    vmm_costs: VmmCosts | None  # None: the simulator's H200 driver figures
    piecewise_sizes: tuple[int, ...]
    provenance: Provenance
    data: dict = field(compare=False, repr=False)  # the whole JSON object

    @property
    def engine(self) -> EngineKind:
        return self.provenance.engine

    def parts(self) -> tuple[Efficiency, ActivationProfile | None, VmmCosts | None]:
        """(efficiency, activation profile, VMM costs): what a RunSpec takes."""
        return self.efficiency, self.activation, self.vmm_costs


def read_json(path: str | Path) -> dict:
    """The JSON object of a calibration file."""
    return read_json_object(path, "calibration JSON",
                            'no "efficiency" object: the file holds a JSON {kind}, a '
                            "calibration is an object")


def read_json_object(path: str | Path, what: str, not_object: str) -> dict:
    """The JSON object in `path`; ValueError naming the file where it cannot be read (`what`
    it should hold) or holds another JSON value (`not_object`, with {kind} its type)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ValueError(f"{path}: cannot read {what}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: " + not_object.format(kind=type(data).__name__))
    return data


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a calibration file (`parse_calibration`)."""
    return parse_calibration(read_json(path), str(path))


def load_efficiency(path: str | Path) -> Efficiency:
    """The efficiencies of a calibration file (checked as `load_calibration` checks it)."""
    return load_calibration(path).efficiency


def save_calibration(path: str | Path, data: dict, source: str | None = None) -> Calibration:
    """Check `data` as a calibration and write it to `path` (folders made as needed); its
    errors name `source` (default: `path`), the file a write through a temporary is for."""
    calibration = parse_calibration(data, str(path) if source is None else source)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return calibration


def parse_calibration(data: Mapping, source: str) -> Calibration:
    """A Calibration of the JSON object `data`; ValueError naming `source` and the key."""
    if not isinstance(data, Mapping):
        raise ValueError(f'{source}: no "efficiency" object: a calibration is a JSON object, '
                         f"not {type(data).__name__}")
    sizes = piecewise_sizes_of(data, source)
    kinds = timed_launch_kinds(data, source)  # checks the measurement records too
    return Calibration(
        source=source, efficiency=efficiency_of(data, source),
        activation=activation_of(data, source, sizes), vmm_costs=vmm_costs_of(data, source),
        piecewise_sizes=sizes, provenance=provenance_of(data, source, sizes, kinds),
        data=dict(data))


def efficiency_of(data: Mapping, source: str) -> Efficiency:
    values = data.get("efficiency")
    known = [f.name for f in fields(Efficiency)]
    if not isinstance(values, dict):
        raise ValueError(f'{source}: no "efficiency" object; expected one with keys '
                         f"{', '.join(known)}")
    unknown = set(values) - set(known)
    if unknown:
        raise ValueError(f"{source}: unknown efficiency keys {sorted(unknown)}; "
                         f"known: {sorted(known)}")
    for name, value in values.items():
        if value is None and name in OPTIONAL_EFFICIENCIES:
            continue
        if not is_number(value):
            kind = "a number or null" if name in OPTIONAL_EFFICIENCIES else "a number"
            raise ValueError(f"{source}: efficiency.{name} is {value!r}; expected {kind}")
    if not all(name in values for name in GAP_TERMS):  # files from before a term: measured
        values = {**measured_gaps(data.get("measurements") or ()), **values}  # on their grid
    try:
        return Efficiency(**values)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def activation_of(data: Mapping, source: str,
                  piecewise_sizes: tuple[int, ...] = ()) -> ActivationProfile | None:
    """The measured activation profile; its non-torch bytes hold the graphs of
    `piecewise_sizes` (the file's), whose largest is its `graph_tokens` unless the file gives
    one."""
    values = data.get("activation")
    if values is None:
        return None
    known = [f.name for f in fields(ActivationProfile)]
    if not isinstance(values, dict) or set(values) - set(known):
        raise ValueError(f'{source}: "activation" needs an object with keys among {known}; '
                         f"got {values!r}")
    for name in ("bytes_per_token", "fixed_bytes"):
        if not is_number(values.get(name)) or values[name] < 0:
            raise ValueError(f"{source}: activation.{name} is {values.get(name)!r}; expected "
                             "a number of bytes >= 0")
    extra = values.get("non_torch_bytes")
    if extra is not None and (not is_number(extra) or extra < 0):
        raise ValueError(f"{source}: activation.non_torch_bytes is {extra!r}; expected a "
                         "number of bytes >= 0, or null (the simulator's own figure)")
    graphs = values.get("graph_tokens")
    if graphs is not None and (not isinstance(graphs, int) or graphs < 0):
        raise ValueError(f"{source}: activation.graph_tokens is {graphs!r}; expected the "
                         "largest piecewise graph's token count (0: none), or leave it out")
    if extra is not None and graphs is None:
        values = {**values, "graph_tokens": max(piecewise_sizes, default=0)}
    return ActivationProfile(**values)


def vmm_costs_of(data: Mapping, source: str) -> VmmCosts | None:
    """A calibration's measured elastic transition costs ("vmm": {"costs": {...}}), or None
    (calibrations without: the simulator keeps its H200 driver figures)."""
    vmm = data.get("vmm")
    if not vmm:
        return None
    costs = vmm.get("costs") if isinstance(vmm, dict) else None
    known = {f.name for f in fields(VmmCosts)}
    if not isinstance(costs, dict) or set(costs) - known:
        raise ValueError(f"{source}: \"vmm\" needs a \"costs\" object with keys among "
                         f"{sorted(known)}; got {costs!r}")
    for name, value in costs.items():
        if not is_number(value):
            raise ValueError(f"{source}: vmm.costs.{name} is {value!r}; expected seconds")
    try:
        return VmmCosts(**costs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: vmm.costs: {exc}") from None


def piecewise_sizes_of(data: Mapping, source: str) -> tuple[int, ...]:
    """The piecewise graphs' token sizes the calibration's steps ran at (null or absent:
    none, a fully eager engine), ascending."""
    sizes = data.get("piecewise_sizes")
    if sizes is None:
        return ()
    if not isinstance(sizes, list) or not all(is_count(s) for s in sizes):
        raise ValueError(f"{source}: piecewise_sizes is {sizes!r}; expected null or a list "
                         "of token counts, as `python -m gpu_backend profile` writes it")
    return tuple(sorted(sizes))


def timed_launch_kinds(data: Mapping, source: str = "calibration") -> tuple[bool, bool] | None:
    """(timed fully eager steps?, timed piecewise-graph steps?) of a calibration from `python
    -m gpu_backend profile`: which of eager_launch_s and piecewise_launch_s its grid measured
    (at least MIN_LAUNCH_STEPS steps each). A step with prefill tokens ran the piecewise
    graphs when one of the profile's "piecewise_sizes" holds its tokens. None: no measurement
    records (a fit of replays)."""
    records = data.get("measurements")
    if not isinstance(records, list) or not records:
        return None
    largest = max(piecewise_sizes_of(data, source) or (0,))
    eager = piecewise = 0
    for index, record in enumerate(records):
        prefills = record.get("prefills") if isinstance(record, dict) else None
        decodes = record.get("num_decodes", 0) if isinstance(record, dict) else None
        if not isinstance(prefills, list) or not is_count(decodes, zero=True) or not all(
                isinstance(p, list) and p and is_count(p[0]) for p in prefills):
            raise ValueError(f"{source}: measurements[{index}] needs \"prefills\" (a list of "
                             "[new tokens, prefix tokens]) and \"num_decodes\" (a count); "
                             f"got {record!r}")
        if not prefills:
            continue
        tokens = sum(p[0] for p in prefills) + decodes
        piecewise += tokens <= largest
        eager += tokens > largest
    return eager >= MIN_LAUNCH_STEPS, piecewise >= MIN_LAUNCH_STEPS


def provenance_of(data: Mapping, source: str, sizes: tuple[int, ...],
                  kinds: tuple[bool, bool] | None) -> Provenance:
    """The "provenance" object, with what the top-level keys say where it is silent (model,
    gpu_preset, gpu, versions): files from before it have those alone. "engine" names the
    engine kind (checked against the piecewise sizes) or, in other words, a variant of the
    engine; where it names no kind, the kind is the piecewise sizes' (`kinds`: the grid's
    timed launch kinds, `timed_launch_kinds`)."""
    record = data.get("provenance", {})
    if not isinstance(record, dict) or set(record) - {*JSON_KEYS, "engine"}:
        raise ValueError(f'{source}: "provenance" needs an object with keys among '
                         f"{[*JSON_KEYS, 'engine']}; got {record!r}")
    for key in (*JSON_KEYS, "engine"):
        if record.get(key) is not None and not isinstance(record[key], str):
            raise ValueError(f"{source}: provenance.{key} is {record[key]!r}; expected a "
                             "string or null")
    fallback = _top_level_provenance(data, source)
    values = {name: record.get(key, fallback.get(name)) for key, name in JSON_KEYS.items()}
    named = record.get("engine")
    if named is not None and not ENGINE_LABEL.match(named.strip().lower()):
        values["engine_variant"] = values["engine_variant"] or named  # words, not a kind
        named = None
    # the profile's engine's attention backend; files without the key ran the Triton kernel
    backend = data.get("attention_backend", TRITON_ATTENTION)
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"{source}: attention_backend is {backend!r}; expected one of "
                         f"{', '.join(ATTENTION_BACKENDS)} (the engine's --attention-backend)")
    if named is not None:
        engine = _named_engine(named, sizes, source)
    else:  # capped where the grid timed enough steps past the sizes fully eager
        engine = EngineKind(bool(sizes), max(sizes) if sizes and kinds and kinds[0] else None)
    return Provenance(**values, engine=engine, attention_backend=str(backend))


def _named_engine(named: str, sizes: tuple[int, ...], source: str) -> EngineKind:
    """The kind "engine" names, checked against the piecewise sizes: a piecewise engine has
    them, an eager one none, and a capped one stops at its cap."""
    engine = EngineKind.parse(named)
    if engine.piecewise != bool(sizes) or (
            engine.max_tokens is not None and engine.max_tokens != max(sizes)):
        raise ValueError(f"{source}: provenance.engine is {named!r} but piecewise_sizes is "
                         f"{list(sizes) or None}; a piecewise engine has sizes (a capped one up "
                         "to its cap), an eager one none")
    return engine


def _top_level_provenance(data: Mapping, source: str) -> dict:
    """Provenance fields from the keys profiles wrote before "provenance" (and still write
    beside it: refits and merges read them)."""
    fit = data.get("fit")
    fit = fit if isinstance(fit, dict) else {}
    versions = data.get("versions")
    versions = versions if isinstance(versions, dict) else {}
    found = {"model": ("model", data.get("model", fit.get("model"))),
             "gpu_preset": ("gpu_preset", data.get("gpu_preset", fit.get("gpu"))),
             "gpu_name": ("gpu", data.get("gpu")),
             **{name.replace("-", "_"): (f"versions.{name}", versions.get(name))
                for name in ("driver", "torch", "triton", "cuda", "cuda-bindings", "flashinfer")}}
    for key, value in found.values():
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{source}: {key} is {value!r}; expected a string")
    return {name: value for name, (_, value) in found.items()}


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_count(value: object, zero: bool = False) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= (0 if zero else 1)
