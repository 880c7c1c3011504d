"""A replay folder with a bad value: its CSVs' rows are refused with the file, line and field
named (never read as NaN or text), its summary.json's fields with the file and field, on the
Python API and on the command line (exit 2, no traceback)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sim.core.catalog import get_gpu, get_model
from sim.core.elastic import Policy
from sim.core.engine_config import EngineConfig
from sim.runner import RunSpec
from validation.cli import main
from validation.csv_rows import read_csv_rows
from validation.run_csvs import read_csv_columns, read_numeric_csv
from validation.runs import TraceSlice, find_runs, load_run
from validation.step_table import read_steps_csv
from validation.synthetic import write_gpu_style_run
from validation.table import read_report


@pytest.fixture(scope="module")
def replay(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu")
    config = EngineConfig(get_model("llama-3.1-8b"), get_gpu("h200"), policy=Policy.STATIC,
                          max_num_batched_tokens=2048, async_scheduling=False)
    write_gpu_style_run(out, RunSpec(config), TraceSlice("azure-code", limit=20))
    return find_runs(out)[0]


def edited_copy(replay: Path, tmp_path: Path, pattern: str, line: int, field: str,
                value: str) -> tuple[Path, Path]:
    """A copy of the replay whose CSV matching `pattern` has `field` of file line `line`
    (the header is line 1) set to `value`; returns the folder and the file."""
    folder = tmp_path / "run"
    shutil.copytree(replay, folder)
    path = next(folder.glob(pattern))
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    fields = lines[line - 1].split(",")
    fields[header.index(field)] = value
    lines[line - 1] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    return folder, path


@pytest.mark.parametrize("pattern, field, value, what", [
    ("steps.csv", "measured_s", "fast", "is not a number"),
    ("steps.csv", "num_prefill_tokens", "", "is not an integer"),
    ("steps.csv", "num_seqs", "inf", "is not an integer"),
    ("timeline*.csv", "duration_s", "x", "is not a number"),
    ("requests*.csv", "first_token_s", "soon", "is not a number"),
])
def test_a_value_that_is_not_a_number_is_named(replay, tmp_path, pattern, field, value, what):
    folder, path = edited_copy(replay, tmp_path, pattern, 4, field, value)
    with pytest.raises(ValueError) as err:
        load_run(folder)
    assert str(err.value).startswith(f"{path}, line 4, field {field}: {value!r} {what}")


def test_a_bad_prefill_chunk_list_is_named(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,decode_context_tokens,num_seqs,"
                    "measured_s,prefill_chunks\n"
                    "512,0,0,1,0.01,512:0\n"
                    "1024,2,300,3,0.02,512:0;5x2:0\n")
    with pytest.raises(ValueError, match=r"steps\.csv, line 3, field prefill_chunks: "
                                         r"'512:0;5x2:0' is not a list of new:prefix"):
        read_steps_csv(path)


def test_a_row_with_missing_or_extra_fields_is_named(replay, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(replay, folder)
    path = folder / "steps.csv"
    lines = path.read_text().splitlines()
    lines[2] = lines[2].rsplit(",", 2)[0]  # line 3 loses two fields
    path.write_text("\n".join(lines) + "\n")
    num_fields = len(lines[0].split(","))
    with pytest.raises(ValueError, match=rf"steps\.csv, line 3: {num_fields - 2} fields where "
                                         rf"the header has {num_fields}"):
        load_run(folder)
    lines[2] = lines[1] + ",7"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"line 3: {num_fields + 1} fields"):
        read_steps_csv(path)


def test_text_columns_stay_text_and_a_number_among_text_is_named(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_text("request_id,status,ttft_s\n0,finished,0.5\n1,rejected,nan\n")
    columns = read_csv_columns(path)
    assert columns["status"].tolist() == ["finished", "rejected"]
    assert columns["ttft_s"][0] == 0.5 and np.isnan(columns["ttft_s"][1])
    path.write_text("request_id,status\n0,finished\n1,3\n2,rejected\n")
    with pytest.raises(ValueError, match=r"requests\.csv, field status: line 2 has 'finished', "
                                         r"not a number, but line 3 has '3'"):
        read_csv_columns(path)


def test_line_numbers_count_blank_lines_and_gzip_is_read_the_same(tmp_path):
    text = "start_s,duration_s\n0.0,0.1\n\n0.1,oops\n"
    plain = tmp_path / "timeline.csv"
    plain.write_text(text)
    packed = tmp_path / "timeline.csv.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, packed):
        with pytest.raises(ValueError, match=rf"{path.name}, line 4, field duration_s: 'oops'"):
            read_numeric_csv(path)
    assert read_csv_rows(plain).lines == [2, 4]


def test_a_file_that_is_not_csv_text_is_named(tmp_path):
    path = tmp_path / "steps.csv.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"steps\.csv\.gz: not a readable CSV"):
        read_steps_csv(path)


def test_the_command_line_names_the_bad_value_and_exits_2(replay, tmp_path, capsys):
    folder, path = edited_copy(replay, tmp_path, "steps.csv", 5, "measured_s", "n/a")
    code = main(["compare", "--gpu-dir", str(folder.parent), "--calibration", "none",
                 "--out", str(tmp_path / "report"), "--no-plots"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path}, line 5, field measured_s: 'n/a' is not a number" in err
    assert "Traceback" not in err


def edited_summary(replay: Path, tmp_path: Path, edit) -> Path:
    """A copy of the replay whose summary.json's one run is changed by `edit`; returns the
    summary's path."""
    folder = tmp_path / "run"
    shutil.copytree(replay, folder)
    path = folder / "summary.json"
    data = json.loads(path.read_text())
    edit(data["runs"][0])
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda run: run.update(chunk="big"), "field chunk is 'big'; it must be the run's "
                                          "max_num_batched_tokens, a positive integer"),
    (lambda run: run.update(chunk=0), "field chunk is 0"),
    (lambda run: run.update(policy="magic"), "field policy: unknown policy 'magic'"),
    (lambda run: run["ttft_s"].update(p50="x"), "field ttft_s.p50 is 'x'; it must be a number"),
    (lambda run: run.update(tpot_s=[0.1]), "field tpot_s is [0.1]; it must be an object"),
    (lambda run: run.update(throughput_tok_s=True), "field throughput_tok_s is True"),
    (lambda run: run.update(measured=3), "field measured must be an object"),
])
def test_a_bad_summary_field_is_named_before_any_simulation(replay, tmp_path, capsys, edit,
                                                            message):
    path = edited_summary(replay, tmp_path, edit)
    with pytest.raises(ValueError) as err:
        load_run(path.parent)
    assert str(err.value).startswith(f"{path}: {message}")
    code = main(["compare", "--gpu-dir", str(path.parent), "--calibration", "none",
                 "--out", str(tmp_path / "report"), "--no-plots"])
    out, err_text = capsys.readouterr()
    assert code == 2 and f"{path}: {message}" in err_text
    assert "simulating" not in out and "Traceback" not in err_text


