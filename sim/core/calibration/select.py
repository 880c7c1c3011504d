"""Which calibration prices a run, and how outputs name it.

The project ships calibrations measured on its GPUs as

    calibration/<gpu>/<model>.json              an eager engine (decode graphs only)
    calibration/<gpu>/<model>-piecewise.json    piecewise CUDA graphs up to the chunk
    calibration/<gpu>/<model>-piecewise<N>.json piecewise graphs capped at N tokens
    calibration/<gpu>/<model>[-<engine>]-<backend>.json   profiled on another attention backend

where <gpu> is any name the GPU catalog knows the GPU by (h200). A run given no calibration
takes the shipped one of its model, GPU, engine kind and attention backend (where none was
profiled on its backend, the Triton kernel's, and `attention_mismatch` says so);
`--calibration none` (or no shipped match) prices with the datasheet roofline and default
efficiencies, and says so.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sim.core.calibration.provenance import EngineKind
from sim.core.calibration.schema import Calibration, load_calibration, timed_launch_kinds
from sim.core.calibration.transfer import transfer
from sim.core.calibration.validated import evidence_line, read_index, validated
from sim.core.catalog import GpuSpec, get_gpu, get_model
from sim.core.compiled import ROOT
from sim.core.split_shapes import FLASHINFER_ATTENTION, TRITON_ATTENTION

SHIPPED_DIR = ROOT / "calibration"
ROOFLINE = "none"  # --calibration none: the datasheet roofline, default efficiencies
UNCALIBRATED = "uncalibrated: datasheet roofline, default efficiencies"


def shipped_path(model_name: str, gpu_name: str, engine_kind: EngineKind | str,
                 root: Path = SHIPPED_DIR,
                 attention_backend: str = TRITON_ATTENTION) -> Path | None:
    """The shipped calibration file for this model, GPU, engine kind and attention backend,
    or None. A capped piecewise engine falls back to the uncapped piecewise calibration
    (EngineKind.fallbacks), another attention backend to the Triton kernel's."""
    kind = EngineKind.parse(engine_kind) if isinstance(engine_kind, str) else engine_kind
    catalogued = catalog_gpu(gpu_name)
    if catalogued is None:  # a GPU from a spec file: nothing is shipped for it
        return None
    model, gpu = get_model(model_name).name, catalogued.name
    backends = dict.fromkeys((attention_backend, TRITON_ATTENTION))
    for folder in _gpu_folders(gpu, root):
        for backend in backends:
            for candidate in kind.fallbacks():
                suffix = "" if not candidate.piecewise else f"-{candidate.label}"
                tail = "" if backend == TRITON_ATTENTION else f"-{backend}"
                path = folder / f"{model}{suffix}{tail}.json"
                if path.is_file():
                    return path
    return None


def select_calibration(model_name: str, gpu_name: str, engine_kind: EngineKind | str,
                       root: Path = SHIPPED_DIR,
                       attention_backend: str = TRITON_ATTENTION) -> Calibration | None:
    """The shipped calibration of this model, GPU, engine kind and attention backend
    (`shipped_path`), checked to be what its place says; None where none is shipped."""
    path = shipped_path(model_name, gpu_name, engine_kind, root, attention_backend)
    if path is None:
        return None
    calibration = replace(load_calibration(path), source=str(_shown(path, root)))
    model, gpu = get_model(model_name).name, get_gpu(gpu_name).name
    found = calibration.provenance
    if found.model != model or (found.gpu_preset is not None and found.gpu_preset != gpu):
        raise ValueError(f"{calibration.source}: measured {found.model} on {found.gpu_preset}, "
                         f"but filed as {model} on {gpu}; move it to where its provenance says")
    return calibration


def choose_calibration(choice: str | Path | None, model_name: str, gpu_name: str,
                       engine_kind: EngineKind | str, root: Path = SHIPPED_DIR,
                       attention_backend: str = TRITON_ATTENTION) -> Calibration | None:
    """What prices a run given `--calibration choice`: None, the shipped one of the run's
    model, GPU, engine and attention backend (if any); else `given_calibration(choice)`,
    carried to the run's model and GPU (`carried_to`)."""
    if choice is None:
        return select_calibration(model_name, gpu_name, engine_kind, root, attention_backend)
    return carried_to(given_calibration(choice), model_name, gpu_name)


