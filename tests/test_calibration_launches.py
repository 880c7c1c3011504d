"""Attention launches timed by benchmarks/prefix_attention.py, added to a calibration's
attention fit (sim.core.calibration.launches, `python -m gpu_backend refit --add-launches`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_backend.__main__ import main as gpu_main
from sim.core.calibration.launches import add_attention_launches, read_result

ROOT = Path(__file__).resolve().parents[1]
ENV = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "triton": "3.6.0"}


def launch(chunk: int, prefix: int, seconds: float) -> dict:
    return {"kind": "prefill", "prefills": [[chunk, prefix]], "num_decodes": 0,
            "decode_context": 0, "decode_groups": [], "measured_s": seconds,
            "sm_clock_mhz": 1980.0}


def calibration() -> dict:
    return {"model": "llama-3.1-8b", "gpu": ENV["gpu"], "attention_backend": "triton",
            "provenance": {"torch": ENV["torch"], "triton": ENV["triton"]},
            "attention_measurements": [launch(2048, 0, 0.004)]}


def result() -> dict:
    return {"model": "llama-3.1-8b", "env": dict(ENV), "measured_on": "2026-12-07",
            "command": "python benchmarks/prefix_attention.py --model llama-3.1-8b",
            "shapes": [launch(2048, 0, 0.0041), launch(2048, 8192, 0.012)],
            "prompt_chunks": {"8192": [launch(8192, 0, 0.03), launch(8192, 8192, 0.07)],
                              "2048": [launch(2048, 8192, 0.0121), launch(2048, 14336, 0.02)]}}


def test_only_shapes_the_calibration_lacks_are_added_and_the_file_is_recorded():
    data, count = add_attention_launches(calibration(), result(), "prefix.json")
    shapes = [m["prefills"] for m in data["attention_measurements"]]
    # the profile's own 2,048 launch stays; a shape timed twice in the file is taken once
    assert shapes == [[[2048, 0]], [[2048, 8192]], [[2048, 14336]], [[8192, 0]], [[8192, 8192]]]
    assert count == 4
    assert data["attention_measurements"][0]["measured_s"] == 0.004
    assert "sm_clock_mhz" not in data["attention_measurements"][1]  # the fit's fields only
    assert data["added_attention_launches"] == [
        {"source": "prefix.json", "gpu": ENV["gpu"], "measured_on": "2026-12-07",
         "command": "python benchmarks/prefix_attention.py --model llama-3.1-8b",
         "launches": 4}]
    again, none = add_attention_launches(data, result(), "prefix.json")
    assert none == 0 and again is data


@pytest.mark.parametrize(("change", "message"), [
    (lambda c, r: r.update(model="qwen2.5-7b"), r"field 'model' is 'qwen2.5-7b'"),
    (lambda c, r: r["env"].update(gpu="NVIDIA H200"), r"field 'env.gpu' is 'NVIDIA H200'"),
    (lambda c, r: r["env"].update(triton="3.5.0"), r"field 'env.triton' is '3.5.0'"),
    (lambda c, r: r.pop("env"), r"no field 'env'"),
    (lambda c, r: c.update(attention_backend="auto"), r"prices the auto backend's attention"),
    (lambda c, r: r["shapes"][1].pop("decode_groups"), r"launch 1 has no field 'decode_groups'"),
    (lambda c, r: r["shapes"][1].update(measured_s=None), r"launch 1: measured_s None"),
    (lambda c, r: r["shapes"][1].update(measured_s=-1.0), r"launch 1: measured_s -1.0"),
])
def test_a_result_of_another_setup_or_a_broken_launch_is_refused(change, message):
    data, found = calibration(), result()
    change(data, found)
    with pytest.raises(ValueError, match=rf"^prefix\.json: .*{message}"):
        add_attention_launches(data, found, "prefix.json")


def test_an_unreadable_result_names_its_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="broken.json: holds a JSON list"):
        read_result(path)
    with pytest.raises(ValueError, match="missing.json: cannot read"):
        read_result(tmp_path / "missing.json")


def test_refit_adds_the_launches_a_calibration_lacks(tmp_path, capsys):
    """The shipped H100 calibration refitted with the H100 launches: each of its shipped ones
    is held already (refitting it again adds none); with them taken out first, they come back,
    and a result from another GPU is refused with exit 2."""
    shipped = json.loads((ROOT / "calibration" / "h100" / "llama-3.1-8b.json").read_text())
    source = ROOT / "benchmarks" / "results" / "prefix_attention_nvidia-h100-80gb-hbm3-llama-3-1-8b.json"
    added = shipped["added_attention_launches"][0]["launches"]
    bare = dict(shipped, attention_measurements=shipped["attention_measurements"][:-added])
    bare.pop("added_attention_launches")
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(bare))
    assert gpu_main(["refit", str(path), "--add-launches", str(source)]) == 0
    assert f"{added} attention launches added" in capsys.readouterr().err
    refitted = json.loads(path.read_text())
    assert refitted["attention_measurements"] == shipped["attention_measurements"]
    assert refitted["added_attention_launches"][0]["launches"] == added
    assert refitted["efficiency"] == pytest.approx(shipped["efficiency"])
    assert gpu_main(["refit", str(path), "--add-launches", str(source)]) == 0
    assert "nothing added" in capsys.readouterr().err
    other = ROOT / "benchmarks" / "results" / "prefix_attention_nvidia-h200-llama-3-1-8b.json"
    assert gpu_main(["refit", str(path), "--add-launches", str(other)]) == 2
    assert "field 'env.gpu' is 'NVIDIA H200'" in capsys.readouterr().err
