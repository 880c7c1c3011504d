"""Sweeps that survive their cases: a case that raises or whose worker is killed is a row with
its reason, sweep.csv grows as cases end, and --resume runs only what it lacks."""

from __future__ import annotations

import csv
import importlib.util
import os
import signal
import sys
from pathlib import Path

import pytest

from sim.__main__ import main
from sim.planning import Case, Executor, SyntheticSpec, TraceSpec, run_sweep
from sim.planning.parallel import iter_outcomes
from sim.planning.sweep_file import SweepCsv
from traces import LengthDist

QUIET = Executor(workers=1, show_progress=False)
TRACE = TraceSpec(synthetic=SyntheticSpec(20, 4.0, LengthDist.uniform(128, 1024),
                                          LengthDist.uniform(8, 32), seed=3))


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def work(item: tuple) -> int:
    """A job that doubles its value, or dies, raises, or dies the first time only."""
    value, mode, marker = item
    if mode == "die" or (mode == "die-once" and not Path(marker).exists()):
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "raise":
        raise ValueError(f"bad item {value}")
    return value * 2


def test_a_killed_worker_and_a_raising_item_fail_alone(tmp_path):
    items = [(1, "ok", ""), (2, "die", str(tmp_path / "a")), (3, "ok", ""),
             (4, "raise", ""), (5, "die-once", str(tmp_path / "b")), (6, "ok", "")]
    executor = Executor(workers=2, show_progress=False, max_retries=1)
    outcomes = {o.index: o for o in iter_outcomes(work, items, executor)}
    assert sorted(outcomes) == list(range(6))
    assert [outcomes[i].value for i in (0, 2, 4, 5)] == [2, 6, 10, 12]
    assert outcomes[1].error == ("its worker process died each of the 2 times it ran alone "
                                 "(killed, or out of memory)")
    assert outcomes[3].error.startswith("ValueError: bad item 4 (at test_sweep_failures.py:")


def cases() -> list[Case]:
    good = [Case("qwen2.5-0.5b", "h200", 1, 2048, policy, TRACE)
            for policy in ("static", "elastic")]
    broken = Case("qwen2.5-0.5b", "h200", 1, 2048, "static", TRACE, rate_scale=-1.0)
    return [good[0], broken, good[1]]


def test_a_failing_case_is_a_row_with_its_error_and_the_sweep_goes_on(tmp_path):
    path = tmp_path / "sweep.csv"
    rows = run_sweep(cases(), QUIET, table=SweepCsv(path))
    assert [bool(r["error"]) for r in rows] == [False, True, False]
    assert rows[1]["error"].startswith("ValueError: rate_scale must be > 0")
    assert rows[0]["num_finished"] == rows[2]["num_finished"] == 20
    on_disk = read_csv(path)
    assert len(on_disk) == 3 and {r["case_id"] for r in on_disk} == {r["case_id"] for r in rows}
    assert [r["error"] for r in on_disk if r["error"]] == [rows[1]["error"]]


def test_resume_keeps_the_finished_cases_and_reruns_the_failed_one(tmp_path):
    path = tmp_path / "sweep.csv"
    first = run_sweep(cases(), QUIET, table=SweepCsv(path))
    table = SweepCsv.resume(path)
    assert len(table.rows) == 2  # the failed case's row is dropped to run again
    again = run_sweep(cases(), QUIET, table=table)
    for before, after in zip(first, again):
        assert after["case_id"] == before["case_id"]
        if not before["error"]:  # not run again: the very row, wall time included
            assert after["sim_wall_s"] == pytest.approx(before["sim_wall_s"], rel=1e-9)
    assert again[1]["error"] == first[1]["error"]
    assert len(read_csv(path)) == 3


def test_each_row_is_on_disk_once_appended_and_new_columns_widen_the_file(tmp_path):
    path = tmp_path / "sweep.csv"
    table = SweepCsv(path)
    table.append({"model": "a", "error": "boom", "case_id": "1"})
    assert read_csv(path) == [{"model": "a", "error": "boom", "case_id": "1"}]
    table.append({"model": "b", "error": "", "case_id": "2", "goodput_req_s": 1.5})
    table.append({"model": "c", "error": "", "case_id": "3", "goodput_req_s": 2.5})
    assert [(r["model"], r["goodput_req_s"]) for r in read_csv(path)] == [
        ("a", ""), ("b", "1.5"), ("c", "2.5")]
    assert SweepCsv.resume(path).done().keys() == {"2", "3"}


def test_sweep_command_refuses_a_used_out_and_resumes_it(tmp_path, capsys):
    argv = ["sweep", "--trace", "azure-conv", "--limit", "15", "--model", "qwen2.5-0.5b",
            "--chunk", "2048", "--policy", "static,elastic", "--workers", "1",
            "--no-progress", "--calibration", "none", "--out", str(tmp_path)]
    assert main(argv) == 0
    first = read_csv(tmp_path / "sweep.csv")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "--resume" in err
    assert main([*argv, "--resume"]) == 0
    assert read_csv(tmp_path / "sweep.csv") == first  # nothing ran again
    assert main([*argv, "--resume", "--overwrite"]) == 2


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_records_a_failing_case_and_goes_on():
    rows = run_sweep(cases(), Executor(workers=2, ray_address="local", show_progress=False))
    assert [bool(r["error"]) for r in rows] == [False, True, False]
    assert rows[1]["error"].startswith("ValueError: rate_scale must be > 0")


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_retries_a_killed_task_and_records_one_lost_for_good(tmp_path):
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers lack tests/
    items = [(1, "ok", ""), (2, "die", str(tmp_path / "a")), (3, "die-once", str(tmp_path / "b"))]
    executor = Executor(workers=2, ray_address="local", show_progress=False, max_retries=1)
    outcomes = {o.index: o for o in iter_outcomes(work, items, executor)}
    assert outcomes[0].value == 2 and outcomes[2].value == 6
    assert outcomes[1].error.startswith("lost on Ray after 1 retries: WorkerCrashedError")