def carried_to(calibration: Calibration | None, model_name: str,
               gpu_name: str) -> Calibration | None:
    """`calibration` as it prices `model_name` on `gpu_name`: itself where its provenance
    records that model and GPU (or no model), else carried there by `transfer` (launch terms
    by layer count, activation bytes by the models' analytic ratio), whose provenance says
    so: every output's pricing line then reads "transferred from ...", and no validated slice
    vouches for it (docs/calibration.md)."""
    if calibration is None or calibration.provenance.model is None:
        return calibration
    model, gpu = get_model(model_name).name, catalog_gpu(gpu_name)
    found = calibration.provenance
    if found.model == model and (gpu is None or found.gpu_preset in (None, gpu.name)):
        return calibration
    return transfer(calibration, model, gpu)  # a GPU from a spec file: the source's named


def catalog_gpu(name: str) -> GpuSpec | None:
    """The catalog's GPU of that name or alias; None for one read from a spec file."""
    try:
        return get_gpu(name)
    except ValueError:
        return None


def given_calibration(choice: str | Path) -> Calibration | None:
    """The calibration a user named: 'none', nothing (the roofline); else that file."""
    if str(choice).strip().lower() == ROOFLINE:
        return None
    return load_calibration(choice)


def parts_of(calibration: Calibration | None) -> tuple:
    """(efficiency, activation profile, VMM costs) of `calibration`; Nones without one (the
    cost model's defaults, the analytic memory plan, the H200 driver figures)."""
    return (None, None, None) if calibration is None else calibration.parts()


def piecewise_mismatch(calibration: Calibration | None, piecewise: bool,
                       capped: bool = False) -> str | None:
    """What to say when a calibration was profiled with piecewise CUDA graphs and the run does
    not price them, or the other way round (its launch terms are the other engine's), or when
    the run's graphs stop short of its chunk (`capped`: --piecewise-max-tokens) but the profile
    timed no fully eager step, so the eager_launch_s those steps take was not measured; None
    when they agree or there is no calibration."""
    if calibration is None:
        return None
    source, sizes = calibration.source, calibration.piecewise_sizes
    if bool(sizes) == piecewise:
        kinds = timed_launch_kinds(calibration.data, source)
        if piecewise and capped and kinds is not None and not kinds[0]:
            return (f"{source} timed every step through piecewise graphs (up to {max(sizes)} "
                    "tokens), so its eager_launch_s was not measured; the steps past "
                    "--piecewise-max-tokens are priced with it: profile with the same "
                    "--piecewise-max-tokens")
        return None
    if sizes:
        return (f"{source} was profiled with piecewise CUDA graphs (its launch terms are "
                "theirs): add --piecewise-graphs to price prefill steps as that engine ran them")
    return (f"{source} was profiled without piecewise CUDA graphs (its eager_launch_s is a "
            "fully eager step's): --piecewise-graphs pads the steps but keeps that launch time")


def pricing_line(calibration: Calibration | None) -> str:
    """The lines a printed table ends with: what priced it, and how close what it prices came
    to the GPU replays it was validated against (`validated.evidence_line`)."""
    evidence = evidence_line(calibration, read_index())
    return f"pricing: {describe(calibration)}" + (f"\n{evidence}" if evidence else "")


def describe(calibration: Calibration | None) -> str:
    """One line naming what priced an output: the file, its GPU, model, engine and date."""
    if calibration is None:
        return UNCALIBRATED
    p = calibration.provenance
    date = f"measured {p.measured_on}" if p.measured_on else "date measured not recorded"
    said = [p.engine_variant] if p.engine_variant else []
    if p.attention_backend != TRITON_ATTENTION:  # every output says what the steps ran
        said.append(f"{p.attention_backend} attention")
    variant = f" ({'; '.join(said)})" if said else ""
    derived = f"; {p.derived_from}" if p.derived_from else ""
    return (f"{calibration.source} ({p.gpu}, {p.model or 'an unrecorded model'}, "
            f"{p.engine.label} engine{variant}, {date}{derived})")


