"""What a calibration was measured on and how: GPU, driver and library versions, the date, the
command, the engine kind and the model.

A number priced from a calibration is only as good as the match between that calibration and
the run it prices, so every calibration carries this record ("provenance" in its JSON) and
every output that a calibration priced names it (`select.describe`).
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sim.core.split_shapes import TRITON_ATTENTION

if TYPE_CHECKING:
    from sim.core.engine_config import EngineConfig

ENGINE_LABEL = re.compile(r"^(eager|piecewise)(\d*)$")


@dataclass(frozen=True)
class EngineKind:
    """How an engine launches a step with prefill tokens, which sets a calibration's launch
    terms: every kernel eagerly, or through piecewise CUDA graphs (attention launched between
    the graph pieces), the graphs perhaps stopping at `max_tokens` (a longer step then runs
    fully eager, as vLLM's default cap of 512 does). A calibration prices runs of its kind."""

    piecewise: bool = False
    max_tokens: int | None = None  # piecewise graphs stop here; None: they reach the chunk

    def __post_init__(self) -> None:
        if self.max_tokens is not None and (not self.piecewise or self.max_tokens < 1):
            raise ValueError(f"engine kind: a cap of {self.max_tokens} tokens needs piecewise "
                             "graphs and at least 1 token")

    @property
    def label(self) -> str:
        """'eager', 'piecewise' or 'piecewise<N>' (the file-name suffix of a shipped one)."""
        if not self.piecewise:
            return "eager"
        return "piecewise" if self.max_tokens is None else f"piecewise{self.max_tokens}"

    @classmethod
    def parse(cls, text: str) -> EngineKind:
        match = ENGINE_LABEL.match(text.strip().lower())
        if match is None or (match.group(1) == "eager" and match.group(2)):
            raise ValueError(f"engine kind {text!r}: expected eager, piecewise or "
                             "piecewise<N> (graphs capped at N tokens)")
        cap = int(match.group(2)) if match.group(2) else None
        return cls(match.group(1) == "piecewise", cap)

    @classmethod
    def of_run(cls, piecewise_sizes: Sequence[int], chunk_tokens: int) -> EngineKind:
        """The kind of a run that pads its prefill steps to `piecewise_sizes` (empty: eager)
        and schedules up to `chunk_tokens` per step."""
        if not piecewise_sizes:
            return cls()
        top = max(piecewise_sizes)
        return cls(True, top if top < chunk_tokens else None)

    @classmethod
    def of_config(cls, config: EngineConfig) -> EngineKind:
        return cls.of_run(config.piecewise_graph_sizes, config.chunk_tokens)

    def fallbacks(self) -> tuple[EngineKind, ...]:
        """Kinds whose calibration can price this one, best first: a capped engine takes an
        uncapped calibration when no capped one exists (its eager launch then unmeasured)."""
        return (self,) if self.max_tokens is None else (self, EngineKind(True))


def engine_kinds_of(configs: Sequence[EngineConfig]) -> EngineKind:
    """One kind for runs that differ only in chunk: a capped kind where any run is capped (its
    calibration measured both launch terms), else the first run's."""
    kinds = [EngineKind.of_config(c) for c in configs]
    return next((k for k in kinds if k.max_tokens is not None), kinds[0])


# The "provenance" object's keys (each a string or null) and the Provenance fields they fill;
# "engine" besides: the engine kind's label, or words naming a variant of the engine.
JSON_KEYS = {"model": "model", "gpu_preset": "gpu_preset", "gpu": "gpu_name",
             "driver": "driver", "torch": "torch", "triton": "triton", "cuda": "cuda",
             "cuda-bindings": "cuda_bindings", "measured_on": "measured_on",
             "command": "command", "fitted_by": "fitted_by", "derived_from": "derived_from",
             "engine_variant": "engine_variant", "flashinfer": "flashinfer"}


@dataclass(frozen=True)
class Provenance:
    model: str | None = None  # sim.core.catalog preset name
    gpu_preset: str | None = None  # the preset whose datasheet rates the efficiencies share
    gpu_name: str | None = None  # the device's own name ("NVIDIA H200")
    engine: EngineKind = EngineKind()
    engine_variant: str | None = None  # what else sets the engine apart (kernels, env flags)
    measured_on: str | None = None  # ISO date the steps were timed
    command: str | None = None  # the command that measured them
    fitted_by: str | None = None  # the command that fitted the efficiencies, where another
    driver: str | None = None
    torch: str | None = None
    triton: str | None = None
    cuda: str | None = None
    cuda_bindings: str | None = None
    flashinfer: str | None = None  # FlashInfer's version, where the steps ran it
    derived_from: str | None = None  # merged or transferred from this calibration
    # the attention backend the profile's steps ran (the file's "attention_backend")
    attention_backend: str = TRITON_ATTENTION

    def to_dict(self) -> dict:
        """The JSON object (keys of JSON_KEYS and "engine"), unset fields left out."""
        record = {key: getattr(self, name) for key, name in JSON_KEYS.items()
                  if getattr(self, name) is not None}
        return {**record, "engine": self.engine.label}

    @property
    def gpu(self) -> str:
        return self.gpu_name or self.gpu_preset or "an unrecorded GPU"


def profile_provenance(*, model: str, gpu_preset: str, gpu_name: str, engine: EngineKind,
                       measured_on: str, command: str, versions: dict) -> Provenance:
    """The record `python -m gpu_backend profile` writes (`versions`: gpu_backend.env's)."""
    return Provenance(model=model, gpu_preset=gpu_preset, gpu_name=gpu_name, engine=engine,
                      measured_on=measured_on, command=command, driver=versions.get("driver"),
                      torch=versions.get("torch"), triton=versions.get("triton"),
                      cuda=versions.get("cuda"), cuda_bindings=versions.get("cuda-bindings"),
                      flashinfer=versions.get("flashinfer"))


def invoked_command() -> str:
    """This process's command line as typed (`python -m gpu_backend profile ...`): what a
    calibration's provenance records as the command that made it."""
    program = Path(sys.argv[0])
    head = (["python", "-m", program.parent.name] if program.name == "__main__.py"
            else ["python", sys.argv[0]])
    return shlex.join(head + sys.argv[1:])
