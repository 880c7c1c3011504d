"""Planning layer: sweep table, Ray parity, the plan's chunk pick, fits=False rows, max rate."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sim.planning import (
    Case,
    EngineOptions,
    Executor,
    PlanQuery,
    RateSearch,
    Sustain,
    SyntheticSpec,
    TraceSpec,
    find_max_rate,
    load_sweep,
    run_plan,
    run_sweep,
    write_table,
)
from sim.planning.plan import MaxRateRows
from sim.planning.reserve import reserve_rows
from sim.planning.sweep import WALL_CLOCK_COLUMNS, missing_metrics
from sim.recording.metrics import Slo
from traces import LengthDist

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sweep.yaml"
QUIET = Executor(workers=1, show_progress=False)


def small_trace(num_requests: int = 40, rate_per_s: float = 4.0) -> TraceSpec:
    return TraceSpec(synthetic=SyntheticSpec(
        num_requests, rate_per_s, LengthDist.uniform(256, 2048), LengthDist.uniform(16, 64),
        seed=7))


def small_cases() -> list[Case]:
    trace = small_trace()
    cases = [Case(model, "h200", 1, chunk, policy, trace)
             for model in ("llama-3.2-1b", "qwen2.5-0.5b")
             for chunk in (512, 8192) for policy in ("static", "elastic")]
    # Llama-3.1-70B's 141 GB of bf16 weights exceed one H200: a fits=False row.
    cases.append(Case("llama-3.1-70b", "h200", 1, 8192, "static", trace))
    return cases


def test_sweep_has_one_row_per_case_and_no_missing_metrics(tmp_path):
    cases = small_cases()
    rows = run_sweep(cases, Executor(workers=2, show_progress=False))
    assert len(rows) == len(cases)
    for case, row in zip(cases, rows):
        assert (row["model"], row["chunk"], row["policy"]) == (case.model, case.chunk, case.policy)
    fitting = [r for r in rows if r["fits"]]
    assert len(fitting) == len(cases) - 1
    for row in fitting:
        assert missing_metrics(row) == []
        assert row["num_finished"] == 40
        assert "ttft_s_p50" in row and "kv_capacity_tokens" in row
    paths = write_table(rows, tmp_path)
    header = paths[0].read_text().splitlines()[0].split(",")
    assert len(paths[0].read_text().splitlines()) == len(cases) + 1
    assert {"fits", "ttft_s_p99", "goodput_req_s", "rate_scale"} <= set(header)


def test_config_that_does_not_fit_is_a_fits_false_row():
    rows = run_sweep(small_cases()[-1:], QUIET)
    assert rows[0]["fits"] is False
    assert "does not fit" in rows[0]["fit_error"]
    assert rows[0].get("goodput_req_s") is None


def test_example_yaml_expands_to_the_full_grid():
    spec = load_sweep(EXAMPLE)
    # 2 models x 1 GPU x 2 TP x 3 traces (azure window + 2 synthetic prompts) x 2 rates
    # x 3 chunks x 2 policies
    assert len(spec.cases()) == 2 * 2 * 3 * 2 * 3 * 2


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_local_gives_the_same_rows_as_local():
    cases = small_cases()[:4]
    local = run_sweep(cases, QUIET)
    ray_rows = run_sweep(cases, Executor(workers=2, ray_address="local", show_progress=False))

    def comparable(row: dict) -> dict:
        return {k: v for k, v in row.items() if k not in WALL_CLOCK_COLUMNS}

    assert [comparable(r) for r in ray_rows] == [comparable(r) for r in local]


def test_plan_picks_the_largest_chunk_whose_kv_pool_holds_the_prompt():
    """Hand computation. Qwen2.5-32B on one H200 (139.8 GiB x 0.9 usable = 125.8 GiB),
    max_num_seqs 16 (so the sampler peak is tiny and the forward peak sets the reserve):
    weights 65.5 GB; the reserve grows by ~(2H + 3I + H) x 2 B = 196 kB per chunk token
    (H = 5120, I = 27648), the KV costs 2 x 64 layers x 8 heads x 128 x 2 B = 256 kB per
    token. So each extra chunk token costs ~0.77 KV tokens: the pool holds ~261k tokens at
    chunk 2048, ~257k at 8192 and ~238k at 32768. A 249,000-token prompt (max_model_len
    250,000) leaves chunk 32768 out ("does not fit"). With requests far apart every one runs
    alone: each meets the (loose) SLO, so goodput ties within 1% and the pick rule falls
    to the lower p99 TTFT. The prefill math is the same at any chunk but 8192 takes 31
    steps instead of 122, saving the per-step overhead, so 8192 must win.
    """
    spec = SyntheticSpec(3, 0.001, LengthDist.fixed(249_000), LengthDist.fixed(8),
                         arrival="constant")
    query = PlanQuery(
        model="qwen2.5-32b", gpu="h200", tp=1, trace=TraceSpec(synthetic=spec),
        chunks=(2048, 8192, 32768),
        options=EngineOptions(max_num_seqs=16, max_model_len=250_000,
                              allow_long_max_model_len=True),  # past Qwen2.5's 32,768
        max_rate=MaxRateRows.NONE)
    result = run_plan(query, QUIET)
    fits = {(r["policy"], r["chunk"]): r["fits"] for r in result.rows}
    assert fits[("static", 32768)] is False and fits[("elastic", 32768)] is False
    assert fits[("static", 2048)] and fits[("static", 8192)]
    assert result.static_pick is not None and result.static_pick["chunk"] == 8192
    by_chunk = {r["chunk"]: r for r in result.rows if r["policy"] == "static" and r["fits"]}
    assert by_chunk[8192]["ttft_s_p99"] < by_chunk[2048]["ttft_s_p99"]


def test_max_rate_search_brackets_the_boundary():
    case = Case("llama-3.2-1b", "h200", 1, 2048, "static", small_trace(60, 2.0),
                slo=Slo(ttft_s=0.05, tpot_s=None))
    search = RateSearch(Sustain(case.slo), rel_tol=0.1, max_scale=512.0)
    found = find_max_rate(case, search)
    assert found.max_rate_scale > 0 and not found.above_range
    failed = [scale for scale, ok in found.trail if not ok]
    assert failed and min(failed) <= found.max_rate_scale * 1.1 + 1e-9
    assert all(scale > found.max_rate_scale for scale in failed)


def test_max_rate_search_reuses_known_scales_and_skips_those_above_the_ceiling():
    case = Case("llama-3.2-1b", "h200", 1, 2048, "static", small_trace(60, 2.0),
                slo=Slo(ttft_s=0.05, tpot_s=None))
    search = RateSearch(Sustain(case.slo), rel_tol=0.1, max_scale=512.0)
    plain = find_max_rate(case, search)
    informed = find_max_rate(case, search, known={1.0: True}, ceiling_scale=plain.max_rate_scale * 1.5)
    assert informed.max_rate_scale == pytest.approx(plain.max_rate_scale, rel=0.1)
    assert informed.num_runs < plain.num_runs
    assert sum(1 for scale, _ in informed.trail if scale == 1.0) >= 1  # judged, not run


def overloaded_query(**changes) -> PlanQuery:
    """150 prompts of 1-4k tokens at 60 req/s: one L4 replica of Qwen2.5-1.5B falls behind
    at every chunk (the fleet search needs about five)."""
    trace = TraceSpec(synthetic=SyntheticSpec(150, 60.0, LengthDist.uniform(1024, 4096),
                                              LengthDist.uniform(8, 32), seed=3))
    return PlanQuery(model="qwen2.5-1.5b", gpu="l4", tp=1, trace=trace,
                     slo=Slo(ttft_s=0.5, tpot_s=None), chunks=(512, 2048),
                     max_rate=MaxRateRows.NONE, **changes)


def test_plan_on_an_overloaded_trace_picks_nothing_and_says_what_would(capsys):
    from sim.planning.plan_report import print_plan

    result = run_plan(overloaded_query(), QUIET)
    assert result.nothing_sustains
    assert result.static_pick is None and result.elastic_pick is None
    assert all(r["overloaded"] and r["queue_at_last_arrival"] > 0 for r in result.rows)
    assert result.fleet is not None and result.fleet.answer is not None
    assert result.fleet.answer.replicas >= 2
    print_plan(result)
    out = " ".join(capsys.readouterr().out.split())
    assert "no configuration sustains this load" in out and "pick chunk" not in out
    assert "OVERLOADED" in out and "requests waiting at the last arrival" in out
    assert f"what would (fleet search, same GPU and TP): {result.fleet.answer.replicas} " \
           "replicas x TP 1" in out


def test_plan_runs_a_long_trace_on_its_busiest_stretch_and_says_so():
    result = run_plan(overloaded_query(max_requests=50, rate_scale=0.05), QUIET)
    assert result.stretch is not None and result.stretch.num_requests == 50
    assert all(r["num_requests"] == 50 for r in result.rows if r["fits"])
    assert "busiest 50 of 150 requests" in result.as_dict()["stretch"]
    assert not result.nothing_sustains and result.static_pick is not None


def test_reserve_share_shrinks_less_than_published_because_of_the_sampler():
    rows = reserve_rows(["qwen2.5-7b"], "h100", [1, 4], [8192])
    tp1, tp4 = rows
    assert tp1["forward_only_share"] / tp4["forward_only_share"] > 3  # ~1/TP
    assert tp1["reserve_share"] / tp4["reserve_share"] < 1.5  # sampler peak is flat in TP
    assert reserve_rows(["qwen2.5-7b"], "h100", [8], [8192])[0]["fits"] is False


def test_sweep_cases_price_transitions_with_a_calibrations_vmm_costs():
    """A sweep given a calibration with measured transition costs prices elastic attaches
    with them (0.2 s each here, so the total is unmistakable) instead of the driver figures."""
    from sim.core.elastic import VmmCosts

    slow = VmmCosts(attach_handle_s=0.0, attach_gib_s=0.0, detach_handle_s=0.0,
                    detach_gib_s=0.0, attach_fixed_s=0.2, detach_fixed_s=0.1)
    trace = small_trace()
    plain, priced = (Case("qwen2.5-0.5b", "h200", 1, 8192, "elastic", trace, vmm_costs=costs)
                     for costs in (None, slow))
    rows = run_sweep([plain, priced], QUIET)
    assert rows[1]["num_attach"] > 0
    assert rows[1]["attach_time_s"] == pytest.approx(0.2 * rows[1]["num_attach"])
    assert rows[0]["attach_time_s"] < 0.01 * rows[0]["num_attach"]


def test_piecewise_graphs_option_pads_each_cases_prefill_steps_at_its_own_chunk():
    """EngineOptions(piecewise_graphs=True): every case's engine captures the sizes of its own
    chunk (up to 512 here: 16..256 by 16, 320, 384, 448, 512), and its prefill steps cost at
    least what they cost unpadded."""
    from dataclasses import replace

    trace = small_trace()
    plain = Case("llama-3.2-1b", "h200", 1, 512, "static", trace)
    padded = replace(plain, options=EngineOptions(piecewise_graphs=True))
    assert plain.engine().piecewise_graph_sizes == ()
    assert padded.engine().piecewise_graph_sizes == (*range(16, 257, 16), 320, 384, 448, 512)
    assert replace(padded, chunk=8192).engine().piecewise_graph_sizes[-1] == 8192
    # no chunk given: captured at vLLM's default chunk, 8192 on an H200 and 2048 on an A10G
    assert replace(padded, chunk=None).engine().piecewise_graph_sizes[-1] == 8192
    assert replace(padded, chunk=None, gpu="a10g").engine().piecewise_graph_sizes[-1] == 2048
    assert padded.input_fields()["piecewise_graphs"] is True
    rows = run_sweep([plain, padded], QUIET)
    assert rows[1]["ttft_s_p50"] > rows[0]["ttft_s_p50"]


# ------------------------------------------------------------------ flags and YAML settings
def test_sweep_flags_are_the_engine_flags_with_the_grid_axes_several_valued(capsys):
    """`sim sweep` takes EngineConfig's flags: the axes several-valued (--tp 1,2), the rest
    fixed and at EngineConfig's defaults when left out (prefix caching on, release, migrate)."""
    import json

    from sim.planning.cli import main

    assert main(["sweep", "--trace", "azure-conv", "--limit", "8", "--model", "qwen2.5-0.5b",
                 "--tp", "1,2", "--chunk", "512", "--policy", "static", "--workers", "1",
                 "--no-progress", "--calibration", "none", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["tensor_parallel_size"], r["chunk"]) for r in rows] == [(1, 512), (2, 512)]
    for row in rows:
        assert row["enable_prefix_caching"] is True and row["reclaim"] == "release"
        assert row["drain"] == "migrate" and row["max_num_seqs"] == 512  # min(1024, chunk)
    assert main(["sweep", "--trace", "azure-conv", "--tp", "0"]) == 2
    assert "--tensor-parallel-size/--tp: give 1 or more" in capsys.readouterr().err
    assert main(["sweep", "--trace", "azure-conv", "--dtype", "float32"]) == 2
    assert "unrecognized arguments: --dtype" in capsys.readouterr().err


