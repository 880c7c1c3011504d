"""GPU-style run folders produced by the simulator itself, for tests and dry runs.

A simulation with known (say, perturbed) efficiencies written in the GPU engine's layout is a
"measurement" whose truth is known: `compare` calibrated with those efficiencies must report
near-zero errors, and the fit must recover them. `python -m validation fake-gpu` writes such
folders so the whole pipeline can be tried without a GPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from sim.core.cost_model import Efficiency
from sim.core.memory_plan import ActivationProfile
from sim.recording.outputs import slug, write_request_csv, write_timeline_csv
from sim.runner import RunSpec
from validation.runs import CONFIG_FILE, TraceSlice
from validation.simside import simulate_logged
from validation.step_table import write_steps_csv


def write_gpu_style_run(out_dir: Path, spec: RunSpec, ts: TraceSlice, *,
                        noise_rel: float = 0.0, seed: int = 0) -> Path:
    """Simulate `spec` on `ts` and write summary.json, config.json, steps.csv, timeline and
    requests CSVs.

    `noise_rel` multiplies every step time by a lognormal factor of that relative spread
    (measurement noise) in steps.csv only; the summary stays the simulated one.
    """
    trace = ts.load()
    result, recorder = simulate_logged(spec, trace)
    folder = out_dir / slug(spec.label)
    folder.mkdir(parents=True, exist_ok=True)
    summary = dict(result.summary)
    summary.update({
        "trace": ts.trace, "trace_format": ts.format, "limit": ts.limit,
        "window_s": list(ts.window_s) if ts.window_s else None, "rate_scale": ts.rate_scale,
        "gpu_memory_utilization": spec.engine.gpu_memory_utilization,
        "max_model_len": spec.engine.max_model_len,
        "enable_prefix_caching": spec.engine.enable_prefix_caching,
        "measured_kv_capacity_tokens": summary["kv_capacity_tokens"],
        "executor": "simulator (synthetic GPU-style output)",
        "synthetic_efficiency": asdict(spec.efficiency or Efficiency()),
        # the capture sizes a gpu_backend replay records (validation.runs.measured_sizes)
        "measured": {"graph_sizes": list(spec.engine.cuda_graph_sizes) or None,
                     "piecewise_sizes": list(spec.engine.piecewise_graph_sizes) or None},
    })
    doc = {"trace": ts.trace, "num_trace_requests": len(trace), "runs": [summary]}
    (folder / "summary.json").write_text(json.dumps(doc, indent=2))
    (folder / CONFIG_FILE).write_text(spec.engine.to_json())  # as a GPU replay writes it
    table = recorder.table()
    if noise_rel > 0:
        rng = np.random.default_rng(seed)
        table = table.with_durations(table.duration_s * rng.lognormal(0.0, noise_rel, len(table)))
    write_steps_csv(folder / "steps.csv", table, recorder.step_chunks)
    name = slug(spec.label)
    write_request_csv(folder / f"requests_{name}.csv",
                      [q for rec in result.recorders for q in rec.requests])
    write_timeline_csv(folder / f"timeline_{name}.csv", result.recorders)
    return folder


def write_calibration_json(path: Path, efficiency: Efficiency,
                           profile: ActivationProfile | None = None) -> Path:
    data: dict = {"efficiency": asdict(efficiency)}
    if profile is not None:
        data["activation"] = asdict(profile)
    path.write_text(json.dumps(data, indent=2))
    return path
