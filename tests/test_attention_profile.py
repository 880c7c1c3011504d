"""The profile's attention timed alone: which steps it times, and how its fit sets the
attention's own terms before the whole-step fit (gpu_backend.engine.attention_profile)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import numpy as np
import pytest

from gpu_backend.engine.attention_profile import (
    ATTENTION_PARAMETERS,
    attention_inputs,
    attention_records,
    attention_shapes,
    fit_attention,
)
from gpu_backend.engine.calibrate import refit_calibration
from gpu_backend.engine.profile_grid import default_grid
from gpu_backend.engine.shapes import scheduler_output
from sim.core.catalog import get_gpu, get_model
from sim.core.cost_model import CostArgs, Efficiency

LLAMA_8B, H200 = get_model("llama-3.1-8b"), get_gpu("h200")
ARGS = CostArgs(LLAMA_8B, H200)
TRUE = Efficiency(linear_compute=0.66, memory=0.61, kv_memory=0.83, attention_compute=0.35,
                  step_overhead_s=2e-3, per_seq_overhead_s=1e-5, eager_launch_s=0.013,
                  attention_program=0.3, attention_program_serial=0.6,
                  attention_query_s=3e-9, mixed_decode_compute=0.25)


def attention_times(eff: Efficiency, shapes) -> np.ndarray:
    cost = ARGS.cost_model(eff)
    return np.array([cost.step(scheduler_output(s)).attention_s for s in shapes])


def calibration(step_eff: Efficiency, attention_eff: Efficiency | None) -> dict:
    """A stored profile: whole steps priced with `step_eff`, the attention alone with
    `attention_eff` (None: a profile from before the attention was timed alone)."""
    grid = default_grid()
    cost = ARGS.cost_model(step_eff)
    data = {"model": "llama-3.1-8b", "gpu_preset": "h200-141gb",
            "efficiency": asdict(Efficiency()),
            "measurements": [{**s.describe(), "measured_s": cost.step(scheduler_output(s)).total_s}
                             for s in grid]}
    if attention_eff is not None:
        shapes = attention_shapes(grid)
        data["attention_measurements"] = attention_records(
            shapes, [{"measured_s": t} for t in attention_times(attention_eff, shapes)])
    return json.loads(json.dumps(data))  # as written to disk and read back


def test_the_attention_profile_times_every_grid_step_with_prefill_tokens():
    grid = default_grid()
    shapes = attention_shapes(grid)
    assert shapes == [s for s in grid if s.kind in ("prefill", "mixed")]
    assert len(shapes) >= 20 and all(s.prefills for s in shapes)
    # the chunk-2,048 step beside the Mooncake replays' rows is among them
    assert any(len(s.decodes) == 18 and max(s.decodes) == 27000 for s in shapes)


def test_fit_attention_finds_the_attention_terms_and_leaves_the_rest():
    """Attention times with a fixed 0.3 ms per launch on top (a kernel's start over 32 layers,
    which the whole-step fit prices per step): the fit finds the rates and that floor."""
    shapes = attention_shapes(default_grid())
    start = replace(Efficiency(), linear_compute=0.5)
    fitted, error = fit_attention(ARGS, shapes, attention_times(TRUE, shapes) + 3e-4, start)
    for name in ATTENTION_PARAMETERS:
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=0.02), name
    assert fitted.linear_compute == 0.5 and fitted.step_overhead_s == start.step_overhead_s
    assert error["max_abs_rel"] < 1e-3
    assert error["launch_floor_s"] == pytest.approx(3e-4, rel=0.02)
    held, _ = fit_attention(ARGS, shapes, attention_times(TRUE, shapes),
                            replace(start, attention_program=0.2), hold=("attention_program",))
    assert held.attention_program == 0.2
    with pytest.raises(ValueError, match="3 attention times for"):
        fit_attention(ARGS, shapes, np.ones(3))


def test_refit_takes_the_attention_terms_from_the_attention_timed_alone():
    """Whole steps whose attention runs at 0.35 of peak but timed alone at 0.25: the whole
    steps cannot tell the attention from the linear layers beside it, so the attention's own
    timings set its terms, and the whole-step fit holds them."""
    alone = replace(TRUE, attention_compute=0.25, attention_program_serial=0.3)
    result = refit_calibration(calibration(TRUE, alone))
    for name in ATTENTION_PARAMETERS:
        assert result["efficiency"][name] == pytest.approx(getattr(alone, name), rel=0.02), name
    assert result["attention_fit_error"]["max_abs_rel"] < 1e-3
    consistent = refit_calibration(calibration(TRUE, TRUE))
    assert consistent["fit_error"]["median_abs_rel"] < 1e-3
    for name in ("linear_compute", "kv_memory", "attention_compute", "attention_program",
                 "attention_program_serial", "eager_launch_s"):
        assert consistent["efficiency"][name] == pytest.approx(getattr(TRUE, name), rel=0.03), name


def test_a_profile_without_attention_timings_refits_as_before():
    data = calibration(TRUE, None)
    assert attention_inputs(data) is None
    result = refit_calibration(data)
    assert "attention_fit_error" not in result
    assert result["fit_error"]["median_abs_rel"] < 1e-3
    assert result["efficiency"]["attention_program_serial"] == pytest.approx(0.6, abs=0.02)


def test_merged_profiles_take_the_median_of_each_attention_timing(tmp_path, capsys):
    from gpu_backend.__main__ import main

    base, slow = calibration(TRUE, TRUE), calibration(TRUE, TRUE)
    for point in slow["attention_measurements"]:
        point["measured_s"] *= 1.5
    paths = []
    for name, data in (("a", base), ("b", slow), ("c", base)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(data))
    out = tmp_path / "merged.json"
    assert main(["refit", str(paths[0]), "--merge", str(paths[1]), str(paths[2]),
                 "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert [p["measured_s"] for p in merged["attention_measurements"]] == pytest.approx(
        [p["measured_s"] for p in base["attention_measurements"]])
    assert merged["efficiency"]["attention_compute"] == pytest.approx(0.35, rel=0.02)
    capsys.readouterr()
    lacking = tmp_path / "d.json"
    lacking.write_text(json.dumps(calibration(TRUE, None)))
    assert main(["refit", str(paths[0]), "--merge", str(lacking), "--out", str(out)]) == 2
    assert f"{lacking}: its grid differs" in capsys.readouterr().err
