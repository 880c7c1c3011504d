"""An evidence slice, a replay folder or an output path with a value out of range: refused on
the command line with the file (and line) and the field named, exit 2, before any slice,
report or calibration is changed."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from validation.cli import main
from validation.evidence import EVIDENCE_DIR

SLICE = EVIDENCE_DIR / "h100_llama-3.1-8b_mooncake-conv_async"
RUN = "runs/elastic_chunk_2048"


@pytest.fixture
def slice_copy(tmp_path) -> Path:
    folder = tmp_path / SLICE.name
    shutil.copytree(SLICE, folder)
    return folder


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data["runs"][0] if "runs" in data else data, data)
    path.write_text(json.dumps(data))


def edit_steps(path: Path, line: int, field: str, value: str) -> None:
    """steps.csv.gz with `field` of file line `line` (the header is line 1) set to `value`."""
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    header, fields = lines[0].split(","), lines[line - 1].split(",")
    fields[header.index(field)] = value
    lines[line - 1] = ",".join(fields)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))


def rebuild_error(folder: Path, capsys) -> str:
    assert main(["rebuild", "--check", "--no-plots", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("field, value", [
    ("window_s", [5]), ("window_s", ["a", "b"]), ("window_s", [10, 1]), ("limit", -5),
    ("rate_scale", 0), ("rate_scale", -1),
])
def test_a_slice_recipe_value_out_of_range_is_named(slice_copy, capsys, field, value):
    edit_json(slice_copy / "slice.json", lambda d, _: d.update({field: value}))
    err = rebuild_error(slice_copy, capsys)
    assert f"{slice_copy / 'slice.json'}: {field!r} is {value!r}; expected" in err


@pytest.mark.parametrize("field, value, what", [
    ("measured_s", "nan", "a number of seconds >= 0"),
    ("measured_s", "-0.5", "a number of seconds >= 0"),
    ("num_decode_tokens", "-3", "an integer >= 0"),
])
def test_a_step_value_out_of_range_is_named(slice_copy, capsys, field, value, what):
    path = slice_copy / RUN / "steps.csv.gz"
    edit_steps(path, 6, field, value)
    err = rebuild_error(slice_copy, capsys)
    assert f"{path}, line 6, field {field}: {value!r} is not {what}" in err


@pytest.mark.parametrize("text", [b"", b"step_id,num_prefill_tokens,measured_s\n"])
def test_a_steps_file_with_no_steps_is_refused(slice_copy, capsys, text):
    path = slice_copy / RUN / "steps.csv.gz"
    path.write_bytes(gzip.compress(text))
    assert f"{path}: no steps, but summary.json records num_engine_steps" in rebuild_error(slice_copy, capsys)


@pytest.mark.parametrize("edit, named", [
    (lambda _, top: top.update(num_trace_requests="x"),
     "field num_trace_requests is 'x'; it must be an integer >= 0"),
    (lambda run, _: run["measured"].update(kv_tokens="x"),
     "field measured.kv_tokens is 'x'; it must be a number >= 0"),
    (lambda run, _: run.update(block_size="x"), "field block_size is 'x'"),
])
def test_a_summary_field_read_as_a_number_is_named(slice_copy, capsys, edit, named):
    path = slice_copy / RUN / "summary.json"
    edit_json(path, edit)
    assert f"{path}: {named}" in rebuild_error(slice_copy, capsys)


def test_adopt_reads_every_file_before_the_slice_changes(slice_copy, tmp_path, capsys):
    source = tmp_path / "out" / "gpu" / "elastic_chunk_2048"
    shutil.copytree(slice_copy / RUN, source)
    edit_steps(source / "steps.csv.gz", 10, "measured_s", "x")
    before = {p: p.read_bytes() for p in slice_copy.rglob("*") if p.is_file()}
    assert main(["adopt", str(tmp_path / "out"), str(slice_copy)]) == 2
    err = capsys.readouterr().err
    assert f"{source / 'steps.csv.gz'}, line 10, field measured_s: 'x'" in err
    assert {p: p.read_bytes() for p in slice_copy.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("command, said", [
    (["compare", "--gpu-dir", "RUNS", "--out", "FILE"], "--out FILE: a file, not a folder"),
    (["compare", "--gpu-dir", "RUNS", "--out", "FILE/report"],
     "--out FILE/report: FILE is a file, so no folder can be made there"),
    (["compare", "--gpu-dir", "RUNS", "--out", "DIR", "--save-calibration", "DIR"],
     "--save-calibration DIR: a folder; give the path of the file to write"),
    (["fit", "--gpu-dir", "RUNS", "--out", "DIR"], "--out DIR: a folder"),
    (["remeasure", SLICE.name, "--out", "FILE"], "--out FILE: a file, not a folder"),
    (["remeasure", SLICE.name, "--out", "DIR", "--time-limit-s", "-5"],
     "--time-limit-s: give a number above 0"),
])
def test_an_output_path_that_cannot_be_written_is_named_first(tmp_path, capsys, command, said):
    (tmp_path / "FILE").write_text("")
    (tmp_path / "DIR").mkdir()
    paths = {"RUNS": str(SLICE / "runs"), "FILE": str(tmp_path / "FILE"),
             "DIR": str(tmp_path / "DIR")}
    for name, path in paths.items():
        command = [word.replace(name, path) for word in command]
        said = said.replace(name, path)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not any((tmp_path / "DIR").iterdir())


@pytest.mark.parametrize("run", [RUN, "repeats/repeat-1/static_chunk_2048"])
def test_a_run_folder_without_summary_json_is_named(slice_copy, capsys, run):
    folder = slice_copy / run
    (folder / "summary.json").rename(folder / "summary.json.orig")
    err = rebuild_error(slice_copy, capsys)
    assert f"{folder}: holds " in err and "summary.json.orig" in err
    assert "but no summary.json" in err


def test_an_empty_run_folder_is_named(slice_copy, capsys):
    folder = slice_copy / "runs" / "static_chunk_4096"
    folder.mkdir()
    assert f"{folder}: is empty and holds no summary.json" in rebuild_error(slice_copy, capsys)


def test_an_empty_repeat_folder_is_named(slice_copy, capsys):
    folder = slice_copy / "repeats" / "repeat-9"
    folder.mkdir()
    assert f"{folder}: no summary.json found" in rebuild_error(slice_copy, capsys)


def test_compare_names_a_run_folder_without_summary_json(slice_copy, tmp_path, capsys):
    cut = slice_copy / "runs" / "static_chunk_8192"
    (cut / "summary.json").unlink()
    assert main(["compare", "--gpu-dir", str(slice_copy / "runs"), "--calibration", "none",
                 "--no-plots", "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert f"{cut}: holds config.json" in err and "but no summary.json" in err
    assert "Traceback" not in err and not (tmp_path / "report").exists()


@pytest.mark.parametrize("run, key, kept, missing", [
    (RUN, "ttft_s", {}, "ttft_s.p50"),
    (RUN, "ttft_s", {"p50": 0.1}, "ttft_s.p99"),
    (RUN, "tpot_s", {"p99": 0.01}, "tpot_s.p50"),
    (RUN, "e2e_s", {"mean": 1.0}, "e2e_s.p50"),
    ("repeats/repeat-2/static_chunk_8192", "ttft_s", {}, "ttft_s.p50"),
])
def test_a_latency_without_its_percentile_is_named(slice_copy, capsys, run, key, kept, missing):
    path = slice_copy / run / "summary.json"
    edit_json(path, lambda r, _: r.update({key: kept}))
    assert f"{path}: field {missing} is missing" in rebuild_error(slice_copy, capsys)
