"""`python -m sim`'s outputs: --out claimed before any run, each run saved as it ends, Ctrl-C
keeping the finished runs, the comparison table within 100 columns, the plots' integrals and
the Chrome trace events."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from sim.cli import main
from sim.core.catalog import get_gpu
from sim.core.elastic import Policy
from sim.core.engine_config import EngineConfig
from sim.plots import Binned
from sim.recording.metrics import TIMELINE_COLUMNS
from sim.report import TABLE_WIDTH, print_comparison
from sim.runner import RunSpec
from sim.runs import Outputs, run_all
from sim.trace_events import ID_STRIDE
from traces import load_trace

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--trace", "azure-conv", "--limit", "20", "--policy", "static", "--no-progress",
         "--calibration", "none"]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert captured.out == "", "a run happened before the error"
    return lines[0]


# ----------------------------------------------------------------------- --out claimed first
def test_an_out_that_cannot_be_created_fails_before_any_run(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert main([*QUICK, "--out", str(blocker / "results")]) == 2
    assert "cannot create the folder" in one_error_line(capsys)
    assert main([*QUICK, "--out", str(blocker)]) == 2
    assert "is a file, not a folder" in one_error_line(capsys)
    assert main([*QUICK, "--trace-events", str(blocker / "t.json")]) == 2
    assert "--trace-events" in one_error_line(capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_fails_before_any_run(tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert main([*QUICK, "--out", str(folder)]) == 2
        assert "cannot write there" in one_error_line(capsys)
    finally:
        folder.chmod(0o700)


def test_a_used_out_is_refused_and_overwrite_clears_its_stale_files(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    stale = out / "requests_overcommit_chunk_512.csv"
    stale.write_text("request_id\n0\n")
    assert main([*QUICK, "--out", str(out)]) == 2
    assert "is not empty" in one_error_line(capsys) and stale.exists()
    assert main([*QUICK, "--out", str(out), "--overwrite"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == [
        "requests_static_chunk_8192.csv", "summary.json", "timeline_static_chunk_8192.csv"]
    (out / "notes.txt").write_text("mine")
    assert main([*QUICK, "--out", str(out), "--overwrite"]) == 2
    assert "notes.txt" in one_error_line(capsys) and (out / "summary.json").exists()


def test_plot_without_out_is_refused(capsys):
    assert main([*QUICK, "--plot"]) == 2
    assert "--plot" in one_error_line(capsys)


# ---------------------------------------------------------------------------------- Ctrl-C
def test_ctrl_c_keeps_every_finished_run_and_exits_130(tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "sim", "--trace", "azure-conv", "--limit", "6000",
            "--policy", "static,elastic", "--no-progress", "--calibration", "none",
            "--out", str(out)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not (out / "summary.json").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "the first run never finished"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert 1 <= len(runs) < 2, "the second run was meant to be under way"
    labels = [f"{r['policy']}/chunk={r['chunk']}" for r in runs]
    assert f"interrupted: {len(runs)} of 2 runs finished ({', '.join(labels)})" in err
    assert str(out) in err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["requests_static_chunk_8192.csv", "summary.json",
                     "timeline_static_chunk_8192.csv"], names  # no half-written file
    assert len(read_csv(out / "requests_static_chunk_8192.csv")) == runs[0]["num_requests"]


# ---------------------------------------------------------------------------- the table
@pytest.fixture(scope="module")
def stressed_runs():
    """Six runs (three policies x two chunks) of a slice at 30x its rate on an A100-40GB with
    max_model_len 2,048: overloaded, with prompts rejected as too long."""
    trace = load_trace("azure-conv", limit=200).scaled(30)
    base = EngineConfig(gpu=get_gpu("a100-40gb"), max_model_len=2048)
    specs = [RunSpec(replace(base, max_num_batched_tokens=chunk, policy=policy))
             for chunk in (2048, 8192) for policy in Policy]
    done = run_all(specs, trace, Outputs(), show_progress=False)
    assert not done.interrupted and len(done.results) == 6
    return done.results, trace


def test_comparison_table_fits_100_columns_and_shows_rejections_and_overload(stressed_runs):
    results, trace = stressed_runs
    buffer = io.StringIO()
    print_comparison(results, trace, Console(file=buffer, width=400), pricing="pricing: x")
    text = buffer.getvalue()
    widths = [len(line) for line in text.splitlines()]
    assert max(widths) <= TABLE_WIDTH, max(widths)  # laid out at 400, it needs no more
    assert text.count("OVERLOADED") == sum(r.summary["overloaded"] for r in results) > 0
    for r in results:
        policy, chunk = r.spec.label.split("/")
        assert policy in text and chunk in text
        rejected = r.summary["num_rejected_by_reason"]["exceeds_max_model_len"]
        assert rejected > 0 and f"{rejected:,} > max len" in text
        if r.summary["overloaded"]:
            assert f"q {r.summary['queue_at_last_arrival']:,}," in text
    rows = [line for line in text.splitlines() if line.startswith("│ rejected (too long)")]
    assert len(rows) == len(text.split("┏")) - 1  # one such row in every table


def test_rejections_and_overload_warn_on_stderr(tmp_path, capsys):
    argv = ["--trace", "azure-conv", "--limit", "200", "--rate-scale", "30", "--gpu",
            "a100-40gb", "--max-model-len", "2048", "--policy", "static", "--no-progress",
            "--calibration", "none", "--out", str(tmp_path)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    (run,) = json.loads((tmp_path / "summary.json").read_text())["runs"]
    rejected = [r for r in read_csv(tmp_path / "requests_static_chunk_2048.csv")
                if r["status"] == "rejected"]
    assert len(rejected) == run["num_rejected"] > 0
    assert {r["reject_reason"] for r in rejected} == {"exceeds_max_model_len"}
    assert f"{run['num_rejected']:,} of 200 requests rejected as too long" in err
    assert run["overloaded"] and "static/chunk=2048 is overloaded" in err


@pytest.mark.parametrize("scheduling", [["--async-scheduling"],
                                        ["--async-scheduling", "--no-detach-behind-step"],
                                        ["--no-async-scheduling"]])
def test_an_elastic_run_that_reclaims_often_under_async_says_what_measured_its_cost(
        scheduling, tmp_path, capsys):
    """Azure conversations at twice their rate: elastic lends and reclaims its reserve
    several times a second (summary.json's detaches over its makespan). Under async
    scheduling the run carries the measured note on stderr: where it was measured, detaching
    behind the step in flight; likely under-priced, waiting for that step. Synchronously, and
    for static, nothing is said."""
    argv = ["--trace", "azure-conv", "--limit", "300", "--rate-scale", "2", "--policy",
            "static,elastic", "--chunk", "2048", *scheduling, "--no-progress",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    err = " ".join(capsys.readouterr().err.split())
    runs = {r["policy"]: r for r in json.loads((tmp_path / "summary.json").read_text())["runs"]}
    rate = runs["elastic"]["num_detach"] / runs["elastic"]["makespan_s"]
    assert rate > 2
    said = f"note: elastic/chunk=2048 reclaims its reserve {rate:.1f} times a second"
    if scheduling == ["--async-scheduling"]:
        assert f"{said}. At that rate the model's price of elastic's own cost is measured on " \
               "five slices, Azure conversations at 5.3-6.8 reclaims a second" in err
        assert "under-priced" not in err
    elif "--no-detach-behind-step" in scheduling:
        assert (f"{said} and waits for the step in flight before each reclaim: its own cost is "
                "likely under-priced here.") in err
        assert "1.57x its time launched ahead" in err
    else:
        assert "reclaims its reserve" not in err
    assert "static/chunk=2048 reclaims" not in err


def test_each_run_says_which_engine_it_simulated_and_that_engine_runs_again(tmp_path):
    """summary.json holds each run's EngineConfig; saved alone, `--engine-config` runs it
    again to the same figures (the policies to compare still come from `--policy`)."""
    argv = ["--trace", "azure-conv", "--limit", "60", "--policy", "elastic", "--chunk", "2048",
            "--async-scheduling", "--max-num-seqs", "64", "--no-progress", "--calibration",
            "none"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    (run,) = json.loads((tmp_path / "a" / "summary.json").read_text())["runs"]
    saved = run["engine_config"]
    assert (saved["async_scheduling"], saved["max_num_seqs"], saved["policy"],
            saved["max_num_batched_tokens"]) == (True, 64, "elastic", 2048)
    (tmp_path / "engine.json").write_text(json.dumps(saved))
    assert main(["--trace", "azure-conv", "--limit", "60", "--engine-config",
                 str(tmp_path / "engine.json"), "--policy", "elastic", "--no-progress",
                 "--calibration", "none", "--out", str(tmp_path / "b")]) == 0
    (again,) = json.loads((tmp_path / "b" / "summary.json").read_text())["runs"]
    assert again["engine_config"] == saved
    assert (again["ttft_s"], again["tpot_s"]) == (run["ttft_s"], run["tpot_s"])


# ---------------------------------------------------------------------------------- plots
def test_binned_timeline_integrates_rows_exactly():
    """Two steps: [0, 1) s with 10 tokens and batch 2, [2, 4) s with 40 tokens and batch 4;
    idle in [1, 2). Four one-second bins."""
    col = {name: i for i, name in enumerate(TIMELINE_COLUMNS)}
    rows = np.zeros((2, len(TIMELINE_COLUMNS)))
    rows[:, col["start_s"]] = (0.0, 2.0)
    rows[:, col["duration_s"]] = (1.0, 2.0)
    b = Binned(rows, num_bins=4)
    np.testing.assert_allclose(b.rate(np.array([10.0, 40.0])), [10, 0, 20, 20])
    np.testing.assert_allclose(b.busy_mean(np.array([2.0, 4.0])), [2, np.nan, 4, 4])


# ----------------------------------------------------------------------------- trace events
def test_trace_events_hold_steps_and_request_spans_matching_the_csvs(tmp_path, capsys):
    out, events_path = tmp_path / "out", tmp_path / "trace.json"
    argv = ["--trace", "azure-conv", "--limit", "80", "--rate-scale", "4", "--max-model-len",
            "4096", "--policy", "static,elastic", "--chunk", "2048", "--no-progress",
            "--calibration", "none", "--out", str(out), "--trace-events", str(events_path)]
    assert main(argv) == 0
    capsys.readouterr()
    events = json.loads(events_path.read_text())["traceEvents"]
    assert not [p for p in tmp_path.rglob(".partial-*")], "hidden files left behind"
    names = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == ["elastic/chunk=2048", "static/chunk=2048"]
    for label, pid in names.items():
        mine = [e for e in events if e["pid"] == pid]
        requests = read_csv(out / f"requests_{label.replace('/', '_').replace('=', '_')}.csv")
        timeline = read_csv(out / f"timeline_{label.replace('/', '_').replace('=', '_')}.csv")
        check_steps(mine, timeline)
        check_request_spans(mine, requests)


def check_steps(events: list[dict], timeline: list[dict]) -> None:
    steps = [e for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert len(steps) == len(timeline)
    for e, row in zip(sorted(steps, key=lambda e: e["ts"]), timeline):
        # the timeline CSV keeps 9 significant digits, the trace nanoseconds
        assert e["ts"] == pytest.approx(float(row["start_s"]) * 1e6, rel=1e-8, abs=1e-3)
        assert e["dur"] == pytest.approx(float(row["duration_s"]) * 1e6, rel=1e-8, abs=1e-3)
        assert e["args"]["prefill_tokens"] == int(float(row["prefill_tokens"]))
        assert e["args"]["decode_tokens"] == int(float(row["decode_tokens"]))
        assert e["args"]["batch_size"] == int(float(row["num_seqs"]))


def check_request_spans(events: list[dict], requests: list[dict]) -> None:
    spans: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e["ph"] in "be":
            spans[e["id"]].append(e)
    rejected = {e["args"]["request_id"] for e in events if e["ph"] == "i"}
    by_id = {int(r["request_id"]): r for r in requests}
    assert {i for i, r in by_id.items() if r["status"] == "rejected"} == rejected
    assert len(rejected) > 0 and len(spans) == len(by_id) - len(rejected)
    for async_id, span in spans.items():
        outer_begin, *inner, outer_end = span  # begin/end pairs nest inside the request
        row = by_id[outer_begin["args"]["request_id"]]
        assert async_id == outer_begin["pid"] * ID_STRIDE + int(row["request_id"])
        assert outer_begin["ts"] == pytest.approx(float(row["arrival_s"]) * 1e6, abs=1e-3)
        assert outer_end["ts"] == pytest.approx(float(row["finish_s"]) * 1e6, abs=1e-3)
        parts = {e["name"]: [] for e in inner}
        for e in inner:
            parts[e["name"]].append(e)
        assert list(parts) == ["queued", "prefill", "decode"]
        (qb, qe), (pb, pe), (db, de) = parts.values()
        assert [qb["ph"], qe["ph"]] == ["b", "e"] and qb["ts"] == outer_begin["ts"]
        assert qe["ts"] == pb["ts"] <= pe["ts"] == db["ts"] <= de["ts"] == outer_end["ts"]
        assert pe["ts"] == pytest.approx(float(row["first_token_s"]) * 1e6, abs=1e-3)
