"""benchmarks/grid_clocks.py on records written here (no GPU)."""

from __future__ import annotations

import json
import math

from bench_helpers import load_benchmark

grid_clocks = load_benchmark("grid_clocks")


def record(kind, prefills, groups, ahead_s, mhz, capped, energy_j):
    return {"kind": kind, "prefills": prefills, "decode_groups": groups, "ahead_s": ahead_s,
            "ahead_sm_clock_mhz": mhz, "ahead_power_w": 600.0,
            "ahead_power_capped_share": capped, "ahead_energy_j": energy_j}


def test_steps_are_classed_by_size_and_prefix_and_short_ones_show_no_energy(tmp_path, capsys):
    data = {"model": "llama-3.1-8b", "gpu": "NVIDIA H100 80GB HBM3",
            "provenance": {"measured_on": "2026-12-07"},
            "fit_error": {"per_point_rel": [0.01, 0.05, -0.02, 0.0]},
            "measurements": [
                record("prefill", [[8192, 0]], [], 0.2357, 1614.0, 1.0, 164.0),
                record("mixed", [[2048, 16384]], [[16, 12000]], 0.1055, 1934.0, 1.0, 65.3),
                record("decode", [], [[8, 1024]], 0.0067, 1980.0, 0.0, 2.6),
                record("decode", [], [[8, 256]], 0.0064, math.nan, math.nan, math.nan)]}
    rows = grid_clocks.rows(data)
    assert [r["class"] for r in rows] == ["prefill, 2,000+ tokens",
                                          "mixed, 2,000+ tokens, over a 4k+ prefix", "decode"]
    # 8 steps of 236 ms ran 1.9 s together: their power from the counter; 8 of 106 ms did not
    assert math.isclose(rows[0]["power_w"], 164.0 / 0.2357)
    assert rows[1]["power_w"] is None and rows[1]["fit_error"] == 0.05
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    assert grid_clocks.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 of 3 grid steps ran at the power cap; SM clock 1,614-1,980 MHz" in out


def test_a_profile_without_clocks_says_so(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"model": "m", "gpu": "g", "measurements": [
        {"kind": "decode", "prefills": [], "ahead_s": 0.006}]}))
    assert grid_clocks.main([str(path)]) == 1
    assert "records its clock" in capsys.readouterr().out
