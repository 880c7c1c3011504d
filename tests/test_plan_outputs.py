"""The planning commands' --out: claimed before any run (a file, or a folder holding results,
is refused at once), --overwrite clearing an earlier result's files, and Ctrl-C inside the
work giving exit code 130 and one line on stderr saying what was kept."""

from __future__ import annotations

import pytest

import sim.planning.cli as planning_cli
from sim.planning.cli import main

PLAN = ["plan", "--trace", "azure-conv", "--limit", "15", "--model", "qwen2.5-0.5b",
        "--chunk", "2048", "--no-max-rate", "--workers", "1", "--no-progress",
        "--calibration", "none"]
MAP = ["plan", "map", "--models", "qwen2.5-0.5b", "--prompts", "1024", "--tps", "1",
       "--chunks", "2048", "--num-requests", "10", "--workers", "1", "--no-progress"]
FLEET = ["plan", "fleet", "--trace", "azure-conv", "--limit", "40", "--rate-scale", "40",
         "--model", "qwen2.5-0.5b", "--gpu", "a10g", "--tp", "1", "--chunk", "2048",
         "--slo-ttft", "0.5", "--max-replicas", "4", "--workers", "1", "--no-progress",
         "--calibration", "none", "--runners-up", "0"]
RESERVE = ["plan", "reserve", "--models", "qwen2.5-0.5b", "--tps", "1", "--chunks", "2048"]

# command, its argv, the function that does its work (module, name), the files it writes
COMMANDS = {
    "plan": (PLAN, ("sim.planning.plan", "run_case"), {"plan.json", "plan.csv"}),
    "plan map": (MAP, ("sim.planning.gain_map", "run_case"),
                 {"map.png", "map.csv", "map_runs.csv"}),
    "plan fleet": (FLEET, ("sim.planning.fleet", "trial_task"),
                   {"fleet.json", "fleet_trials.csv"}),
    "plan reserve": (RESERVE, ("sim.planning.reserve", "reserve_rows"), {"reserve.csv"}),
}
SIMULATING = ("plan", "plan map", "plan fleet")


def watch_work(monkeypatch, command: str, effect=None) -> list:
    """Record each call of the command's work function; `effect` raises instead of it."""
    module, name = COMMANDS[command][1]
    calls: list = []
    real = getattr(__import__(module, fromlist=[name]), name)

    def watched(*args, **kwargs):
        calls.append(args)
        if effect is not None:
            raise effect
        return real(*args, **kwargs)

    monkeypatch.setattr(f"{module}.{name}", watched)
    return calls


