"""Which calibration prices each case of a sweep or plan, and the lines that say so.

A sweep may span several models and GPUs; a calibration is measured for one model, GPU and
engine kind. Given `--calibration FILE` (or a sweep YAML's), that file prices every case; given
none, each case takes the calibration shipped for its own model, GPU and engine
(sim.core.calibration.select), and the cases without one are priced by the datasheet roofline
with default efficiencies, with a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sim.core.calibration import (
    SHIPPED_DIR,
    Calibration,
    EngineKind,
    attention_mismatch,
    choose_calibration,
    describe,
    parts_of,
    uncalibrated_warning,
)
from sim.core.calibration.coverage import StepExtent, grid_extent, widest
from sim.core.calibration.validated import evidence_line, read_index
from sim.core.catalog import get_gpu, get_model
from sim.planning.cases import Case, EngineOptions


def options_engine(options: EngineOptions) -> EngineKind:
    """The engine kind cases of these options run (piecewise graphs, capped or not)."""
    cap = options.piecewise_max_tokens if options.piecewise_graphs else None
    return EngineKind(options.piecewise_graphs, cap)


def case_engine(case: Case) -> EngineKind:
    return options_engine(case.options)


def price_cases(cases: Sequence[Case], choice: str | Path | None
                ) -> tuple[list[Case], list[Calibration | None]]:
    """Each case with the calibration that prices it (`choice` for every case, or each case's
    shipped one), and that calibration (None: the roofline). A case whose model or GPU is
    unknown is left as it is: running it reports that."""
    found: dict[tuple, Calibration | None] = {}
    priced: list[Case] = []
    calibrations: list[Calibration | None] = []
    for case in cases:
        try:
            key = (get_model(case.model).name, get_gpu(case.gpu).name, case_engine(case),
                   SHIPPED_DIR, case.options.attention_backend)
        except ValueError:
            priced.append(case)
            calibrations.append(None)
            continue
        if key not in found:
            found[key] = choose_calibration(choice, *key)
        efficiency, profile, vmm_costs = parts_of(found[key])
        priced.append(replace(case, efficiency=efficiency, profile=profile,
                              vmm_costs=vmm_costs))
        calibrations.append(found[key])
    return priced, calibrations


def pricing_lines(cases: Sequence[Case], calibrations: Sequence[Calibration | None],
                  forced: bool) -> tuple[list[str], list[str]]:
    """(one `pricing:` line per distinct calibration, each followed by its `evidence:` line
    (sim.core.calibration.validated), one warning per model, GPU and engine
    priced uncalibrated), in case order."""
    lines: dict[str, None] = {}
    warnings: dict[str, None] = {}
    index = read_index()
    for case, calibration in zip(cases, calibrations, strict=True):
        lines.setdefault(f"pricing: {describe(calibration)}", None)
        evidence = evidence_line(calibration, index)
        if evidence:
            lines.setdefault(evidence, None)
        mismatch = attention_mismatch(calibration, {case.options.attention_backend})
        if mismatch:
            warnings.setdefault(mismatch, None)
        if calibration is None:
            try:
                warning = uncalibrated_warning(case.model, case.gpu, case_engine(case), forced)
            except ValueError:  # an unknown model or GPU: its row says so
                continue
            warnings.setdefault(warning, None)
    return list(lines), list(warnings)


def calibration_grids(calibrations: Sequence[Calibration | None]
                      ) -> dict[str, tuple[StepExtent, str]]:
    """Each distinct calibration's grid extent and file, by the `pricing` text a sweep row
    carries (`describe`); read before the cases run, so a bad grid record fails first."""
    grids: dict[str, tuple[StepExtent, str]] = {}
    for calibration in calibrations:
        if calibration is None or describe(calibration) in grids:
            continue
        grid = grid_extent(calibration.data, calibration.source)
        if grid is not None:
            grids[describe(calibration)] = (grid, calibration.source)
    return grids


def past_grid_lines(rows: Sequence[dict], grids: dict[str, tuple[StepExtent, str]]) -> list[str]:
    """One note per calibration whose grid some sweep rows went past (sim.core.calibration
    .coverage): how many of its rows, and how far the largest went; each row's own extent is
    in its step_extent_* columns."""
    lines = []
    for pricing, (grid, source) in grids.items():
        priced = [row for row in rows if row.get("pricing") == pricing and row.get("fits")]
        extents = [e for e in (StepExtent.from_row(row) for row in priced) if e is not None]
        past = [e for e in extents if e.past(grid)]
        largest = widest(past)
        if largest is not None:
            lines.append(f"note: {len(past)} of {len(priced)} rows priced by {source} have steps "
                         f"past its grid, priced by carrying its fitted rates beyond what it "
                         f"timed (their step_extent_* columns): up to {'; '.join(largest.past(grid))}")
    return lines
