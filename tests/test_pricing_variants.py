"""benchmarks/pricing_variants.py's async variants on records written here (no GPU)."""

from __future__ import annotations

import math

from bench_helpers import load_benchmark

from sim.core.efficiency import Efficiency

pricing_variants = load_benchmark("pricing_variants")


def test_ahead_gap_is_the_median_of_what_the_steps_shed_launched_back_to_back():
    # shed: 0.6, 0.4 and 1.0 ms; the record without a period is left out: median 0.6 ms
    data = {"measurements": [
        {"measured_s": 0.0018, "ahead_s": 0.0012, "device_s": 0.0016},
        {"measured_s": 0.0070, "ahead_s": 0.0066, "device_s": 0.0068},
        {"measured_s": 0.0300, "ahead_s": 0.0290, "device_s": 0.0297},
        {"measured_s": 0.0100, "device_s": 0.0050}]}
    base = Efficiency(host_gap_s=2e-4, step_overhead_s=1e-3)
    varied = pricing_variants.async_variant("ahead-gap", data, base, "profile.json")
    assert math.isclose(varied.host_gap_s, 6e-4)
    assert varied.step_overhead_s == base.step_overhead_s  # the fit itself is kept


def test_ahead_gap_needs_back_to_back_periods_and_never_goes_negative():
    base = Efficiency(host_gap_s=2e-4)
    no_periods = {"measurements": [{"measured_s": 0.002, "device_s": 0.0015}]}
    assert pricing_variants.async_variant("ahead-gap", no_periods, base, "p.json") is None
    slower_ahead = {"measurements": [{"measured_s": 0.002, "ahead_s": 0.0025}]}
    assert pricing_variants.async_variant("ahead-gap", slower_ahead, base, "p.json").host_gap_s == 0.0


def test_a_calibration_given_as_fitted_prices_as_the_slice_does():
    """--calibration FILE with the slice's own file, as fitted: both columns the same errors
    (the variant takes FILE's activation profile and transition costs with its efficiency)."""
    from validation.evidence import EVIDENCE_DIR, ROOT, read_recipe

    folder = EVIDENCE_DIR / "h100_qwen2.5-0.5b_mooncake-conv_piecewise-async"
    own = ROOT / read_recipe(folder).calibration
    rows = pricing_variants.slice_errors(folder, "as-fitted", own)
    assert [r["run"] for r in rows] == ["elastic/chunk=8192", "static/chunk=8192"]
    for row in rows:
        for metric in pricing_variants.TARGETS:
            priced, varied = row[metric]
            assert varied == priced and abs(priced) < 0.1