def test_every_engine_setting_is_a_sweep_axis_option_or_named_fixed():
    """A setting the planning commands accept as a flag reaches the cases' EngineConfig: each
    EngineConfig field is a grid axis, an EngineOptions setting, piecewise graphs, or named
    in SWEEP_FIXED (and then no flag of these commands)."""
    from dataclasses import fields

    from sim.core.engine_config import EngineConfig
    from sim.planning.spec import OPTION_SETTINGS, SWEEP_FIXED

    axes = {"model", "gpu", "tensor_parallel_size", "max_num_batched_tokens", "policy",
            "piecewise_graph_sizes"}
    carried = axes | set(OPTION_SETTINGS.values()) | set(SWEEP_FIXED)
    assert {f.name for f in fields(EngineConfig)} - carried == set()


def test_async_scheduling_reaches_each_case_and_its_row(capsys):
    """`sim sweep --async-scheduling` prices every case scheduled ahead (a lone request's
    decode steps each lose the host gap), and the rows say so."""
    import json

    from sim.planning.cli import main

    rows = {}
    for flag in ("--no-async-scheduling", "--async-scheduling"):
        assert main(["sweep", "--trace", "azure-conv", "--limit", "1", "--model",
                     "llama-3.1-8b", "--chunk", "2048", "--policy", "static", "--workers", "1",
                     "--no-progress", "--json", flag]) == 0
        (rows[flag],) = json.loads(capsys.readouterr().out)
    sync, ahead = rows["--no-async-scheduling"], rows["--async-scheduling"]
    assert (sync["async_scheduling"], ahead["async_scheduling"]) == (False, True)
    assert ahead["tpot_s_p50"] < sync["tpot_s_p50"]
    case = Case("llama-3.1-8b", "h200", 1, 2048, "static", small_trace(),
                options=EngineOptions(async_scheduling=True))
    assert case.engine().async_scheduling and case.input_fields()["async_scheduling"]