def pricing(calibration: Calibration | None) -> dict:
    """What priced an output, for its JSON: the line `describe` prints, the file, its
    provenance and what the validation evidence says of it (`validated`: the evidence index's
    entry, null where no validated slice is priced by it; all but the line null where
    uncalibrated)."""
    if calibration is None:
        return {"description": UNCALIBRATED, "calibration": None, "provenance": None,
                "validated": None}
    return {"description": describe(calibration), "calibration": calibration.source,
            "provenance": calibration.provenance.to_dict(),
            "validated": validated(calibration, read_index())}


def uncalibrated_warning(model_name: str, gpu_name: str, engine_kind: EngineKind | str,
                         forced: bool) -> str:
    """The stderr line of a run priced without a calibration: why, and what to give."""
    kind = EngineKind.parse(engine_kind) if isinstance(engine_kind, str) else engine_kind
    if forced:
        return f"warning: {UNCALIBRATED} (--calibration none)"
    gpu = catalog_gpu(gpu_name)
    return (f"warning: {UNCALIBRATED}: no calibration ships for {get_model(model_name).name} "
            f"on {gpu_name if gpu is None else gpu.name} for the {kind.label} engine; measure "
            "one with `python -m gpu_backend profile` and pass --calibration FILE")


def _gpu_folders(gpu: str, root: Path) -> list[Path]:
    """The folders under `root` named for GPU preset `gpu` (by its name or an alias)."""
    if not root.is_dir():
        return []
    folders = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            if get_gpu(folder.name).name == gpu:
                folders.append(folder)
        except ValueError:  # a folder of other files (profiles, host fits)
            continue
    return folders


def _shown(path: Path, root: Path) -> Path:
    """A shipped file as outputs name it: relative to the project (calibration/h200/...)."""
    try:
        return path.relative_to(root.parent)
    except ValueError:
        return path


def attention_mismatch(calibration: Calibration | None, backends: set[str]) -> str | None:
    """What to say when runs on the attention `backends` are priced by a calibration whose
    profile ran no step the way they run theirs: SPLIT's terms then keep their defaults (one
    H200's cuDNN measurement), or the Triton prefill path's its fit from whole steps; None
    when the profile timed what the runs use, or there is no calibration."""
    if calibration is None:
        return None
    profiled = calibration.provenance.attention_backend
    others = backends - {profiled}
    if FLASHINFER_ATTENTION in others:
        terms = ("its Triton prefill terms, defaults on a split profile" if profiled == "split"
                 else "the Triton kernel's attention terms of that profile")
        return (f"{calibration.source} was profiled on the {profiled} attention backend, not "
                f"flashinfer: FlashInfer's prefill is priced at {terms}; profile with "
                "--attention-backend flashinfer to fit it")
    if profiled == FLASHINFER_ATTENTION and others:
        return (f"{calibration.source} was profiled on the flashinfer attention backend: "
                f"steps on {', '.join(sorted(others))} are priced at FlashInfer's attention "
                "terms, SPLIT's at their defaults and decode rows beside a chunk at "
                "FlashInfer's pair rate (no step of its profile ran them); profile with "
                f"--attention-backend {sorted(others)[0]} to fit theirs")
    if profiled == TRITON_ATTENTION and backends - {TRITON_ATTENTION}:
        return (f"{calibration.source} was profiled on the triton attention backend, which "
                "runs no SPLIT step: SPLIT is priced at its default cuDNN rate (one H200's "
                "measurement) and the activation reserve at the Triton kernel's (SPLIT's "
                "buffers add to it); profile with --attention-backend "
                f"{sorted(backends - {TRITON_ATTENTION})[0]} to fit it")
    if profiled == "split" and backends - {"split"}:
        return (f"{calibration.source} was profiled on the split attention backend, whose "
                "prefill steps never run the Triton kernel: its Triton prefill terms are "
                "defaults; profile with --attention-backend auto")
    return None