def result_files(folder) -> set[str]:
    """The folder's files, leaving out Parquet (written only where pyarrow is installed)."""
    return {p.name for p in folder.iterdir() if not p.name.endswith(".parquet")}


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_file_as_out_is_refused_before_any_work(command, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "results"
    blocker.write_text("not a folder")
    calls = watch_work(monkeypatch, command)
    assert main([*COMMANDS[command][0], "--out", str(blocker)]) == 2
    captured = capsys.readouterr()
    assert one_line(captured.err) == (f"error: --out {blocker} is a file, not a folder: "
                                      "give a folder")
    assert captured.out == "" and calls == []
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_folder_with_results_is_refused_without_overwrite(command, tmp_path, monkeypatch,
                                                            capsys):
    out = tmp_path / "out"
    out.mkdir()
    name = sorted(COMMANDS[command][2])[0]
    (out / name).write_text("earlier")
    calls = watch_work(monkeypatch, command)
    assert main([*COMMANDS[command][0], "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert one_line(captured.err) == (
        f"error: --out {out} is not empty (it holds {name}): pass --overwrite to replace its "
        "results, or give a new folder")
    assert captured.out == "" and calls == []
    assert (out / name).read_text() == "earlier"


@pytest.mark.parametrize("command", COMMANDS)
def test_overwrite_clears_the_earlier_results_and_writes_new_ones(command, tmp_path, capsys):
    argv, _, written = COMMANDS[command]
    out = tmp_path / "out"
    out.mkdir()
    stem = min(n for n in written if n.endswith(".csv")).removesuffix(".csv")
    (out / f"{stem}.parquet").write_bytes(b"earlier")  # written only where pyarrow is
    for name in written:
        (out / name).write_text("earlier")
    assert main([*argv, "--out", str(out), "--overwrite"]) in (0, 1), capsys.readouterr().err
    assert result_files(out) == written
    for name in written:
        assert (out / name).read_bytes()[:7] != b"earlier", name
    parquet = out / f"{stem}.parquet"
    assert not parquet.exists() or parquet.read_bytes() != b"earlier"


@pytest.mark.parametrize("command", SIMULATING)
def test_ctrl_c_in_the_runs_exits_130_with_one_line_and_writes_nothing(command, tmp_path,
                                                                       monkeypatch, capsys):
    out = tmp_path / "out"
    calls = watch_work(monkeypatch, command, KeyboardInterrupt())
    assert main([*COMMANDS[command][0], "--out", str(out)]) == 130
    captured = capsys.readouterr()
    assert len(calls) == 1
    assert one_line(captured.err) == (f"interrupted: python -m sim {command} stopped before "
                                      f"it ended; nothing written to {out}")
    assert "Traceback" not in captured.err
    assert list(out.iterdir()) == []


def test_ctrl_c_without_out_says_nothing_was_saved(monkeypatch, capsys):
    watch_work(monkeypatch, "plan", KeyboardInterrupt())
    assert main(PLAN) == 130
    assert one_line(capsys.readouterr().err) == (
        "interrupted: python -m sim plan stopped before it ended; nothing saved (no --out)")


def test_ctrl_c_between_the_plans_files_keeps_the_finished_table(tmp_path, monkeypatch,
                                                                 capsys):
    real_write_table = planning_cli.write_table

    def write_then_stop(*args, **kwargs):
        real_write_table(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(planning_cli, "write_table", write_then_stop)
    out = tmp_path / "out"
    assert main([*PLAN, "--out", str(out)]) == 130
    err = capsys.readouterr().err  # after the run's own warning, the stop
    assert err.strip().splitlines()[-1] == (
        f"interrupted: python -m sim plan stopped before it ended; kept in {out}, each file "
        "whole: plan.csv; nothing else written")
    assert "Traceback" not in err
    assert result_files(out) == {"plan.csv"}  # plan.json, written last, is not there
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_ctrl_c_before_out_is_claimed_leaves_it_untouched(tmp_path, monkeypatch, capsys):
    def stop(spec):
        raise KeyboardInterrupt

    monkeypatch.setattr(planning_cli, "build_trace", stop)
    out = tmp_path / "out"
    assert main([*PLAN, "--out", str(out)]) == 130
    assert one_line(capsys.readouterr().err) == (
        "interrupted: python -m sim plan stopped before it wrote anything")
    assert not out.exists()


def test_ctrl_c_in_the_map_keeps_the_tables_of_the_cells_that_ended(tmp_path, monkeypatch,
                                                                     capsys):
    """Two cells of two runs each (static and elastic at one chunk), run one at a time: a stop
    in the third run keeps the first cell and its two runs; the figure needs every cell."""
    import csv

    import sim.planning.gain_map as gain_map

    real_run_case = gain_map.run_case
    calls: list = []

    def stop_at_the_third(case):
        calls.append(case)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_run_case(case)

    monkeypatch.setattr(gain_map, "run_case", stop_at_the_third)
    out = tmp_path / "out"
    argv = [*MAP[:5], "1024,2048", *MAP[6:], "--out", str(out)]
    assert main(argv) == 130
    captured = capsys.readouterr()
    assert captured.out == ""
    assert one_line(captured.err) == (
        f"interrupted: python -m sim plan map stopped before it ended; kept in {out}, each file "
        "whole: map.csv, map_runs.csv (the 1 of 2 cells that ended); nothing else written")
    assert result_files(out) == {"map.csv", "map_runs.csv"}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    with (out / "map.csv").open() as f:
        cells = list(csv.DictReader(f))
    assert [(c["model"], c["prompt_tokens"], c["tp"], c["status"]) for c in cells] == [
        ("qwen2.5-0.5b", "1024", "1", "ok")]
    with (out / "map_runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    assert [(r["policy"], r["chunk"], r["prompt"]) for r in runs] == [
        ("static", "2048", "fixed(1024)"), ("elastic", "2048", "fixed(1024)")]