@pytest.mark.parametrize("text, says", [
    ("grid: {tp: [1, two], trace: azure-conv}", "grid.tp[1]: expected an integer, got 'two'"),
    ("grid: {trace: azure-conv}\nengine: {max_num_seqs: many}",
     "engine.max_num_seqs: expected an integer, got 'many'"),
    ("grid: {trace: azure-conv}\nengine: {enable_prefix_caching: maybe}",
     "engine.enable_prefix_caching: expected true or false"),
    ("grid: {trace: azure-conv}\nengine: {drain: sometimes}",
     "engine.drain: unknown drain strategy 'sometimes'"),
    ("grid: {trace: azure-conv}\nengine: {dtype: float32}", "unknown key(s) ['dtype'] in engine"),
    ("grid: {trace: azure-conv, policy: [greedy]}", "grid.policy[0]: unknown policy 'greedy'"),
    ("grid: {trace: azure-conv}\nslo: {ttft_s: -1}", "slo.ttft_s: expected a number above 0"),
    ("grid: {trace: {synthetic: {num_requests: ten, rate_per_s: 1, prompt: 8, output: 4}}}",
     "synthetic.num_requests: expected an integer, got 'ten'"),
    ("grid: {trace: {source: azure-conv, limit: 1.5}}", "trace.limit: expected an integer"),
])
def test_wrong_types_in_a_sweep_yaml_name_the_file_and_key(tmp_path, text, says):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_sweep(path)
    assert str(info.value).startswith(f"{path}: ") and says in str(info.value)


