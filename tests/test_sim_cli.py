"""`python -m sim`: a bundled-trace slice end to end, the files it writes, and bad input."""

from __future__ import annotations

import csv
import json

import pytest

import sim.__main__
from sim.cli import main

LIMIT = 60
POLICIES = ("static", "elastic")
SUMMARY_KEYS = ("num_requests", "num_finished", "kv_capacity_tokens", "ttft_s", "tpot_s",
                "throughput_tok_s", "num_preemptions", "num_oom")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim_cli")
    code = main(["--trace", "azure-conv", "--limit", str(LIMIT), "--policy", ",".join(POLICIES),
                 "--chunk", "2048", "--out", str(out), "--plot", "--no-progress"])
    assert code == 0
    return out


def read_csv(path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_summary_json_has_one_run_per_policy_with_the_metrics(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["num_trace_requests"] == LIMIT
    assert [r["policy"] for r in summary["runs"]] == list(POLICIES)
    for run in summary["runs"]:
        for key in SUMMARY_KEYS:
            assert key in run, key
        for key in ("ttft_s", "tpot_s"):
            assert set(run[key]) >= {"p50", "p90", "p99"}
            assert 0 < run[key]["p50"] <= run[key]["p90"] <= run[key]["p99"]
        assert run["num_requests"] == run["num_finished"] == LIMIT
        assert run["chunk"] == 2048 and run["kv_capacity_tokens"] > 0
        assert run["throughput_tok_s"] > 0 and run["num_oom"] == 0


def test_csvs_have_one_row_per_request_and_per_timeline_entry(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    for policy, run in zip(POLICIES, summary["runs"]):
        requests = read_csv(run_dir / f"requests_{policy}_chunk_2048.csv")
        assert len(requests) == LIMIT
        assert sorted(int(r["request_id"]) for r in requests) == list(range(LIMIT))
        assert {r["status"] for r in requests} == {"finished"}
        timeline = read_csv(run_dir / f"timeline_{policy}_chunk_2048.csv")
        assert timeline, "empty timeline"
        assert sum(int(float(r["num_steps"])) for r in timeline) == run["num_engine_steps"]
        busy_s = sum(float(r["duration_s"]) for r in timeline)
        assert busy_s == pytest.approx(run["busy_s"], rel=1e-6)


def test_plots_are_written(run_dir):
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    assert pngs == ["latency_cdfs.png", "timeline_elastic_chunk_2048.png",
                    "timeline_static_chunk_2048.png"]
    for name in pngs:
        assert (run_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_flag_prints_the_summaries(capsys):
    code = sim.__main__.main(["--trace", "azure-code", "--limit", "20", "--policy", "static",
                              "--json", "--no-progress"])
    assert code == 0
    (run,) = json.loads(capsys.readouterr().out)
    assert run["num_requests"] == 20 and run["policy"] == "static"


def test_table_names_the_runs(capsys):
    code = sim.__main__.main(["--trace", "azure-conv", "--limit", "10", "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "static" in line)
    assert header.split() == ["┃", "┃", "static", "┃", "elastic", "┃"]
    under = next(line for line in out.splitlines() if "metric" in line)
    assert under.split() == ["┃", "metric", "┃", "chunk=8192", "┃", "chunk=8192", "┃"]
    assert "KV capacity" in out and "TTFT p50" in out


@pytest.mark.parametrize("args, named", [
    (["--model", "llama-9000"], "unknown model 'llama-9000'"),
    (["--gpu", "rtx-1"], "unknown GPU 'rtx-1'"),
    (["--chunk", "abc"], "--max-num-batched-tokens/--chunk: expected an integer, got 'abc'"),
    (["--chunk", "0,2048"], "--max-num-batched-tokens/--chunk: give 1 or more, got '0'"),
    (["--max-num-seqs", "0"], "--max-num-seqs: give 1 or more, got '0'"),
    (["--chunk", "1", "--max-num-seqs", "1024"],
     "max_num_batched_tokens (1) must be at least max_num_seqs (1024)"),
    (["--policy", "greedy"], "unknown policy 'greedy'"),
    (["--policy", ","], "--policy: give one or more values separated by commas"),
    (["--replicas", "0"], "--num-replicas/--replicas: give 1 or more, got '0'"),
    (["--slo-ttft", "-1"], "--slo-ttft: give a number above 0, got '-1'"),
    (["--dtype", "int4"], "--dtype: unknown value 'int4'; known: auto, bfloat16"),
    (["--no-enable-chunked-prefill"], "cannot run it unsplit"),
    (["--cuda-graph-sizes", "0,4"], "--cuda-graph-sizes: expected positive sizes"),
    (["--trace", "no/such/trace.csv"], "file not found"),
    (["--model", "llama-3.1-70b", "--gpu", "a100-40gb"], "does not fit on a100-40gb"),
    (["--calibration", "no/such/calibration.json"], "cannot read calibration JSON"),
])
def test_bad_input_exits_2_with_one_line_naming_the_problem(capsys, args, named):
    argv = ["--trace", "azure-conv", "--limit", "5", "--no-progress", *args]
    if args[0] == "--trace":
        argv = [*args, "--limit", "5", "--no-progress"]
    code = sim.__main__.main(argv)
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: ") and named in lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_argparse_type_errors_exit_2(capsys):
    assert main(["--trace", "azure-conv", "--tp", "two"]) == 2
    err = capsys.readouterr().err
    assert err == "error: argument --tensor-parallel-size/--tp: expected an integer, got 'two'\n"


def test_sim_memory_and_sim_report_the_same_kv_capacity(capsys):
    """One EngineConfig and its defaults behind both commands: the memory plan and the run of
    the same model and GPU hold the same KV pool."""
    from sim.memory_cli import main as memory_main

    for flags in ([], ["--model", "qwen2.5-7b", "--gpu", "a100-80gb", "--chunk", "4096"]):
        assert memory_main(["--json", *flags]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert main(["--trace", "azure-conv", "--limit", "5", "--policy", "static", "--json",
                     "--no-progress", "--calibration", "none", *flags]) == 0
        (run,) = json.loads(capsys.readouterr().out)
        assert run["kv_capacity_tokens"] == plan["kv_capacity_tokens"]
        assert run["max_num_seqs"] == plan["max_num_seqs"] == (1024 if not flags else 256)


def test_synthetic_trace_from_the_command_line_is_seeded(capsys):
    import json

    from sim.__main__ import main

    argv = ["--trace", "synthetic", "--synthetic-requests", "120", "--synthetic-rate", "4",
            "--arrival", "gamma", "--cv", "2", "--prompt-dist", "uniform:100:3000",
            "--output-dist", "fixed:20", "--policy", "static", "--json", "--no-progress"]

    def run(seed: int) -> dict:
        assert main(argv + ["--seed", str(seed)]) == 0
        return json.loads(capsys.readouterr().out)[0]

    first, again, other = run(1), run(1), run(2)
    assert first["num_requests"] == 120 and first["num_finished"] == 120
    assert first["throughput_tok_s"] == again["throughput_tok_s"]
    assert first["ttft_s"] == again["ttft_s"]
    assert first["ttft_s"] != other["ttft_s"]


def test_bad_length_spec_is_a_one_line_error(capsys):
    from sim.__main__ import main

    assert main(["--trace", "synthetic", "--prompt-dist", "lognormal:abc:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--prompt-dist" in err[0] and "Traceback" not in err[0]


def test_cuda_graph_sizes_flag_parses_sorted_sizes_or_none():
    from sim.cli import build_parser, engine_configs

    def sizes(text: str) -> tuple[int, ...]:
        args = build_parser().parse_args(["--trace", "azure-conv", "--cuda-graph-sizes", text])
        return engine_configs(args)[0].cuda_graph_sizes

    assert sizes("8,1,2,8") == (1, 2, 8)
    assert sizes("none") == () and sizes("") == ()
    for bad in ("1,x", "0,4", "-2"):
        assert main(["--trace", "azure-conv", "--cuda-graph-sizes", bad]) == 2


def test_host_slowdown_what_if_lengthens_latency_and_rejects_nonsense(capsys):
    from sim.cli import main

    def ttft_p50(*flags: str) -> float:
        assert main(["--trace", "azure-conv", "--limit", "60", "--policy", "static",
                     "--chunk", "8192", "--no-progress", "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)[0]["ttft_s"]["p50"]

    base = ttft_p50()
    assert ttft_p50("--host-slowdown", "2") > base
    assert main(["--trace", "azure-conv", "--limit", "5", "--host-slowdown", "0",
                 "--no-progress"]) == 2
    assert "host_slower() needs a positive factor" in capsys.readouterr().err


def test_piecewise_graphs_flag_pads_prefill_steps_to_each_chunks_capture_sizes(capsys):
    from sim.cli import build_parser, engine_configs

    def configs(*flags: str):
        return engine_configs(build_parser().parse_args(["--trace", "azure-conv", *flags]))

    assert [c.piecewise_graph_sizes for c in configs("--chunk", "100")] == [(), ()]
    padded = configs("--chunk", "100,8192", "--policy", "static", "--piecewise-graphs")
    assert padded[0].piecewise_graph_sizes == (16, 32, 48, 64, 80, 96, 100)
    assert len(padded[1].piecewise_graph_sizes) == 56  # 16 + 12 + 28 sizes up to 8192
    # no --chunk: vLLM's default for an H200, 8192
    assert configs("--piecewise-graphs")[0].piecewise_graph_sizes[-1] == 8192

    def ttft_p50(*flags: str) -> float:
        assert main(["--trace", "azure-conv", "--limit", "60", "--policy", "static",
                     "--chunk", "2048", "--no-progress", "--json", "--calibration", "none",
                     "--no-async-scheduling", *flags]) == 0
        return json.loads(capsys.readouterr().out)[0]["ttft_s"]["p50"]

    # the same efficiencies both ways, each step priced in full: padded prefills take longer
    assert ttft_p50("--piecewise-graphs") > ttft_p50()


def test_piecewise_max_tokens_caps_the_priced_graphs(tmp_path, capsys):
    from sim.cli import build_parser, engine_configs

    def configs(*flags: str):
        return engine_configs(build_parser().parse_args(["--trace", "azure-conv", *flags]))

    capped = configs("--chunk", "300,8192", "--policy", "static", "--piecewise-graphs",
                     "--piecewise-max-tokens", "512")
    assert capped[0].piecewise_graph_sizes[-1] == 300  # the chunk is below the cap
    assert capped[1].piecewise_graph_sizes[-1] == 512 and len(capped[1].piecewise_graph_sizes) == 20
    assert main(["--trace", "azure-conv", "--limit", "5", "--no-progress",
                 "--piecewise-max-tokens", "512"]) == 2
    assert "add --piecewise-graphs" in capsys.readouterr().err
    # a profile whose graphs held every grid step never timed a fully eager one: a capped run
    # prices its longer steps with an eager_launch_s nobody measured, and is told so
    uncapped = tmp_path / "uncapped.json"
    uncapped.write_text(json.dumps({
        "efficiency": {"eager_launch_s": 0.0, "piecewise_launch_s": 0.003},
        "piecewise_sizes": [16, 32, 2048],
        "measurements": [*({"kind": "prefill", "prefills": [[n, 0]], "num_decodes": 0}
                           for n in (100, 1000, 2000)),
                         {"kind": "prefill", "prefills": [[4096, 0]], "num_decodes": 0},
                         {"kind": "decode", "prefills": [], "num_decodes": 8}]}))
    run = ["--trace", "azure-conv", "--limit", "5", "--policy", "static", "--chunk", "2048",
           "--no-progress", "--json", "--piecewise-graphs", "--calibration", str(uncapped)]
    assert main(run) == 0
    assert "note:" not in capsys.readouterr().err
    assert main([*run, "--piecewise-max-tokens", "512"]) == 0
    err = capsys.readouterr().err
    assert "eager_launch_s was not measured" in err and str(uncapped) in err


def test_a_calibration_profiled_the_other_way_gets_a_note(tmp_path, capsys):
    """A piecewise profile's launch term is the piecewise engine's: running it without
    --piecewise-graphs (or an eager profile with it) runs, with a note saying so."""
    eager = tmp_path / "eager.json"
    eager.write_text(json.dumps({"efficiency": {"eager_launch_s": 0.013}}))
    piecewise = tmp_path / "piecewise.json"
    piecewise.write_text(json.dumps({"efficiency": {"eager_launch_s": 0.003},
                                     "piecewise_sizes": [16, 32, 2048]}))
    args = ["--trace", "azure-conv", "--limit", "5", "--policy", "static", "--chunk", "2048",
            "--no-progress", "--json", "--calibration"]
    for path, flags, noted in ((piecewise, [], "add --piecewise-graphs"),
                               (eager, ["--piecewise-graphs"], "keeps that launch time"),
                               (piecewise, ["--piecewise-graphs"], None), (eager, [], None)):
        assert main([*args, str(path), *flags]) == 0
        err = capsys.readouterr().err
        assert (noted in err and str(path) in err) if noted else "note:" not in err


@pytest.mark.parametrize("doc, message", [
    ({"efficiency": {}, "piecewise_sizes": "16,32"}, "piecewise_sizes is '16,32'"),
    ([1, 2], 'no "efficiency" object'),
])
def test_malformed_calibrations_name_the_file_and_field(tmp_path, capsys, doc, message):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(doc))
    assert main(["--trace", "azure-conv", "--limit", "5", "--no-progress",
                 "--calibration", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err


@pytest.mark.parametrize("args, named", [
    (["--host-slowdown", "nan"], "needs a positive factor, got nan (--host-slowdown: a finite"),
    (["--host-slowdown", "inf"], "needs a positive factor, got inf (--host-slowdown: a finite"),
    (["--slo-ttft", "inf"], "--slo-ttft: give a finite number, got 'inf'"),
    (["--chunk", "2048,2048"],
     "argument --max-num-batched-tokens/--chunk: '2048' is given twice: give each value once"),
    (["--policy", "static,elastic,static"],
     "argument --policy: 'static' is given twice: give each value once"),
    (["--rate-scale", "inf"], "rate_scale must be > 0 and finite"),
    (["--rate-scale", "1e-300"], "s, beyond 1e+11 s: give a larger rate scale"),
    (["--replicas", "1000000"], "--num-replicas 1000000 is more than the trace's 5 requests"),
])
def test_nonsense_numbers_and_repeated_values_exit_2(capsys, args, named):
    code = main(["--trace", "azure-conv", "--limit", "5", "--no-progress", *args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and named in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag, text, named", [
    ("--engine-config", "[" * 100_000, "is not valid JSON: maximum recursion depth"),
    ("--engine-config", '{"tensor_parallel_size": 1' + "0" * 5000 + "}",
     "is not valid JSON: Exceeds the limit"),
    ("--engine-config", '{"model": {"name": "m", "moe": [1]}}',
     "model: ModelSpec.moe: expected an object of MoeSpec fields, got [1]"),
    ("--calibration", "[" * 100_000, "cannot read calibration JSON: maximum recursion depth"),
    ("--calibration", '{"efficiency": {"step_overhead_s": Infinity}}',
     "efficiency step_overhead_s=inf is out of range"),
    ("--calibration", '{"efficiency": {"per_seq_overhead_s": NaN}}',
     "efficiency per_seq_overhead_s=nan is out of range"),
])
def test_damaged_config_files_name_the_file(tmp_path, capsys, flag, text, named):
    path = tmp_path / "file.json"
    path.write_text(text)
    code = main(["--trace", "azure-conv", "--limit", "5", "--no-progress", flag, str(path)])
    captured = capsys.readouterr()
    assert code == 2 and named in captured.err and str(path) in captured.err, captured.err
    assert "Traceback" not in captured.err


def test_a_calibration_of_another_model_or_gpu_is_carried_to_the_run(tmp_path, capsys):
    """--calibration FILE measured on Llama-3.2-3B prices a Llama-3.1-8B run as the documented
    transfer does (the 8B's layers and activation bytes), and says it was carried and that no
    validated slice vouches for it; the same file on its own model and GPU is used as it is."""
    from sim.core.calibration import load_calibration, save_calibration, transfer

    source = "calibration/h200/llama-3.2-3b-piecewise.json"
    written = tmp_path / "8b-from-3b.json"
    save_calibration(written, transfer(load_calibration(source), "llama-3.1-8b").data)
    run = ["--trace", "azure-conv", "--limit", "20", "--policy", "static,elastic", "--chunk",
           "2048", "--no-progress", "--json", "--piecewise-graphs", "--gpu", "h200"]

    def summary(*flags: str) -> dict:
        assert main([*run, *flags]) == 0
        return json.loads(capsys.readouterr().out)

    carried = summary("--model", "llama-3.1-8b", "--calibration", source)
    assert len(carried) == 2
    explicit = summary("--model", "llama-3.1-8b", "--calibration", str(written))
    own = summary("--model", "llama-3.2-3b", "--calibration", source)
    for a, b in zip(carried, explicit, strict=True):
        assert a["kv_capacity_tokens"] == b["kv_capacity_tokens"]
        assert a["ttft_s"] == b["ttft_s"]
    assert "transferred from llama-3.2-3b" in carried[0]["pricing"]["description"]
    assert "transferred" not in own[0]["pricing"]["description"]
    assert main(["--trace", "azure-conv", "--limit", "5", "--policy", "static", "--chunk",
                 "2048", "--no-progress", "--piecewise-graphs", "--gpu", "h100",
                 "--model", "llama-3.2-3b", "--calibration", source]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the table's lines wrap
    assert "transferred from llama-3.2-3b on h200-141gb" in out
    assert f"no validated slice is priced by {source} -> llama-3.2-3b on h100-80gb" in out
    # carried, its grid still says which launches timed its terms: capped graphs are told
    assert main(["--trace", "azure-conv", "--limit", "5", "--policy", "static", "--chunk",
                 "2048", "--no-progress", "--piecewise-graphs", "--piecewise-max-tokens", "512",
                 "--gpu", "h100", "--model", "llama-3.2-3b", "--calibration", source]) == 0
    said = " ".join("".join(capsys.readouterr()).split())
    assert (f"{source} -> llama-3.2-3b on h100-80gb timed every step through piecewise graphs"
            in said and "its eager_launch_s was not measured" in said)
