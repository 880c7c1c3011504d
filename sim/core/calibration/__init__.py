"""Calibrations: the cost model's efficiencies and the engine's measured terms for one model,
GPU and engine kind, in one module that the simulator, the GPU backend and validation share.

    schema.py         the file: load, check (errors name the file and key), save
    provenance.py     what it was measured on and how; the engine kind it prices
    select.py         the shipped calibration of a run, `--calibration none`, naming outputs
    transfer.py       carrying one to a model or GPU without its own (docs/calibration.md)
    fit.py            least squares over the Efficiency fields, the terms a fit may hold
    profile_fit.py    the profile grid's fit and refit, the elastic transitions' costs
    attention_fit.py  the attention's own terms, from its launches timed alone
    merge.py          profiles of one grid taken at other times, merged point by point
    launches.py       attention launches timed alone outside a profile, added to its fit

The GPU timing that produces a calibration (`python -m gpu_backend profile`) stays in
gpu_backend: it needs torch. Everything here is numpy and scipy.
"""

from sim.core.calibration.fit import (
    MIN_LAUNCH_STEPS,
    MIN_PROGRAM_STEPS,
    MIN_SPLIT_STEPS,
    fit_efficiency,
    fit_with_program_term,
    launch_terms,
    num_program_bound,
    split_run_terms_fixed,
    split_term_fixed,
)
from sim.core.calibration.provenance import (
    EngineKind,
    Provenance,
    engine_kinds_of,
    invoked_command,
    profile_provenance,
)
from sim.core.calibration.schema import (
    Calibration,
    load_calibration,
    load_efficiency,
    parse_calibration,
    read_json,
    save_calibration,
    timed_launch_kinds,
    vmm_costs_of,
)
from sim.core.calibration.select import (
    ROOFLINE,
    SHIPPED_DIR,
    UNCALIBRATED,
    attention_mismatch,
    carried_to,
    choose_calibration,
    describe,
    given_calibration,
    parts_of,
    piecewise_mismatch,
    pricing,
    pricing_line,
    select_calibration,
    shipped_path,
    uncalibrated_warning,
)
from sim.core.calibration.transfer import transfer

__all__ = [
    "MIN_LAUNCH_STEPS", "MIN_PROGRAM_STEPS", "MIN_SPLIT_STEPS", "ROOFLINE", "SHIPPED_DIR",
    "UNCALIBRATED", "Calibration", "EngineKind", "Provenance", "attention_mismatch",
    "carried_to", "choose_calibration", "describe", "engine_kinds_of", "fit_efficiency",
    "fit_with_program_term", "given_calibration", "invoked_command", "launch_terms",
    "load_calibration", "load_efficiency", "num_program_bound", "parse_calibration",
    "parts_of", "piecewise_mismatch", "pricing",
    "pricing_line", "profile_provenance", "read_json", "save_calibration", "select_calibration",
    "shipped_path", "split_run_terms_fixed", "split_term_fixed", "timed_launch_kinds", "transfer",
    "uncalibrated_warning", "vmm_costs_of",
]