def test_yaml_engine_settings_left_out_take_the_engine_configs_defaults(tmp_path):
    from sim.core.engine_config import EngineConfig

    path = tmp_path / "sweep.yaml"
    path.write_text("grid: {trace: azure-conv}\nengine: {vmm_handle_mib: 256}")
    (case,) = load_sweep(path).cases()[:1]
    engine = case.engine()
    default = EngineConfig()
    assert engine.vmm_handle_bytes == 256 * 2**20 and engine.chunk_tokens == 8192
    assert engine.mixed_split_bytes == 128 * 2**20  # left out: the default, in MiB
    for mib in (0, 256):  # MiB in the file, bytes in the engine; 0: every step one launch
        path.write_text(f"grid: {{trace: azure-conv}}\nengine: {{mixed_split_mib: {mib}}}")
        assert load_sweep(path).cases()[0].engine().mixed_split_bytes == mib * 2**20
    assert (engine.enable_prefix_caching, engine.reclaim, engine.drain, engine.max_num_seqs) == (
        default.enable_prefix_caching, default.reclaim, default.drain, default.max_num_seqs)


# ------------------------------------------------------------------------------------ map
def test_the_map_hands_back_each_cell_as_its_last_run_ends(monkeypatch):
    """A cell that needs no run comes first, before any run; each other cell comes once both
    of its runs (static and elastic at the one chunk) have ended, in run order here (one
    worker), with the position that puts it back in (model, prompt, tp) order."""
    from sim.planning import gain_map

    runs: list[tuple[str, int]] = []
    real_run_case = gain_map.run_case

    def counted(case):
        runs.append((case.model, case.trace.synthetic.prompt.value))
        return real_run_case(case)

    monkeypatch.setattr(gain_map, "run_case", counted)
    query = gain_map.MapQuery(gpu="a10g", models=("qwen2.5-0.5b", "llama-3.1-70b"),
                              prompts=(1024, 2048), tps=(1,), chunks=(2048,), num_requests=8)
    cells = gain_map.iter_cells(query, QUIET)
    seen = []
    for done in cells:
        seen.append((done.position, done.cell.model, done.cell.prompt_tokens, done.cell.status,
                     len(done.rows), len(runs)))
    assert seen == [  # a 70B model's weights alone overflow a 24 GB A10G
        (2, "llama-3.1-70b", 1024, "does not fit", 0, 0),
        (3, "llama-3.1-70b", 2048, "does not fit", 0, 0),
        (0, "qwen2.5-0.5b", 1024, "ok", 2, 2),
        (1, "qwen2.5-0.5b", 2048, "ok", 2, 4),
    ]


