"""`python -m validation remeasure`: evidence slices measured again by their own commands."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from validation.cli import main
from validation.evidence import EVIDENCE_DIR, read_recipe, slice_folders
from validation.remeasure import (
    PROCESS_START_S,
    SliceCommand,
    chosen,
    expected_s,
    remeasure,
    run_names,
    slice_command,
)

TP2 = "h200x2_llama-3.1-8b_azure-conv_tp2"  # its command sets the engine's environment
ASYNC = "h200_llama-3.1-8b_azure-conv_async"  # a default-engine slice, pinned in copies below


def evidence_copy(root: Path, name: str, pin: bool = False) -> Path:
    """`name`'s slice.json in a folder of its own under `root`; `pin`: its command pins the
    engine that waits for the step in flight (--no-detach-behind-step)."""
    folder = root / name
    shutil.copytree(EVIDENCE_DIR / name, folder, ignore=shutil.ignore_patterns("runs", "repeats"))
    recipe = json.loads((folder / "slice.json").read_text())
    if pin and "--no-detach-behind-step" not in recipe["command"]:
        recipe["command"] = recipe["command"].replace(" --out OUT",
                                                      " --no-detach-behind-step --out OUT")
        (folder / "slice.json").write_text(json.dumps(recipe))
    return folder


def test_a_slice_runs_its_own_command_into_its_folder(tmp_path):
    words = shlex.split(read_recipe(EVIDENCE_DIR / TP2).command)
    command = slice_command(EVIDENCE_DIR / TP2, tmp_path / TP2, current_engine=True,
                            gpu_only=False, python="py")
    assert command.env == {"GPU_BACKEND_FUSED": "0", "GPU_BACKEND_DECODE_PLAN": "0"}
    assert command.argv == ["py"] + [str(tmp_path / TP2) if w == "OUT" else w
                                     for w in words[3:]]


def test_the_current_engine_drops_the_pin_and_gpu_only_is_added_once(tmp_path):
    pinned = evidence_copy(tmp_path / "evidence", ASYNC, pin=True)
    words = shlex.split(read_recipe(pinned).command)
    assert "--no-detach-behind-step" in words
    now = slice_command(pinned, tmp_path, current_engine=True, gpu_only=True)
    assert "--no-detach-behind-step" not in now.argv
    assert now.argv.count("--gpu-only") == 1 and now.argv[0] == sys.executable
    assert len(now.argv) == len(words)  # python for python, less the pin, plus the flag
    kept = slice_command(pinned, tmp_path, current_engine=False, gpu_only=False)
    assert "--no-detach-behind-step" in kept.argv and "--gpu-only" not in kept.argv


def test_stale_takes_every_slice_pinned_to_an_earlier_engine_once(tmp_path):
    root = tmp_path / "evidence"
    pinned = evidence_copy(root, ASYNC, pin=True)
    tp2 = evidence_copy(root, TP2)
    assert slice_folders(root) == sorted([pinned, tp2])
    assert chosen([], True, root) == [pinned]
    assert chosen([TP2], True, root) == [tp2, pinned]
    assert chosen([ASYNC, ASYNC], False, root) == [pinned]
    assert chosen([ASYNC], True, root) == [pinned]
    with pytest.raises(ValueError, match="no slice to measure"):
        chosen([], False, root)


def test_a_command_that_is_not_a_run_into_out_is_named(tmp_path):
    folder = tmp_path / "h200_x_y"
    shutil.copytree(EVIDENCE_DIR / TP2, folder, ignore=shutil.ignore_patterns("runs", "repeats"))
    recipe = json.loads((folder / "slice.json").read_text())
    recipe["command"] = recipe["command"].replace("--out OUT", "--out somewhere")
    (folder / "slice.json").write_text(json.dumps(recipe))
    with pytest.raises(ValueError, match=r"slice.json: command: expected `python -m validation"):
        slice_command(folder, tmp_path / "out", current_engine=False, gpu_only=False)


def test_each_slice_runs_with_its_environment_and_a_failure_does_not_stop_the_rest(tmp_path):
    def command(name: str, code: str) -> SliceCommand:
        return SliceCommand(name, {"SLICE_SWITCH": name}, [sys.executable, "-c", code],
                            tmp_path / name)
    printing = "import os, sys; print(os.environ['SLICE_SWITCH']); sys.exit({})"
    result = remeasure([command("a", printing.format(3)), command("b", printing.format(0))],
                       tmp_path / "out", cwd=tmp_path, log=lambda _: None)
    assert result.status == {"a": 3, "b": 0} and result.over_time == []
    assert (tmp_path / "out" / "a.log").read_text() == "a\n"
    assert (tmp_path / "out" / "b.log").read_text() == "b\n"


def test_dry_run_prints_each_command_and_runs_none(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["remeasure", TP2, ASYNC, "--current-engine", "--gpu-only", "--out", str(out),
                 "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("GPU_BACKEND_FUSED=0 GPU_BACKEND_DECODE_PLAN=0 ")
    assert f"--out {out / ASYNC} --gpu-only  # about " in lines[1]
    assert not out.exists()
    assert main(["remeasure", "--out", str(out)]) == 2
    assert "no slice to measure" in capsys.readouterr().err
    assert Path(out).exists() is False


def test_an_interrupt_stops_the_slice_in_flight_and_runs_no_other(tmp_path):
    import os
    import signal
    import threading

    def command(name: str, code: str) -> SliceCommand:
        return SliceCommand(name, {}, [sys.executable, "-c", code], tmp_path / name)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        result = remeasure([command("slow", "import time; time.sleep(60)"),
                            command("next", "print('ran')")],
                           tmp_path / "out", cwd=tmp_path, log=lambda _: None)
    finally:
        timer.cancel()
    assert result.status == {"slow": None}
    assert not (tmp_path / "out" / "next.log").exists()


def test_a_slices_estimate_is_its_runs_recorded_setup_and_replay(tmp_path):
    runs = {"static_chunk_2048": (11.9, 106.8), "elastic_chunk_2048": (6.7, 50.7)}
    folder = tmp_path / "h200_x_y"
    for name, (setup_s, replay_s) in runs.items():
        (folder / "runs" / name).mkdir(parents=True)
        summary = {"runs": [{"chunk": 2048, "policy": name.split("_")[0],
                             "measured": {"setup_s": setup_s, "replay_wall_s": replay_s}}]}
        (folder / "runs" / name / "summary.json").write_text(json.dumps(summary))
    assert expected_s(folder) == pytest.approx(11.9 + 106.8 + 6.7 + 50.7 + 2 * PROCESS_START_S)
    (folder / "runs" / "static_chunk_8192").mkdir()
    (folder / "runs" / "static_chunk_8192" / "summary.json").write_text('{"runs": [{"chunk": 8192}]}')
    assert expected_s(folder) is None  # a run that recorded no times: no estimate
    assert expected_s(tmp_path / "new_slice") is None


def test_the_time_limit_starts_only_what_fits_and_stops_what_outlasts_it(tmp_path):
    def command(name: str, code: str, expected: float | None) -> SliceCommand:
        return SliceCommand(name, {}, [sys.executable, "-c", code], tmp_path / name, expected)
    quick = "print('ran')"
    result = remeasure([command("long", quick, 500.0), command("unknown", quick, None),
                        command("short", quick, 1.0)],
                       tmp_path / "out", cwd=tmp_path, time_limit_s=60, log=lambda _: None)
    assert result.status == {"unknown": 0, "short": 0} and result.over_time == ["long"]
    assert not (tmp_path / "out" / "long.log").exists()
    result = remeasure([command("slow", "import time; time.sleep(60)", None),
                        command("next", quick, 1.0)],
                       tmp_path / "again", cwd=tmp_path, time_limit_s=1.5, log=lambda _: None)
    assert result.status == {"slow": None}  # stopped at the limit, nothing after it
    assert not (tmp_path / "again" / "next.log").exists()


def test_a_slice_stopped_at_the_limit_stops_the_replays_it_started(tmp_path):
    """The slice's command starts each replay as a process of its own; stopping the slice
    stops them too, not only the command."""
    import os
    import time

    pid_file = tmp_path / "replay.pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    result = remeasure([SliceCommand("slow", {}, [sys.executable, "-c", code], tmp_path / "s")],
                       tmp_path / "out", cwd=tmp_path, time_limit_s=2.0, log=lambda _: None)
    assert result.status == {"slow": None}
    replay = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        state = Path(f"/proc/{replay}/status")
        if not state.exists() or "State:\tZ" in state.read_text():
            break
        time.sleep(0.05)
    else:
        os.kill(replay, 9)
        raise AssertionError("the replay the slice started outlived it")


def test_runs_cut_the_command_to_those_runs_and_their_estimate(tmp_path):
    """--runs: a repeat stopped short is finished by the runs it lacks, the slice's policy and
    chunk lists cut to theirs; the estimate is theirs."""
    words = shlex.split(read_recipe(EVIDENCE_DIR / ASYNC).command)
    one = slice_command(EVIDENCE_DIR / ASYNC, tmp_path, current_engine=False, gpu_only=True,
                        runs=run_names("elastic/chunk=8192"))
    at = {flag: one.argv[one.argv.index(flag) + 1]
          for flag in ("--policy", "--max-num-batched-tokens")}
    assert at == {"--policy": "elastic", "--max-num-batched-tokens": "8192"}
    assert len(one.argv) == len(words) + 1  # python for python, plus --gpu-only
    summary = json.loads((EVIDENCE_DIR / ASYNC / "runs" / "elastic_chunk_8192" /
                          "summary.json").read_text())
    run = summary["runs"][0] if "runs" in summary else summary
    assert one.expected_s == pytest.approx(run["measured"]["setup_s"] + PROCESS_START_S
                                           + run["measured"]["replay_wall_s"])
    both = slice_command(EVIDENCE_DIR / ASYNC, tmp_path, current_engine=False, gpu_only=False,
                         runs=run_names("static_chunk_8192, elastic_chunk_8192"))
    assert both.argv[both.argv.index("--policy") + 1] == "static,elastic"
    assert both.argv[both.argv.index("--max-num-batched-tokens") + 1] == "8192"


@pytest.mark.parametrize("runs, said", [
    ("elastic_chunk_8192,static_chunk_2048", "a command runs every policy at every chunk it "
                                             "names; name such a grid"),
    ("elastic_chunk_4096", f"{ASYNC}: no run elastic_chunk_4096; its runs: elastic_chunk_2048, "
                           "elastic_chunk_8192, static_chunk_2048, static_chunk_8192"),
    ("elastic-8192", "name runs as their folders do (elastic_chunk_8192) or as their reports "
                     "do (elastic/chunk=8192)"),
])
def test_runs_a_slice_cannot_cut_to_are_refused_before_any_run(tmp_path, capsys, runs, said):
    assert main(["remeasure", ASYNC, "--runs", runs, "--out", str(tmp_path / "out")]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