@pytest.mark.parametrize("text, message", [
    ('{"runs": [', "not JSON at line 1, column 11"),
    ("[1, 2]", "holds a JSON list, not the summary object"),
    ('{"runs": 5}', "field runs must be a list of run objects"),
])
def test_a_summary_that_is_not_a_run_object_is_named(replay, tmp_path, text, message):
    folder = tmp_path / "run"
    shutil.copytree(replay, folder)
    (folder / "summary.json").write_text(text)
    with pytest.raises(ValueError, match=message):
        load_run(folder)


@pytest.mark.parametrize("summary, message", [
    ({"chunk": 2048}, "it has no 'model'"),
    ({"chunk": 2048, "model": "llama-9"}, "unknown model 'llama-9'"),
    ({"chunk": 2048, "model": "llama-3.1-8b", "max_model_len": "long"},
     "field max_model_len is 'long', not an integer"),
])
def test_a_replay_without_config_json_names_what_its_columns_lack(tmp_path, summary, message):
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "steps.csv").write_text("num_prefill_tokens,num_decode_tokens,"
                                        "decode_context_tokens,num_seqs,measured_s\n")
    with pytest.raises(ValueError, match=rf"summary\.json: no config\.json beside it, and its "
                                         rf"columns do not give the run's engine "
                                         rf"configuration: {message}"):
        load_run(tmp_path)


def test_a_report_that_is_not_an_object_is_named(tmp_path):
    path = tmp_path / "report.json"
    for text in ("[1]", '{"runs": [3]}'):
        path.write_text(text)
        with pytest.raises(ValueError, match=r"report\.json: (no \"runs\"|run 0 has no)"):
            read_report(path)