def test_a_failed_map_run_is_named_in_the_error(monkeypatch, capsys):
    from sim.planning import gain_map
    from sim.planning.cli import main

    def fail(case):
        raise ValueError("no memory left")

    monkeypatch.setattr(gain_map, "run_case", fail)
    assert main(["plan", "map", "--models", "qwen2.5-0.5b", "--prompts", "1024", "--tps", "1",
                 "--chunks", "2048", "--num-requests", "8", "--workers", "1",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: map: the run of qwen2.5-0.5b TP 1, fixed(1024) prompts, "
                          "static chunk 2048 failed: ValueError: no memory left (at ")
    assert len(err.splitlines()) == 1


def test_a_sweep_on_the_auto_attention_backend_prices_it_with_its_calibration(tmp_path, capsys):
    """--attention-backend (and the YAML's engine.attention_backend) reaches every case's
    engine, and its shipped calibration is the one profiled on that backend: a 16k-token prompt
    alone takes less time on auto (SPLIT through cuDNN) than on the Triton kernel."""
    import json

    from sim.planning.cli import main
    from sim.planning.pricing import price_cases

    path = tmp_path / "sweep.yaml"
    path.write_text("grid: {trace: azure-conv}\nengine: {attention_backend: auto}")
    (case,) = load_sweep(path).cases()[:1]
    assert case.engine().attention_backend == "auto"
    _, (calibration,) = price_cases([case], None)
    assert calibration is not None and calibration.source.endswith("llama-3.1-8b-auto.json")
    trace = ["--trace", "synthetic", "--synthetic-requests", "1", "--synthetic-rate", "1", "--prompt-dist", "fixed:16384",
             "--output-dist", "fixed:2"]
    ttft = {}
    for backend in ("triton", "auto"):
        assert main(["sweep", *trace, "--model", "llama-3.1-8b", "--chunk", "16384",
                     "--max-model-len", "32768", "--policy", "static", "--workers", "1",
                     "--no-progress", "--attention-backend", backend, "--json"]) == 0
        out = capsys.readouterr()
        (row,) = json.loads(out.out)
        ttft[backend] = row["ttft_s_p50"]
        shipped = "llama-3.1-8b-auto.json" if backend == "auto" else "llama-3.1-8b.json"
        assert shipped in out.err or shipped in out.out
    assert ttft["auto"] < 0.9 * ttft["triton"]


def test_plan_map_runs_every_case_with_the_drain_and_scheduling_given(tmp_path, capsys):
    """--drain, --async-scheduling and --mixed-split-mib reach each case of the map (its runs
    table names them) and its title; left out, the cases run EngineConfig's defaults
    (migrate, async, 128 MiB)."""
    import csv

    from sim.planning.cli import main

    def runs(*flags: str) -> tuple[list[dict], str]:
        out = tmp_path / "_".join(flags or ("default",))
        assert main(["plan", "map", "--models", "qwen2.5-0.5b", "--prompts", "1024", "--tps",
                     "1", "--chunks", "2048", "--num-requests", "8", "--workers", "1",
                     "--no-progress", "--out", str(out), *flags]) == 0
        with open(out / "map_runs.csv") as f:
            return list(csv.DictReader(f)), " ".join(capsys.readouterr().out.split())

    rows, title = runs()
    assert {(r["drain"], r["async_scheduling"], r["mixed_split_mib"]) for r in rows} == {
        ("migrate", "True", "128")}
    assert "migrate drain, async scheduling, mixed split from 128 MiB" in title
    rows, title = runs("--drain", "preempt", "--no-async-scheduling", "--mixed-split-mib", "0")
    assert {(r["drain"], r["async_scheduling"], r["mixed_split_mib"]) for r in rows} == {
        ("preempt", "False", "0")}
    assert "preempt drain, synchronous scheduling, mixed split off" in title


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_an_elastic_pick_that_reclaims_often_under_async_carries_the_measured_note(
        async_scheduling, capsys):
    """Azure conversations at twice their rate (the validated slices' load): elastic lends
    and reclaims its reserve several times a second, where those slices' async replays paid
    more for elastic than the model prices. The plan says so under async scheduling; a
    synchronous engine's replays did not show the same pattern, so it stays silent there."""
    from sim.planning.plan_report import print_plan

    query = PlanQuery(model="llama-3.1-8b", gpu="h200", tp=1,
                      trace=TraceSpec(source="azure-conv", limit=300), chunks=(2048,),
                      rate_scale=2.0, max_rate=MaxRateRows.NONE,
                      options=EngineOptions(async_scheduling=async_scheduling))
    result = run_plan(query, QUIET)
    pick = result.elastic_pick
    assert pick is not None and pick["num_detach"] / pick["makespan_s"] > 2
    print_plan(result)
    out = " ".join(capsys.readouterr().out.split())
    if async_scheduling:
        rate = f"{pick['num_detach'] / pick['makespan_s']:.1f} times a second"
        assert result.as_dict()["elastic_note"] == result.elastic_note
        assert f"note: elastic's pick reclaims its reserve {rate}" in out
        assert "measured on five slices, Azure conversations at 5.3-6.8 reclaims a second" in out
    else:
        assert result.elastic_note is None and "note:" not in out


def test_the_reclaim_note_needs_an_async_elastic_row_at_two_reclaims_a_second():
    from sim.planning.plan import reclaim_note

    row = {"policy": "elastic", "async_scheduling": True, "num_detach": 250, "makespan_s": 100.0}
    assert "2.5 times a second. At that rate" in (reclaim_note(row) or "")
    waiting = reclaim_note({**row, "detach_behind_step": False}) or ""
    assert "2.5 times a second and waits for the step in flight" in waiting
    assert "likely under-priced here" in waiting and "1.57x" in waiting
    assert reclaim_note({**row, "num_detach": 150}) is None  # 1.5 a second
    assert reclaim_note({**row, "async_scheduling": False}) is None
    assert reclaim_note({**row, "policy": "static"}) is None
    assert reclaim_note({**row, "makespan_s": 0.0}) is None and reclaim_note(None) is None
