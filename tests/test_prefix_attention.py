"""benchmarks/prefix_attention.py on the CPU: the shapes it times, and its report of a saved
result priced by a calibration."""

from __future__ import annotations

import json
from pathlib import Path

from bench_helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT / "calibration" / "h200" / "llama-3.1-8b.json"


pa = load_benchmark("prefix_attention")


def test_shapes_cover_every_chunk_over_every_prefix_and_the_packed_steps():
    singles = {s.prefills[0] for s in pa.shapes() if len(s.prefills) == 1}
    assert singles == {(c, p) for c in (256, 512, 1024, 2048, 4096)
                       for p in (0, 1024, 4096, 8192, 16384, 24576)}
    packed = [s.prefills for s in pa.shapes() if len(s.prefills) > 1]
    assert len(packed) == 4 and all(s.kind == "prefill" for s in pa.shapes())


def _result(seconds: dict) -> dict:
    rows = [{"kind": "prefill", "prefills": [list(p) for p in prefills], "num_decodes": 0,
             "decode_context": 0, "decode_groups": [], "measured_s": s}
            for prefills, s in seconds.items()]
    return {"env": {"gpu": "NVIDIA H200"}, "model": "llama-3.1-8b", "measured_on": "2026-12-07",
            "shapes": rows}


def test_report_prices_each_shape_and_splits_the_median_by_prefix(tmp_path, capsys):
    # a chunk over a long prefix does more work than the same chunk alone, so a result that
    # times both alike is priced long on the first and short on the second
    result = _result({((2048, 0),): 5e-3, ((2048, 16384),): 5e-3})
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result))
    assert pa.main(["--report", str(path), "--calibration", str(CALIBRATION)]) == 0
    out = capsys.readouterr().out
    assert "2 launches (1 with a prefix)" in out
    lines = [line for line in out.splitlines() if line.strip().startswith("[[2048")]
    errors = [float(line.rsplit(None, 1)[1].rstrip("%")) for line in lines]
    assert errors[0] < 0 and errors[1] > 100  # [[2048, 0]] then [[2048, 16384]]


def test_report_skips_a_calibration_of_another_model(tmp_path, capsys):
    path = tmp_path / "result.json"
    path.write_text(json.dumps(_result({((512, 0),): 1e-3})))
    other = ROOT / "calibration" / "h200" / "qwen2.5-7b.json"
    assert pa.main(["--report", str(path), "--calibration", str(other)]) == 0
    assert "not llama-3.1-8b: skipped" in capsys.readouterr().out


def test_prompt_shapes_cover_the_prompt_chunk_by_chunk():
    assert [s.prefills for s in pa.prompt_shapes(8192)] == [((8192, 0),), ((8192, 8192),)]
    # a last chunk shorter than the others
    assert [s.prefills for s in pa.prompt_shapes(6000, 16384)] == [
        ((6000, 0),), ((6000, 6000),), ((4384, 12000),)]


def _breakdown(model: str, ahead_ms: float, gpu: str = "NVIDIA H200") -> dict:
    classes = {"classes_ms": {"attention (Triton)": ahead_ms, "matmul": 300.0}}
    return {"env": {"gpu": gpu}, "model": model, "attention_backend": "triton",
            "measured_on": "2026-12-06",
            "chunked_prompt": {"chunk 2048, 0 decodes": classes},
            "chunked_prompt_launched_ahead": {"chunk 2048, 0 decodes": classes}}


def test_in_step_sets_the_prompt_alone_against_its_steps(tmp_path, capsys):
    # eight launches of 25 ms alone (200 ms) against 240 ms of the kernel inside the steps
    result = _result({})
    result["prompt_chunks"] = {"2048": [
        {"prefills": [[2048, 2048 * k]], "measured_s": 0.025, "sm_clock_mhz": 1980.0}
        for k in range(8)]}
    path, steps = tmp_path / "result.json", tmp_path / "breakdown.json"
    path.write_text(json.dumps(result))
    steps.write_text(json.dumps(_breakdown("llama-3.1-8b", 240.0)))
    assert pa.main(["--report", str(path), "--in-step", str(steps)]) == 0
    row = [line.split() for line in capsys.readouterr().out.splitlines()
           if line.strip().startswith("2,048")][0]
    assert row[1] == "200.0" and row[2:4] == ["1,980", "MHz"] and row[-1] == "1.200"


def test_in_step_refuses_a_result_without_the_prompt_or_of_another_model(tmp_path, capsys):
    path, steps = tmp_path / "result.json", tmp_path / "breakdown.json"
    path.write_text(json.dumps(_result({((512, 0),): 1e-3})))
    steps.write_text(json.dumps(_breakdown("llama-3.1-8b", 240.0)))
    assert pa.main(["--report", str(path), "--in-step", str(steps)]) == 1
    assert "holds no prompt_chunks" in capsys.readouterr().out
    result = _result({})
    result["prompt_chunks"] = {"2048": [{"prefills": [[2048, 0]], "measured_s": 0.025}]}
    path.write_text(json.dumps(result))
    steps.write_text(json.dumps(_breakdown("qwen2.5-7b", 240.0)))
    assert pa.main(["--report", str(path), "--in-step", str(steps)]) == 1
    assert "not llama-3.1-8b" in capsys.readouterr().out
    # the steps of another GPU: its clock and power differ, so the ratio would mean nothing
    steps.write_text(json.dumps(_breakdown("llama-3.1-8b", 240.0, gpu="NVIDIA H100 80GB HBM3")))
    assert pa.main(["--report", str(path), "--in-step", str(steps)]) == 1
    assert "set a GPU's launches against its own steps" in capsys.readouterr().out
