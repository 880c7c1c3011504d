"""`compare --repeat-dir`: the same replays measured again, and how far they moved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from validation.commands import load_runs
from validation.repeats import errors_against_median, median_deviation, repeat_rows
from validation.table import table

CONFIG = {"model": "llama-3.1-8b", "gpu": "h200-141gb", "drain": "preempt",
          "tensor_parallel_size": 1, "max_num_seqs": 256, "block_size": 16,
          "max_model_len": 32768, "trace_path": "azure-code", "limit": 150, "window_s": None,
          "rate_scale": 2.0, "seed": 0, "num_requests": 150, "enable_prefix_caching": False}


def write_replay(folder, policy: str, ttft_p50: float, tpot_p50: float, **config) -> None:
    """A replay folder as `python -m gpu_backend replay --out` writes it (no steps)."""
    folder.mkdir(parents=True)
    run = {**CONFIG, **config, "policy": policy, "chunk": 8192,
           "ttft_s": {"p50": ttft_p50, "p99": 1.0}, "tpot_s": {"p50": tpot_p50, "p99": 0.05},
           "throughput_tok_s": 100.0}
    (folder / "summary.json").write_text(json.dumps({"trace": "/x/code.csv", "runs": [run]}))
    (folder / "steps.csv").write_text("step_id,num_prefill_tokens,num_decode_tokens,"
                                      "decode_context_tokens,num_seqs,measured_s\n")


TABLE_METRICS = ("ttft_p50_s", "tpot_p50_s", "throughput_tok_s", "ttft_p99_s")


def write_table_report(folder, run: dict, **extra) -> None:
    """A report.json with one run of exact predictions, plus `extra` top-level keys."""
    metrics = {m: {"predicted": 1.0, "measured": 1.0, "difference": 0.0, "relative_error": 0.0}
               for m in (*TABLE_METRICS, "kv_capacity_tokens", "reserve_share")}
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps(
        {"runs": [{"label": "run0", **run, "metrics": metrics}], **extra}))


def rows_by(rows, run, metric):
    return next(r for r in rows if r["run"] == run and r["metric"] == metric)


def test_largest_deviation_of_any_repeat_per_run_and_metric(tmp_path):
    write_replay(tmp_path / "now" / "static", "static", 0.200, 0.020)
    write_replay(tmp_path / "now" / "elastic", "elastic", 0.250, 0.021)
    write_replay(tmp_path / "a" / "static", "static", 0.220, 0.019)  # +10%, -5%
    write_replay(tmp_path / "a" / "elastic", "elastic", 0.250, 0.0168)  # 0%, -20%
    write_replay(tmp_path / "b" / "static", "static", 0.190, 0.023)  # -5%, +15%
    repeats = [("a", load_runs(tmp_path / "a")), ("b", load_runs(tmp_path / "b"))]
    rows = repeat_rows(load_runs(tmp_path / "now"), repeats)
    static_ttft = rows_by(rows, "static/chunk=8192", "ttft_p50_s")
    assert [o["name"] for o in static_ttft["repeats"]] == ["a", "b"]
    assert static_ttft["max_deviation"] == pytest.approx(0.10)
    assert rows_by(rows, "static/chunk=8192", "tpot_p50_s")["max_deviation"] == pytest.approx(0.15)
    elastic_tpot = rows_by(rows, "elastic/chunk=8192", "tpot_p50_s")
    assert [o["name"] for o in elastic_tpot["repeats"]] == ["a"]  # b has no elastic replay
    assert elastic_tpot["max_deviation"] == pytest.approx(0.20)
    assert rows_by(rows, "elastic/chunk=8192", "throughput_tok_s")["max_deviation"] == 0.0
    spread = median_deviation(rows)  # over the two runs
    assert spread["ttft_p50_s"] == pytest.approx((0.10 + 0.0) / 2)
    assert spread["tpot_p50_s"] == pytest.approx((0.15 + 0.20) / 2)


def test_the_model_against_the_median_of_every_replay(tmp_path):
    write_replay(tmp_path / "now" / "static", "static", 0.200, 0.020)
    write_replay(tmp_path / "now" / "elastic", "elastic", 0.250, 0.021)
    write_replay(tmp_path / "a" / "static", "static", 0.220, 0.019)
    write_replay(tmp_path / "b" / "static", "static", 0.190, 0.023)
    write_replay(tmp_path / "a" / "elastic", "elastic", 0.270, 0.020)
    repeats = [("a", load_runs(tmp_path / "a")), ("b", load_runs(tmp_path / "b"))]
    rows = repeat_rows(load_runs(tmp_path / "now"), repeats)
    assert rows_by(rows, "static/chunk=8192", "ttft_p50_s")["median"] == pytest.approx(0.200)
    assert rows_by(rows, "static/chunk=8192", "tpot_p50_s")["median"] == pytest.approx(0.020)
    assert rows_by(rows, "elastic/chunk=8192", "ttft_p50_s")["median"] == pytest.approx(0.260)
    assert rows_by(rows, "elastic/chunk=8192", "ttft_p50_s")["num_replays"] == 2
    predicted = {"static/chunk=8192": {"ttft_p50_s": 0.210, "tpot_p50_s": 0.018},
                 "elastic/chunk=8192": {"ttft_p50_s": 0.286, "tpot_p50_s": None}}
    result = errors_against_median(rows, predicted)
    by = {(r["run"], r["metric"]): r["relative_error"] for r in result["rows"]}
    assert by[("static/chunk=8192", "ttft_p50_s")] == pytest.approx(0.05)  # 0.210 / 0.200
    assert by[("elastic/chunk=8192", "ttft_p50_s")] == pytest.approx(0.10)  # 0.286 / 0.260
    assert by[("static/chunk=8192", "tpot_p50_s")] == pytest.approx(-0.10)
    assert by[("elastic/chunk=8192", "tpot_p50_s")] is None  # nothing predicted
    assert result["median_abs"]["ttft_p50_s"] == pytest.approx(0.075)
    assert result["median_abs"]["tpot_p50_s"] == pytest.approx(0.10)  # the one run with both
    assert result["median_abs"]["throughput_tok_s"] is None


def test_table_sets_each_model_against_its_replays_median(tmp_path):
    def report(name, model, errors):
        rows = [{"run": f"run{i}", "metric": m, "predicted": 1.0 + e, "median": 1.0,
                 "num_replays": 3, "relative_error": e}
                for i, e in enumerate(errors) for m in TABLE_METRICS]
        write_table_report(tmp_path / name, {"config": {"model": model}},
                           vs_replay_median={"rows": rows})

    report("a", "big", [0.02, -0.04])
    report("b", "small", [0.08])
    report("c", "small", [-0.06, 0.01])
    lines = table([tmp_path / "a", tmp_path / "b", tmp_path / "c"]).splitlines()
    start = next(i for i, line in enumerate(lines) if "median of every replay" in line)
    rows = lines[start:]
    assert "| a | 2 | 3.0% | 3.0% | 3.0% | 3.0% |" in rows
    assert "| b | 1 | **8.0%** | **8.0%** | **8.0%** | 8.0% |" in rows  # TTFT p99 limit 10%
    assert "| all big runs | 2 | 3.0% | 3.0% | 3.0% | 3.0% |" in rows
    assert "| all small runs | 3 | **6.0%** | **6.0%** | **6.0%** | 6.0% |" in rows  # 8, 6, 1
    assert "| all of the above | 5 | 4.0% | 4.0% | 4.0% | 4.0% |" in rows  # 2, 4, 8, 6, 1


def test_a_repeat_of_another_configuration_is_a_clear_error(tmp_path):
    write_replay(tmp_path / "now" / "static", "static", 0.2, 0.02)
    write_replay(tmp_path / "other" / "static", "static", 0.2, 0.02, rate_scale=1.0)
    with pytest.raises(ValueError, match=r"other/static/summary.json: rate_scale is 1.0 but the "
                                         r"replay it repeats .*now/static/summary.json\) has 2.0"):
        repeat_rows(load_runs(tmp_path / "now"), [("other", load_runs(tmp_path / "other"))])


def test_a_repeat_folder_without_replays_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: no summary.json found"):
        load_runs(tmp_path / "empty")


def test_table_lists_each_reports_repeat_deviation_and_pools_the_runs(tmp_path):
    def report(name, deviations):
        rows = [{"run": f"run{i}", "metric": m, "value": 1.0, "repeats": [],
                 "max_deviation": d}
                for i, d in enumerate(deviations) for m in TABLE_METRICS]
        write_table_report(tmp_path / name, {}, repeats=rows)

    report("a", [0.02, 0.10])
    report("b", [0.30])
    lines = table([tmp_path / "a", tmp_path / "b"]).splitlines()
    assert "| a | 2 | 6.0% | 6.0% | 6.0% | 6.0% |" in lines
    assert "| b | 1 | 30.0% | 30.0% | 30.0% | 30.0% |" in lines
    assert "| all of the above | 3 | 10.0% | 10.0% | 10.0% | 10.0% |" in lines  # 2, 10, 30


def test_host_speed_line_compares_each_replay_with_the_profile():
    from validation.report import host_speed_line

    probe = {"median_s": 0.007, "count": 9}
    runs = [("static/chunk=8192", {"measured": {"host_probe": {"median_s": 0.014}}}),
            ("elastic/chunk=8192", {"measured": {"host_probe": None}}),  # wall-clock replay
            ("old/chunk=8192", {})]  # a replay from before the probe
    line = host_speed_line(probe, runs)
    assert "profile 7.00 ms" in line and "static/chunk=8192 14.00 ms (2.00x the profile's)" in line
    assert "elastic" not in line and "old" not in line
    assert host_speed_line(None, runs).startswith(
        "Host speed (a fixed Python loop, median; launch-bound steps scale with it): profile not "
        "recorded; static/chunk=8192 14.00 ms.")
    assert host_speed_line(None, runs[1:]) == ""


def test_run_with_repeats_replays_each_round_and_reports_the_spread(tmp_path, monkeypatch):
    """`validation run --repeats 2` with the GPU replay stood in by simulator-written runs
    (validation.synthetic): the second round's host is 10% slower, so the report must show
    the first round matching the simulator and the second one moved."""
    import subprocess

    from sim.core.catalog import get_gpu, get_model
    from sim.core.cost_model import Efficiency, slower
    from sim.core.elastic import Policy
    from sim.core.engine_config import EngineConfig
    from sim.runner import RunSpec
    from validation import commands
    from validation.cli import main
    from validation.runs import TraceSlice
    from validation.synthetic import write_gpu_style_run

    replayed = []

    def fake_replay(cmd, **_):
        arg = {k: v for k, v in zip(cmd, cmd[1:]) if k.startswith("--")}
        out = Path(arg["--out"])
        replayed.append(out.relative_to(tmp_path).as_posix())
        eff = slower(Efficiency(), 1.1) if "gpu_repeat2" in out.parts else Efficiency()
        config = EngineConfig.from_json(Path(arg["--engine-config"]).read_text())
        assert config == EngineConfig(get_model("llama-3.1-8b"), get_gpu("h200"),
                                      policy=Policy.STATIC, max_num_batched_tokens=2048,
                                      max_num_seqs=64)
        write_gpu_style_run(out, RunSpec(config, efficiency=eff),
                            TraceSlice("azure-conv", limit=int(arg["--limit"])))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(commands.subprocess, "run", fake_replay)
    assert main(["run", "--trace", "azure-conv", "--limit", "40", "--model", "llama-3.1-8b",
                 "--policy", "static", "--chunk", "2048", "--max-num-seqs", "64",
                 "--repeats", "2", "--no-fit", "--calibration", "none", "--no-plots",
                 "--out", str(tmp_path / "v")]) == 0
    assert replayed == ["v/gpu/static_chunk_2048", "v/gpu_repeat2/static_chunk_2048"]
    report = json.loads((tmp_path / "v" / "report" / "report.json").read_text())
    errors = report["runs"][0]["metrics"]
    assert abs(errors["tpot_p50_s"]["relative_error"]) < 1e-9  # round 1 is the simulation
    tpot = next(r for r in report["repeats"] if r["metric"] == "tpot_p50_s")
    assert [o["name"] for o in tpot["repeats"]] == ["gpu_repeat2"]
    assert tpot["max_deviation"] == pytest.approx(0.10, abs=0.03)  # 10% longer steps
    assert main(["run", "--trace", "azure-conv", "--limit", "5", "--model", "llama-3.1-8b",
                 "--repeats", "0", "--out", str(tmp_path / "w")]) == 2


def test_run_with_profile_profiles_first_and_compares_with_it(tmp_path, monkeypatch, capsys):
    """`validation run --profile`: `gpu_backend profile` runs first, with the replays' engine
    configuration at the largest chunk (a file, as each replay's), into OUT/calibration.json,
    and the report is made with that calibration; with --calibration as well it refuses."""
    import subprocess

    from sim.core.catalog import get_gpu, get_model
    from sim.core.cost_model import Efficiency, piecewise_capture_sizes
    from sim.core.elastic import Policy
    from sim.core.engine_config import EngineConfig
    from sim.runner import RunSpec
    from validation import commands
    from validation.cli import main
    from validation.runs import TraceSlice
    from validation.synthetic import write_gpu_style_run

    true = Efficiency(linear_compute=0.6, eager_launch_s=0.004)
    commands_run = []

    def fake_gpu(cmd, **_):
        commands_run.append(cmd[3:])
        arg = {k: v for k, v in zip(cmd, cmd[1:]) if k.startswith("--")}
        given = EngineConfig.from_json(Path(arg["--engine-config"]).read_text())
        sizes = piecewise_capture_sizes(given.chunk_tokens)
        assert given.piecewise_graph_sizes == sizes and given.max_num_seqs == 64
        if cmd[3] == "profile":
            Path(arg["--out"]).parent.mkdir(parents=True, exist_ok=True)
            Path(arg["--out"]).write_text(json.dumps(
                {"efficiency": vars(true), "piecewise_sizes": list(sizes)}))
            return subprocess.CompletedProcess(cmd, 0)
        config = EngineConfig(get_model("qwen2.5-0.5b"), get_gpu("h200"), policy=Policy.STATIC,
                              max_num_batched_tokens=given.chunk_tokens, max_num_seqs=64,
                              piecewise_graph_sizes=sizes)
        assert given == config
        write_gpu_style_run(Path(arg["--out"]), RunSpec(config, efficiency=true),
                            TraceSlice("azure-conv", limit=int(arg["--limit"])))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(commands.subprocess, "run", fake_gpu)
    out = tmp_path / "v"
    assert main(["run", "--trace", "azure-conv", "--limit", "30", "--model", "qwen2.5-0.5b",
                 "--policy", "static", "--chunk", "1024,2048", "--no-fit", "--no-plots",
                 "--piecewise-graphs", "--max-num-seqs", "64", "--replay-args=--no-graphs",
                 "--profile", "--out", str(out)]) == 0
    assert commands_run[0] == ["profile", "--engine-config", str(out / "configs" / "profile.json"),
                               "--out", str(out / "calibration.json")]
    assert EngineConfig.from_json((out / "configs" / "profile.json").read_text()).chunk_tokens \
        == 2048
    assert [c[0] for c in commands_run] == ["profile", "replay", "replay"]
    assert all(c[-1] == "--no-graphs" for c in commands_run[1:])
    report = json.loads((out / "report" / "report.json").read_text())
    assert str(out / "calibration.json") in (out / "report" / "report.md").read_text()
    for run in report["runs"]:  # the profile's efficiencies: the replays simulated exactly
        assert abs(run["metrics"]["ttft_p50_s"]["relative_error"]) < 1e-9
    capsys.readouterr()
    assert main(["run", "--trace", "azure-conv", "--limit", "5", "--model", "qwen2.5-0.5b",
                 "--profile", "--calibration", str(out / "calibration.json"),
                 "--out", str(tmp_path / "w")]) == 2
    assert "drop --calibration" in capsys.readouterr().err


def test_transition_line_lists_each_replays_attaches_and_detaches():
    from validation.report import transition_line

    runs = [("elastic/chunk=8192", {"measured": {
                "attach_latency_s": {"count": 275, "mean": 0.0012, "p50": 0.00074, "max": 0.11929},
                "detach_latency_s": {"count": 274, "mean": 0.0009, "p50": 0.00055, "max": 0.07514}}}),
            ("static/chunk=8192", {"measured": {
                "attach_latency_s": {"count": 0, "mean": None, "p50": None, "max": None}}}),
            ("old/chunk=8192", {})]
    line = transition_line(runs)
    assert ("elastic/chunk=8192: attach 275 x, p50 0.74 ms, max 119.3 ms; detach 274 x, "
            "p50 0.55 ms, max 75.1 ms") in line
    assert "static" not in line and "old" not in line
    assert transition_line(runs[1:]) == ""


def test_the_profile_takes_the_replays_piecewise_cap_and_replay_args_no_engine_flags(
        tmp_path, capsys, monkeypatch):
    """`validation run --profile` profiles as the replays run: with their cap, the grid's
    longer steps run fully eager, so the calibration measures both launch terms. Engine
    settings go to `validation run` itself, never through --replay-args."""
    import subprocess

    from sim.core.engine_config import EngineConfig
    from validation import commands
    from validation.cli import main

    def no_gpu(cmd, **_):
        return subprocess.CompletedProcess(cmd, 1)

    out = tmp_path / "v"
    monkeypatch.setattr(commands.subprocess, "run", no_gpu)
    assert main(["run", "--trace", "azure-conv", "--model", "llama-3.2-3b", "--chunk",
                 "2048,8192", "--piecewise-graphs", "--piecewise-max-tokens", "512",
                 "--profile", "--out", str(out)]) == 1  # the stand-in GPU run fails
    profiled = EngineConfig.from_json((out / "configs" / "profile.json").read_text())
    assert profiled.chunk_tokens == 8192 and profiled.piecewise_graph_sizes[-1] == 512
    capsys.readouterr()
    assert main(["run", "--trace", "azure-conv", "--replay-args", "--chunk 2048 --no-graphs",
                 "--out", str(out)]) == 2
    assert "names engine flags (--chunk): give them to `validation run`" in capsys.readouterr().err


def test_slowest_transition_line_names_its_phases():
    import numpy as np

    from validation.report import slowest_transition_line

    moves = {"step_id": np.array([10.0, 20.0, 30.0]),
             "kind": np.array(["attach", "detach", "attach"]),
             "total_s": np.array([0.0008, 0.0005, 0.1193]),
             "empty_cache_s": np.array([0.0005, 0.0, 0.1189]), "copy_s": np.zeros(3),
             "map_s": np.array([0.0003, 0.0, 0.0004]), "unmap_s": np.array([0.0, 0.0005, 0.0]),
             "freed_bytes": np.array([0.0, 0.0, 0.5 * 2**30])}
    line = slowest_transition_line([("elastic/chunk=8192", moves), ("static/chunk=8192", None)])
    assert ("elastic/chunk=8192: attach before step 30, 119.3 ms (empty cache 118.9 ms, "
            "map 0.4 ms; 0.50 GiB of torch's cache freed)") in line
    assert "static" not in line
    assert slowest_transition_line([("static/chunk=8192", None)]) == ""


def test_a_repeat_kept_as_its_summary_alone_still_counts(tmp_path):
    """Repeats keep summary.json only (validation/evidence/README.md): the
    repeat tables read nothing else, while a compared replay still needs its steps."""
    from validation.runs import load_run, load_summary

    write_replay(tmp_path / "now" / "static", "static", 0.200, 0.020)
    write_replay(tmp_path / "old" / "static", "static", 0.240, 0.020)
    (tmp_path / "old" / "static" / "steps.csv").unlink()
    old = load_summary(tmp_path / "old" / "static")
    assert old.label == "static/chunk=8192"
    rows = repeat_rows(load_runs(tmp_path / "now"), [("old", [old])])
    assert rows_by(rows, "static/chunk=8192", "ttft_p50_s")["max_deviation"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="no steps.csv"):
        load_run(tmp_path / "old" / "static")
