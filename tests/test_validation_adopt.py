"""`python -m validation adopt`: replays measured again, put into an evidence slice."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from validation.adopt import adopt, adopt_all
from validation.cli import main
from validation.evidence import EVIDENCE_DIR, ROOT, read_recipe
from validation.results import EVIDENCE_MARKERS, README_MARKERS

SLICE = "h200_qwen2.5-0.5b_mooncake-conv_piecewise"  # two runs, one repeat each, ~3 s a rebuild


@pytest.fixture
def root(tmp_path) -> Path:
    """A copy of the slice, its calibration and the two README files the rebuild writes."""
    folder = tmp_path / "validation" / "evidence" / SLICE
    shutil.copytree(EVIDENCE_DIR / SLICE, folder)
    calibration = read_recipe(folder).calibration
    (tmp_path / calibration).parent.mkdir(parents=True)
    shutil.copy(ROOT / calibration, tmp_path / calibration)
    for path, (begin, end) in ((tmp_path / "README.md", README_MARKERS),
                               (folder.parent / "README.md", EVIDENCE_MARKERS)):
        path.write_text(f"# results\n{begin}\n{end}\n")
    return tmp_path


def measured_again(root: Path, out: Path, run: str, start: str | None = None,
                   day: str | None = None) -> Path:
    """A `run --out` folder holding the slice's own replay of `run`, CSVs uncompressed as the
    engine writes them, with the start of the machine and the day it recorded."""
    source, dest = root / "validation" / "evidence" / SLICE / "runs" / run, out / "gpu" / run
    dest.mkdir(parents=True)
    for f in source.iterdir():
        if f.suffix == ".gz":
            (dest / f.stem).write_bytes(gzip.decompress(f.read_bytes()))
        else:
            shutil.copy(f, dest / f.name)
    summary = json.loads((dest / "summary.json").read_text())
    for key, value in (("machine_start", start), ("measured_on", day)):
        if value is not None:
            summary["runs"][0].setdefault("measured", {})[key] = value
    (dest / "summary.json").write_text(json.dumps(summary))
    return out


def test_a_run_measured_again_replaces_its_replays_and_stands_apart(root, tmp_path):
    folder = root / "validation" / "evidence" / SLICE
    before = {f.name: gzip.decompress(f.read_bytes())
              for f in (folder / "runs" / "elastic_chunk_8192").glob("*.gz")}
    out = measured_again(root, tmp_path / "out", "elastic_chunk_8192", start="vm/b")
    assert adopt(out, SLICE, root=root, log=lambda _: None) == ["elastic_chunk_8192"]
    run = folder / "runs" / "elastic_chunk_8192"
    assert {f.name: gzip.decompress(f.read_bytes()) for f in run.glob("*.gz")} == before
    assert not list(run.glob("*.csv"))  # stored compressed, as the layout keeps them
    # its repeat measured the engine it replaced; static's repeat stays
    assert not (folder / "repeats" / "repeat-1" / "elastic_chunk_8192").exists()
    assert (folder / "repeats" / "repeat-1" / "static_chunk_8192" / "summary.json").exists()
    # static's replays recorded no start: the two runs stand on two starts
    assert read_recipe(folder).replayed_apart == ("elastic_chunk_8192",)
    report = (folder / "report.md").read_text()
    assert "static/chunk=8192 (replayed apart)" in report
    assert "Does elastic pay here?" in (root / "README.md").read_text()  # tables rebuilt
    # the same files adopted again compress to the same bytes
    stored = {f.name: f.read_bytes() for f in run.glob("*.gz")}
    adopt(out, SLICE, root=root, log=lambda _: None)
    assert {f.name: f.read_bytes() for f in run.glob("*.gz")} == stored


def test_every_run_measured_again_on_one_start_stands_together(root, tmp_path):
    folder = root / "validation" / "evidence" / SLICE
    adopt(measured_again(root, tmp_path / "a", "elastic_chunk_8192", "vm/b"), SLICE, root=root,
          log=lambda _: None)
    assert read_recipe(folder).replayed_apart == ("elastic_chunk_8192",)
    out = measured_again(root, tmp_path / "b", "elastic_chunk_8192", "vm/c")
    measured_again(root, out, "static_chunk_8192", "vm/c")
    adopt(out, SLICE, root=root, log=lambda _: None)
    assert read_recipe(folder).replayed_apart == ()
    assert "replayed_apart" not in json.loads((folder / "slice.json").read_text())
    assert not (folder / "repeats").exists() or not any((folder / "repeats").iterdir())
    assert "(replayed apart)" not in (folder / "report.md").read_text()


def test_a_third_start_is_refused(root, tmp_path):
    folder = root / "validation" / "evidence" / SLICE
    adopt(measured_again(root, tmp_path / "a", "elastic_chunk_8192", "vm/b"), SLICE, root=root,
          log=lambda _: None)
    recipe = json.loads((folder / "slice.json").read_text())
    shutil.copytree(folder / "runs" / "static_chunk_8192", folder / "runs" / "static_chunk_2048")
    with pytest.raises(ValueError, match="would make three"):
        adopt(measured_again(root, tmp_path / "c", "static_chunk_2048", "vm/d"), SLICE,
              root=root, log=lambda _: None)
    assert json.loads((folder / "slice.json").read_text()) == recipe  # nothing written


def test_a_repeat_goes_into_a_new_repeat_folder(root, tmp_path):
    folder = root / "validation" / "evidence" / SLICE
    out = measured_again(root, tmp_path / "out", "static_chunk_8192", "vm/b")
    adopt(out, SLICE, repeat=True, root=root, log=lambda _: None)
    assert sorted(p.name for p in (folder / "repeats" / "repeat-2").iterdir()) == [
        "static_chunk_8192"]
    assert read_recipe(folder).replayed_apart == ()
    assert "repeat-2" in (folder / "report.md").read_text()


def test_runs_the_slice_does_not_have_are_refused_by_name(root, tmp_path, capsys):
    out = measured_again(root, tmp_path / "out", "static_chunk_8192")
    (out / "gpu" / "static_chunk_8192").rename(out / "gpu" / "static_chunk_4096")
    with pytest.raises(ValueError, match=r"runs \['static_chunk_4096'\] are not runs of"):
        adopt(out, SLICE, root=root, log=lambda _: None)
    assert main(["adopt", str(out), "no-such-slice"]) == 2
    assert "no-such-slice: no such slice" in capsys.readouterr().err


def test_a_run_of_another_trace_slice_is_refused(root, tmp_path):
    out = measured_again(root, tmp_path / "out", "static_chunk_8192")
    path = out / "gpu" / "static_chunk_8192" / "summary.json"
    summary = json.loads(path.read_text())
    summary["runs"][0]["rate_scale"] = 3.0
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="rate_scale 3.0 is not"):
        adopt(out, SLICE, root=root, log=lambda _: None)


def new_slice(root: Path, name: str) -> Path:
    """A new slice's folder: the slice's slice.json alone, no runs, no report."""
    folder = root / "validation" / "evidence" / name
    folder.mkdir()
    shutil.copy(root / "validation" / "evidence" / SLICE / "slice.json", folder / "slice.json")
    return folder


def test_a_new_slice_takes_every_run_of_its_first_adoption(root, tmp_path):
    name = "h200_qwen2.5-0.5b_mooncake-conv2_piecewise"
    folder = new_slice(root, name)
    out = measured_again(root, tmp_path / "out", "static_chunk_8192", "vm/b")
    measured_again(root, out, "elastic_chunk_8192", "vm/b")
    assert adopt(out, name, root=root, log=lambda _: None) == [
        "elastic_chunk_8192", "static_chunk_8192"]
    assert sorted(p.name for p in (folder / "runs").iterdir()) == [
        "elastic_chunk_8192", "static_chunk_8192"]
    assert read_recipe(folder).replayed_apart == ()
    report = json.loads((folder / "report.json").read_text())
    assert sorted(run["label"] for run in report["runs"]) == [
        "elastic/chunk=8192", "static/chunk=8192"]
    assert name in (root / "README.md").read_text()  # in the results tables


def test_a_slice_with_no_runs_or_no_report_is_named_with_its_fix(root, tmp_path):
    name = "h200_qwen2.5-0.5b_mooncake-conv2_piecewise"
    folder = new_slice(root, name)
    out = measured_again(root, tmp_path / "out", "static_chunk_8192", "vm/b")
    # the other slice's rebuild cannot build the tables while the new one has no runs
    with pytest.raises(ValueError, match=f"{name}: no runs yet .* validation adopt OUT {name}"):
        adopt(out, SLICE, root=root, log=lambda _: None)
    # a repeat needs runs to repeat: nothing is made a run of the new slice by it
    with pytest.raises(ValueError, match=r"are not runs of"):
        adopt(out, name, repeat=True, root=root, log=lambda _: None)
    assert not (folder / "runs").exists()
    shutil.copytree(root / "validation" / "evidence" / SLICE / "runs", folder / "runs")
    with pytest.raises(ValueError, match=f"{name}: no report yet.* validation rebuild {name}"):
        adopt(out, SLICE, root=root, log=lambda _: None)


def test_the_slice_is_dated_by_its_replays_where_each_recorded_its_day(root, tmp_path):
    folder = root / "validation" / "evidence" / SLICE
    before = read_recipe(folder).measured_on
    logged: list[str] = []
    # static's replay is older than the day record: the date stays, and the log says so
    adopt(measured_again(root, tmp_path / "a", "elastic_chunk_8192", "vm/b", "2026-12-07"),
          SLICE, root=root, log=logged.append)
    assert read_recipe(folder).measured_on == before
    assert any("measured_on left at" in line and "set it by hand" in line for line in logged)
    out = measured_again(root, tmp_path / "b", "static_chunk_8192", "vm/c", "2026-12-08")
    measured_again(root, out, "elastic_chunk_8192", "vm/c", "2026-12-08")
    adopt(out, SLICE, root=root, log=lambda _: None)
    assert read_recipe(folder).measured_on == "2026-12-08"
    assert "Replayed on 2026-12-08 on" in (folder / "report.md").read_text()
    # one run measured again on another day: the slice names both days
    adopt(measured_again(root, tmp_path / "c", "static_chunk_8192", "vm/c", "2026-12-09"),
          SLICE, root=root, log=lambda _: None)
    assert read_recipe(folder).measured_on == "2026-12-08 and 2026-12-09"


def with_config(out: Path, run: str, detach_behind_step: bool) -> Path:
    """The run in `out` with the config.json a replay now writes beside its summary."""
    from validation.run_config import engine_config
    from validation.runs import load_summary

    folder = out / "gpu" / run
    config = engine_config(load_summary(folder).summary).with_(
        detach_behind_step=detach_behind_step)
    (folder / "config.json").write_text(config.to_json())
    return out


def test_the_pin_leaves_the_command_once_every_run_measured_the_current_engine(root, tmp_path):
    folder = root / "validation" / "evidence" / SLICE
    recipe = json.loads((folder / "slice.json").read_text())
    unpinned = recipe["command"]
    recipe["command"] = unpinned.replace(" --out OUT", " --no-detach-behind-step --out OUT")
    (folder / "slice.json").write_text(json.dumps(recipe, indent=1) + "\n")
    # one run on the current engine: the other still measured the pinned one
    out = with_config(measured_again(root, tmp_path / "a", "elastic_chunk_8192", "vm/b"),
                      "elastic_chunk_8192", True)
    adopt(out, SLICE, root=root, log=lambda _: None)
    assert "--no-detach-behind-step" in read_recipe(folder).command
    # both, one of them with the pin on: it stays
    out = measured_again(root, tmp_path / "b", "elastic_chunk_8192", "vm/c")
    measured_again(root, out, "static_chunk_8192", "vm/c")
    with_config(with_config(out, "elastic_chunk_8192", True), "static_chunk_8192", False)
    adopt(out, SLICE, root=root, log=lambda _: None)
    assert "--no-detach-behind-step" in read_recipe(folder).command
    # both on the current engine: the pin goes, the rest of the command as it was
    with_config(out, "static_chunk_8192", True)
    logged: list[str] = []
    adopt(out, SLICE, root=root, log=logged.append)
    assert read_recipe(folder).command == unpinned
    assert any("--no-detach-behind-step taken out of its command" in line for line in logged)


def test_a_remeasure_folder_adopts_every_slice_measured_whole(root, tmp_path, capsys):
    folder = root / "validation" / "evidence" / SLICE
    out = tmp_path / "remeasured"
    measured_again(root, out / SLICE, "static_chunk_8192", "vm/b", "2026-12-10")
    measured_again(root, out / SLICE, "elastic_chunk_8192", "vm/b", "2026-12-10")
    (out / "notes").mkdir()  # not a slice: not adopted, not refused
    assert adopt_all(out, root=root, log=lambda _: None) == []
    assert read_recipe(folder).measured_on == "2026-12-10"
    # a slice measured in part (a remeasure cut short) is refused by name, nothing replaced
    part = tmp_path / "part"
    measured_again(root, part / SLICE, "static_chunk_8192", "vm/c", "2026-12-11")
    assert adopt_all(part, root=root, log=lambda _: None) == [SLICE]
    err = capsys.readouterr().err
    assert "was measured in part (no elastic_chunk_8192)" in err
    assert f"adopt {part / SLICE} {SLICE}" in err
    assert read_recipe(folder).measured_on == "2026-12-10"
    with pytest.raises(ValueError, match="no folder named after a slice"):
        adopt_all(tmp_path / "empty", root=root)
