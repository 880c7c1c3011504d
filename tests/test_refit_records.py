"""`python -m gpu_backend refit` on a calibration whose records are missing or malformed: an
error naming the file, the record and the field, exit 2, never a traceback from inside the
fit (sim.core.calibration.records)."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict

import pytest

from gpu_backend.__main__ import main
from gpu_backend.engine.profile_grid import default_grid
from gpu_backend.engine.shapes import scheduler_output
from sim.core.calibration.profile_fit import transition_costs
from sim.core.catalog import get_gpu, get_model
from sim.core.cost_model import CostModel, Efficiency

MIB = 2**20


def profile() -> dict:
    """A stored profile: the default grid priced by a cost model, and three transitions."""
    cost = CostModel(get_model("llama-3.1-8b"), get_gpu("h200"), 1, Efficiency())
    steps = [{**shape.describe(), "measured_s": cost.step(scheduler_output(shape)).total_s,
              "ahead_s": None} for shape in default_grid()]
    points = [{"handles": n, "freed_bytes": 0, "attach_s": 1e-3, "detach_s": 5e-4}
              for n in (1, 2, 4)]
    return {"model": "llama-3.1-8b", "gpu_preset": "h200-141gb", "measurements": steps,
            "efficiency": asdict(Efficiency()),
            "vmm": {"handle_bytes": 512 * MIB, "reclaim": "release", "points": points,
                    "costs": transition_costs(points)}}


def spoiled(edit) -> dict:
    data = copy.deepcopy(profile())
    edit(data)
    return data


@pytest.mark.parametrize("edit, named", [
    (lambda d: d["vmm"]["points"][0].pop("attach_s"),
     "vmm.points[0].attach_s is None; expected seconds >= 0"),
    (lambda d: d["vmm"]["points"][1].update(handles="two"),
     "vmm.points[1].handles is 'two'; expected the handles lent"),
    (lambda d: d["vmm"]["points"][2].update(freed_bytes=-1),
     "vmm.points[2].freed_bytes is -1"),
    (lambda d: d["measurements"][3].update(measured_s="x"),
     "measurements[3].measured_s is 'x'; expected the step's time in seconds"),
    (lambda d: d["measurements"][5].update(measured_s=float("nan")),
     "measurements[5].measured_s is nan"),
    (lambda d: d["measurements"][2].update(kind="warmup"), "measurements[2].kind is 'warmup'"),
    (lambda d: d["measurements"][4].update(decode_groups=[[8]]),
     "measurements[4].decode_groups is [[8]]; expected a list of [sequences, context tokens]"),
    (lambda d: d["measurements"][1].update(device_s="fast"), "measurements[1].device_s is 'fast'"),
    (lambda d: d.update(measurements=[]), 'no "measurements" to fit'),
    # the profile's own fields the fit reads (gpu_backend.profile_json)
    (lambda d: d.pop("model"), "model is None; expected the profiled model's name"),
    (lambda d: d.update(gpu_preset=5), "gpu_preset is 5; expected the profiled gpu's name"),
    (lambda d: d.update(copy_bandwidth_bytes_s="fast"), "copy_bandwidth_bytes_s is 'fast'"),
    (lambda d: d.update(copy_bandwidth_bytes_s=-5), "copy_bandwidth_bytes_s is -5"),
])
def test_a_bad_record_or_field_is_named_with_its_file(tmp_path, capsys, edit, named):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(spoiled(edit)))
    assert main(["refit", str(path), "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {named}" in err and "Traceback" not in err
    assert not (tmp_path / "out.json").exists()


def test_a_bad_record_in_a_merged_profile_names_that_profile(tmp_path, capsys):
    base, other = tmp_path / "a.json", tmp_path / "b.json"
    base.write_text(json.dumps(profile()))
    other.write_text(json.dumps(spoiled(lambda d: d["measurements"][0].pop("measured_s"))))
    assert main(["refit", str(base), "--merge", str(other), "--out", str(tmp_path / "o.json")]) == 2
    assert f"{other}: measurements[0].measured_s is None" in capsys.readouterr().err


def test_a_sound_profile_refits(tmp_path):
    path, out = tmp_path / "cal.json", tmp_path / "out.json"
    path.write_text(json.dumps(profile()))
    assert main(["refit", str(path), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["vmm"]["costs"]["attach_fixed_s"] == pytest.approx(1e-3)


@pytest.mark.parametrize("out, said", [
    ("folder", "a folder; give the path of the file to write"),
    ("file/out.json", "is a file, so no folder can be made there"),
])
def test_an_out_path_that_cannot_be_written_is_named_before_the_fit(tmp_path, capsys, out,
                                                                     said):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(profile()))
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("")
    assert main(["refit", str(path), "--out", str(tmp_path / out)]) == 2
    assert f"--out {tmp_path / out}: " in (err := capsys.readouterr().err) and said in err


def test_a_copy_bandwidth_below_zero_is_refused(tmp_path, capsys):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(profile()))
    assert main(["refit", str(path), "--copy-bandwidth", "-5"]) == 2
    assert "--copy-bandwidth: give a number above 0" in capsys.readouterr().err


def test_refit_in_place_leaves_no_partial_file(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(profile()))
    assert main(["refit", str(path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.json"]
    assert json.loads(path.read_text())["vmm"]["costs"]["attach_fixed_s"] == pytest.approx(1e-3)


def carried_profile(tmp_path) -> tuple:
    """A profile of the 8B on the H200 carried to the 3B on the H100 and saved, beside the
    source's file."""
    from sim.core.calibration import load_calibration, save_calibration
    from sim.core.calibration.transfer import transfer
    source = tmp_path / "8b.json"
    source.write_text(json.dumps(profile()))
    carried = transfer(load_calibration(source), "llama-3.2-3b", "h100")
    path = tmp_path / "carried.json"
    save_calibration(path, carried.data)
    return source, path


def test_a_carried_calibration_is_not_refitted_on_its_sources_times(tmp_path, capsys):
    """Its grid's times are the 8B's on the H200: fitted as the 3B's on the H100 they would
    give that pair the source's efficiencies measured against the wrong peaks."""
    _, path = carried_profile(tmp_path)
    assert main(["refit", str(path), "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert (f"{path}: carried to llama-3.2-3b on h100-80gb from a calibration whose grid ran "
            "llama-3.1-8b on h200-141gb" in err and "refit the source calibration" in err)
    assert "Traceback" not in err and not (tmp_path / "out.json").exists()


def test_a_carried_calibration_is_not_merged_with_a_profile_of_its_target(tmp_path, capsys):
    source, path = carried_profile(tmp_path)
    own = tmp_path / "3b.json"
    own.write_text(json.dumps({**profile(), "model": "llama-3.2-3b", "gpu_preset": "h100-80gb"}))
    assert main(["refit", str(own), "--merge", str(path), "--out", str(tmp_path / "o.json")]) == 2
    assert f"{path}: carried to llama-3.2-3b on h100-80gb from a calibration whose grid ran " \
        "llama-3.1-8b" in capsys.readouterr().err
