"""The whole comparison on synthetic "measurements": the simulator run with known, perturbed
efficiencies and written as GPU replay folders. Compared with the true efficiencies every
error must vanish; fitted from the defaults, the efficiencies must come back."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from sim.core.catalog import get_gpu, get_model
from sim.core.cost_model import CostArgs, CostModel, Efficiency
from sim.core.elastic import Policy, VmmCostModel, VmmCosts
from sim.core.engine_config import EngineConfig
from sim.runner import RunSpec
from traces import load_trace
from validation.calibrate import FIT_PARAMETERS, calibrate, concat, split_tail, usable_steps
from validation.cli import main
from validation.pipeline import validate
from validation.runs import TraceSlice, find_runs, load_run
from validation.simside import simulate_logged
from validation.steps import apart_steps, attention_terms, predict_step_times, step_classes
from validation.synthetic import write_calibration_json, write_gpu_style_run

LLAMA_8B, H200 = get_model("llama-3.1-8b"), get_gpu("h200")
TRUE = Efficiency(linear_compute=0.61, memory=0.79, kv_memory=0.52, attention_compute=0.33,
                  step_overhead_s=1.7e-3, per_seq_overhead_s=7e-6, eager_launch_s=0.03,
                  linear_serial_fraction=0.35)
SLICE = TraceSlice("azure-code", limit=120)


def config(policy: Policy, chunk: int) -> EngineConfig:
    """Synchronous steps, each priced in full; the async pricing has its own test below."""
    return EngineConfig(LLAMA_8B, H200, policy=policy, max_num_batched_tokens=chunk,
                        async_scheduling=False)


@pytest.fixture(scope="module")
def gpu_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    for policy in (Policy.STATIC, Policy.ELASTIC):
        for chunk in (1024, 4096):
            write_gpu_style_run(out, RunSpec(config(policy, chunk), efficiency=TRUE), SLICE)
    return out


@pytest.fixture(scope="module")
def runs(gpu_dir):
    return [load_run(folder) for folder in find_runs(gpu_dir)]


def test_a_run_with_gzipped_csvs_loads_as_the_plain_one(gpu_dir, tmp_path):
    """The committed replays keep their CSVs gzip-compressed: every column of every table
    comes back the same."""
    import gzip
    import shutil

    plain = find_runs(gpu_dir)[0]
    packed = tmp_path / "run"
    shutil.copytree(plain, packed)
    names = sorted(p.name for p in packed.glob("*.csv"))
    assert "steps.csv" in names and any(n.startswith("timeline") for n in names)
    for path in packed.glob("*.csv"):
        path.with_suffix(".csv.gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    a, b = load_run(plain), load_run(packed)
    for name in ("num_prefill_tokens", "num_decode_tokens", "prefill_pairs", "duration_s"):
        np.testing.assert_array_equal(getattr(a.steps, name), getattr(b.steps, name))
    assert a.steps.extra.keys() == b.steps.extra.keys() and len(a.steps.extra) > 0
    for key in a.steps.extra:
        np.testing.assert_array_equal(a.steps.extra[key], b.steps.extra[key])
    for table_a, table_b in ((a.timeline, b.timeline), (a.requests, b.requests)):
        assert table_a is not None and table_a.keys() == table_b.keys()
        for key in table_a:
            np.testing.assert_array_equal(table_a[key], table_b[key])


@pytest.mark.parametrize("eff", [TRUE, replace(TRUE, attention_program=0.2,
                                                 split_launch_s=1e-3),
                                  replace(TRUE, attention_program=0.2,
                                          attention_program_serial=0.6)])
def test_step_prediction_equals_the_simulators_step_times(eff):
    """The validation's array pricing of recorded steps is CostModel.step's, the longest
    attention program and the split launch included."""
    trace = load_trace("azure-code").head(60)
    result, recorder = simulate_logged(RunSpec(config(Policy.ELASTIC, 1024), efficiency=eff),
                                       trace)
    table = recorder.table()
    assert len(table) == result.summary["num_engine_steps"]
    predicted = predict_step_times(CostModel(LLAMA_8B, H200, 1, eff), table)
    np.testing.assert_allclose(predicted, table.duration_s, rtol=1e-9)
    if eff.attention_program:  # the term binds some steps of this slice
        plain = predict_step_times(
            CostModel(LLAMA_8B, H200, 1, replace(eff, attention_program=None)), table)
        assert (predicted > plain * 1.02).sum() >= 3


def test_step_prediction_equals_the_simulators_step_times_with_decode_rows_apart():
    """Mixed steps whose decode rows hold mixed_split_min_keys keys or more run them apart;
    the array pricing decides and prices them as CostModel.step does (the chunks' launch,
    its longest program and split over the prefill rows alone, two more launches per layer)."""
    trace = load_trace("azure-code").head(60)
    eff = replace(TRUE, attention_program=0.2, split_launch_s=1e-3)
    engine = config(Policy.ELASTIC, 1024).with_(mixed_split_bytes=2**20)  # 256 keys of 8B
    assert engine.mixed_split_min_keys == 256
    result, recorder = simulate_logged(RunSpec(engine, efficiency=eff), trace)
    table = recorder.table()
    cost = CostModel.for_engine(engine, eff)
    np.testing.assert_allclose(predict_step_times(cost, table), table.duration_s, rtol=1e-9)
    mixed = table.has_prefill & (table.num_decode_tokens > 0)
    apart = mixed & (table.decode_context_tokens >= 256)
    assert apart.sum() >= 5 and (mixed & ~apart).sum() >= 1
    one_launch = predict_step_times(CostModel.for_engine(engine.with_(mixed_split_bytes=0), eff),
                                    table)
    assert not np.allclose(one_launch[apart], table.duration_s[apart])
    np.testing.assert_allclose(one_launch[~mixed], table.duration_s[~mixed], rtol=1e-9)
    marked = apart_steps(cost, table)  # the reports' class of their own
    np.testing.assert_array_equal(marked, apart)
    classes = {row["class"]: row["count"] for row in step_classes(table.duration_s, table, marked)}
    assert classes["mixed, decode rows apart"] == apart.sum()
    assert sum(n for name, n in classes.items() if name.startswith("mixed")) == mixed.sum()


@pytest.mark.parametrize("decode_gap", [None, 7e-4])
def test_step_prediction_equals_the_simulators_async_step_times(decode_gap):
    """Under async scheduling the simulator hides the host gap behind the step in flight, but
    not in a step after an idle gap or an elastic pause; the start times tell the validation's
    pricing which steps those are. A decode-only step hides its own gap where the calibration
    measured one. A detach taken behind a step lengthens that step by its time, which the
    validation's pricing of a step's composition leaves out."""
    trace = load_trace("azure-code").head(60)
    eff = replace(TRUE, host_gap_s=4e-4, decode_host_gap_s=decode_gap)
    engine = config(Policy.ELASTIC, 1024).with_(async_scheduling=True)
    result, recorder = simulate_logged(RunSpec(engine, efficiency=eff), trace)
    table = recorder.table()
    exposed = table.exposed()
    assert 3 <= exposed.sum() < len(table) // 2  # the first step, idle gaps and attaches
    assert result.summary["num_attach"] > 0
    cost = CostModel(LLAMA_8B, H200, 1, eff, host_hidden=True)
    predicted = predict_step_times(cost, table)
    # a step with a detach taken behind it (the reserve lent in it, none in the next, no gap
    # between them) ran the detach's time longer: its unmap held the device
    lent = table.extra["reserve_lent_blocks"]
    detached = np.concatenate(((lent[:-1] > 0) & (lent[1:] == 0), [False]))
    held = detached & np.concatenate((~exposed[1:], [False]))
    waited = detached & ~held  # a detach that drained the step in flight: a gap before the next
    assert held.sum() > 0 and waited.sum() > 0
    assert held.sum() + waited.sum() == result.summary["num_detach"]
    np.testing.assert_allclose(predicted[~held], table.duration_s[~held], rtol=1e-9)
    excess = table.duration_s[held] - predicted[held]
    assert (excess > 0).all() and excess.sum() < result.summary["detach_time_s"]
    no_starts = replace(table, extra={})
    gap = table.duration_s - predict_step_times(cost, no_starts)
    decode = table.num_prefill_tokens == 0
    assert (exposed & ~held & decode).any() and (exposed & ~held & ~decode).any()
    np.testing.assert_allclose(gap[exposed & ~held & ~decode], 4e-4, rtol=1e-6)
    np.testing.assert_allclose(gap[exposed & ~held & decode], decode_gap or 4e-4, rtol=1e-6)
    np.testing.assert_allclose(gap[~exposed & ~held], 0.0, atol=1e-12)


def test_compare_with_true_efficiencies_reports_no_error(runs):
    v = validate(runs, TRUE, None, "true", fit=False, log=lambda _: None)
    assert len(v.runs) == 4
    for run in v.runs:
        for name, row in run.metrics.items():
            if row["relative_error"] is not None:
                assert abs(row["relative_error"]) < 1e-9, (run.label, name)
        assert run.step_error["all"]["median_abs"] < 1e-9
        assert not run.divergence.diverged
    assert all(t["passed"] for t in v.targets)
    assert len(v.gains) == 3  # elastic@1024 over static@1024; elastic@4096 over both
    for run in v.runs:  # every step 2% longer: the same tokens per second
        assert abs(run.sensitivity["throughput_tok_s"]) < 0.01, run.label
        assert run.host_sensitivity["tpot_p50_s"] > 0, run.label
        if run.label.startswith("static"):
            # later first tokens; a slower host lengthens steps by their host terms only:
            # later, never earlier. An elastic run's reserve comes back at fixed transition
            # costs, so longer steps move when it is lent, and its median TTFT either way
            assert run.sensitivity["ttft_p50_s"] > 0.005, run.label
            assert run.host_sensitivity["ttft_p50_s"] > 0, run.label


def test_gains_between_runs_on_different_starts_of_the_machine_are_marked(runs):
    """A replay records its start of the machine (measured.machine_start); a gain whose run
    and baseline recorded different starts compares two hosts and is marked so."""
    from dataclasses import replace

    def started(run, start):
        measured = {**run.summary.get("measured", {}), "machine_start": start}
        return replace(run, summary={**run.summary, "measured": measured})

    moved = [started(r, "host-b/2" if r.label == "elastic/chunk=4096" else "host-a/1")
             for r in runs]
    v = validate(moved, TRUE, None, "true", fit=False, log=lambda _: None)
    marks = {(g["run"], g["baseline"]): g.get("replayed_apart", False) for g in v.gains}
    assert marks == {("elastic/chunk=1024", "static/chunk=1024"): False,
                     ("elastic/chunk=4096", "static/chunk=1024"): True,
                     ("elastic/chunk=4096", "static/chunk=4096"): True}
    same = validate(runs, TRUE, None, "true", fit=False, log=lambda _: None)
    assert not any(g.get("replayed_apart") for g in same.gains)  # no start recorded


def test_compare_with_default_efficiencies_reports_the_perturbation(runs):
    v = validate(runs, None, None, "defaults", fit=False, log=lambda _: None)
    errors = [r.step_error["all"]["median_abs"] for r in v.runs]
    assert min(errors) > 0.03  # the defaults are off by 10-30% per efficiency
    assert all(r.divergence.diverged and r.divergence.cause == "arrival_timing" for r in v.runs)


def test_fit_recovers_perturbed_efficiencies_on_held_out_steps(runs):
    splits = [split_tail(usable_steps(r.steps), 0.5) for r in runs]
    fit, holdout = concat([s[0] for s in splits]), concat([s[1] for s in splits])
    result = calibrate(CostArgs(LLAMA_8B, H200), fit, holdout, Efficiency())
    assert result.holdout_before["median_abs"] > 0.03
    assert result.holdout_after["median_abs"] < 1e-3
    assert result.holdout_after["p99_abs"] < 1e-2
    for name, _, _ in FIT_PARAMETERS:
        # no step ran piecewise graphs, no step's longest attention program binds: unset
        if name in ("piecewise_launch_s", "attention_program"):
            assert getattr(TRUE, name) is None and getattr(result.efficiency, name) is None
            continue
        want = getattr(TRUE, name)
        if name == "mixed_decode_compute" and want is None:  # unset: at attention_compute
            want = TRUE.attention_compute
        assert getattr(result.efficiency, name) == pytest.approx(want, rel=0.02, abs=1e-6), name


def test_fit_recovers_the_longest_attention_programs_speed(tmp_path):
    """Steps made with attention_program 0.3 (about a tenth of the chunk-1024 steps with
    prefill tokens last as long as their longest program): the fit finds it again, from the
    start it uses when the term is unset, and prices the held-out steps exactly."""
    true = replace(TRUE, attention_program=0.3)
    write_gpu_style_run(tmp_path, RunSpec(config(Policy.STATIC, 1024), efficiency=true), SLICE)
    steps = usable_steps(load_run(find_runs(tmp_path)[0]).steps)
    work, longest, _ = attention_terms(CostModel(LLAMA_8B, H200, 1, true), steps)
    assert (longest > work).sum() >= 50
    fit, holdout = split_tail(steps, 0.5)
    result = calibrate(CostArgs(LLAMA_8B, H200), fit, holdout,
                       replace(true, attention_program=None), free=["attention_program"])
    assert result.efficiency.attention_program == pytest.approx(0.3, rel=1e-3)
    assert result.holdout_before["p99_abs"] > 0.01 and result.holdout_after["p99_abs"] < 1e-6


def test_cli_compare_writes_report_files_and_calibration(gpu_dir, tmp_path):
    calibration = write_calibration_json(tmp_path / "true.json", TRUE)
    out = tmp_path / "report"
    fitted = tmp_path / "fitted.json"
    assert main(["compare", "--gpu-dir", str(gpu_dir), "--calibration", str(calibration),
                 "--out", str(out), "--save-calibration", str(fitted)]) == 0
    for name in ("report.md", "report.json", "ttft_cdf.png", "step_time.png", "kv_usage.png"):
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "report.json").read_text())
    assert {r["label"] for r in report["runs"]} == {
        "static/chunk=1024", "elastic/chunk=1024", "static/chunk=4096", "elastic/chunk=4096"}
    assert all(t["passed"] for t in report["targets"])
    text = (out / "report.md").read_text()
    assert "PASS" in text
    # the measured TTFT's steepness at the median, one entry per run (the requests' CSVs)
    line = next(x for x in text.splitlines() if x.startswith("The measured TTFT at its median"))
    assert all(label in line for label in ("static/chunk=1024", "elastic/chunk=4096"))
    saved = json.loads(fitted.read_text())
    assert saved["efficiency"].keys() == asdict(TRUE).keys()  # sim.core.calibration reads it


def test_cli_fit_on_one_set_judged_on_another(gpu_dir, tmp_path):
    other = tmp_path / "other"
    other_slice = TraceSlice("azure-conv", limit=80)
    write_gpu_style_run(other, RunSpec(config(Policy.STATIC, 2048), efficiency=TRUE), other_slice)
    out = tmp_path / "cal.json"
    assert main(["fit", "--gpu-dir", str(gpu_dir), "--test-dir", str(other),
                 "--out", str(out)]) == 0
    fit = json.loads(out.read_text())["fit"]
    assert fit["holdout_after"]["median_abs"] < 1e-3


def test_fit_of_host_terms_only_keeps_the_device_efficiencies(runs, tmp_path):
    """`fit --free host`: a calibration right on the device efficiencies but wrong on the per
    step terms gets those three back, and the device efficiencies stay as they were."""
    from dataclasses import replace

    start = replace(TRUE, step_overhead_s=4e-3, per_seq_overhead_s=0.0, eager_launch_s=0.012)
    splits = [split_tail(usable_steps(r.steps), 0.5) for r in runs]
    fit, holdout = concat([s[0] for s in splits]), concat([s[1] for s in splits])
    result = calibrate(CostArgs(LLAMA_8B, H200), fit, holdout, start,
                       free=("step_overhead_s", "per_seq_overhead_s", "eager_launch_s"))
    assert result.holdout_before["median_abs"] > 0.03
    assert result.holdout_after["median_abs"] < 1e-3
    for name in ("step_overhead_s", "per_seq_overhead_s", "eager_launch_s"):
        assert getattr(result.efficiency, name) == pytest.approx(getattr(TRUE, name), rel=0.02)
    for name in ("linear_compute", "memory", "kv_memory", "attention_compute"):
        assert getattr(result.efficiency, name) == getattr(start, name)
    with pytest.raises(ValueError, match="cannot fit .'memroy'."):
        calibrate(CostArgs(LLAMA_8B, H200), fit, holdout, start, free=("memroy",))


ENGINE_VMM = VmmCosts(attach_handle_s=0.2e-3, attach_gib_s=0.0, detach_handle_s=0.1e-3,
                      detach_gib_s=0.0, attach_fixed_s=0.9e-3, detach_fixed_s=0.5e-3)


def test_measured_transition_costs_reach_the_simulated_attach_time(tmp_path):
    """A replay whose engine pays fixed costs per transition (syncs, torch's cache) is matched
    only when the calibration's VMM costs are used; the driver defaults under-predict."""
    spec = RunSpec(config(Policy.ELASTIC, 1024), efficiency=TRUE, vmm_costs=ENGINE_VMM)
    write_gpu_style_run(tmp_path, spec, SLICE)
    runs = [load_run(folder) for folder in find_runs(tmp_path)]
    with_costs = validate(runs, TRUE, None, "true", fit=False, vmm_costs=ENGINE_VMM,
                          log=lambda _: None)
    without = validate(runs, TRUE, None, "true", fit=False, log=lambda _: None)
    measured = with_costs.runs[0].metrics["attach_time_s"]
    assert measured["measured"] > 0
    assert abs(measured["relative_error"]) < 1e-9
    assert without.runs[0].metrics["attach_time_s"]["relative_error"] < -0.3


def test_calibration_vmm_costs_are_read_and_bad_ones_named(tmp_path):
    from sim.core.calibration import load_calibration, vmm_costs_of

    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"efficiency": asdict(TRUE)}))
    assert load_calibration(path).vmm_costs is None  # before the measurement: driver figures
    path.write_text(json.dumps({"efficiency": asdict(TRUE), "vmm": {"costs": asdict(ENGINE_VMM)}}))
    assert load_calibration(path).parts() == (TRUE, None, ENGINE_VMM)
    with pytest.raises(ValueError, match="cal.json.*attach_s"):
        vmm_costs_of({"vmm": {"costs": {"attach_s": 1e-3}}}, path)
    with pytest.raises(ValueError, match="cal.json.*attach_fixed_s"):
        vmm_costs_of({"vmm": {"costs": {**asdict(ENGINE_VMM), "attach_fixed_s": -1}}}, path)


def test_transition_costs_fit_fixed_and_per_handle_terms():
    from sim.core.calibration.profile_fit import transition_costs

    points = [{"handles": n, "attach_s": 1e-3 + n * 60e-6, "detach_s": 4e-4 + n * 45e-6}
              for n in (1, 2, 4)]
    costs = transition_costs(points)
    assert costs["attach_fixed_s"] == pytest.approx(1e-3)
    assert costs["attach_handle_s"] == pytest.approx(60e-6)
    assert costs["detach_fixed_s"] == pytest.approx(4e-4)
    assert VmmCosts(**costs).detach_handle_s == pytest.approx(45e-6)
    flat = transition_costs([{"handles": n, "attach_s": 2e-3 - n * 1e-5, "detach_s": 1e-3}
                             for n in (1, 2, 4)])
    assert flat["attach_handle_s"] == 0.0  # a falling line is clipped, never negative
    assert costs["attach_cache_gib_s"] == 0.0  # every point freed the same (nothing)


def test_transition_costs_fit_the_cached_bytes_an_attach_hands_back():
    """Attaches after prefills of different sizes free different amounts of torch's cache:
    the fit separates a cost per cached GiB from the fixed and per-handle ones."""
    from sim.core.calibration.profile_fit import transition_costs

    gib = 2**30
    points = [{"handles": n, "freed_bytes": freed, "detach_s": 4e-4 + n * 45e-6,
               "attach_s": 0.3e-3 + n * 0.2e-3 + freed / gib * 0.9e-3}
              for n, freed in ((1, 1.2 * gib), (2, 1.2 * gib), (4, 1.2 * gib), (2, 0),
                               (2, 0.1 * gib), (2, 0.4 * gib))]
    costs = transition_costs(points)
    assert costs["attach_fixed_s"] == pytest.approx(0.3e-3)
    assert costs["attach_handle_s"] == pytest.approx(0.2e-3)
    assert costs["attach_cache_gib_s"] == pytest.approx(0.9e-3)
    assert costs["detach_handle_s"] == pytest.approx(45e-6)
    model = VmmCostModel(handle_bytes=512 * 2**20, costs=VmmCosts(**costs))
    assert model.attach_s(2 * 512 * 2**20, int(0.4 * gib)) == pytest.approx(
        0.3e-3 + 0.4e-3 + 0.36e-3)


def test_transition_costs_fit_no_cache_slope_over_a_spread_of_a_few_mib():
    """A piecewise engine's attaches free a few MiB at most: the attach after the largest
    prefill ran 0.4 ms slower here by chance. Fitted as a slope over 2 MiB that would be 205 ms
    per GiB, which the simulator prices on every GiB of activations an attach hands back."""
    from sim.core.calibration.profile_fit import transition_costs

    mib = 2**20
    points = [{"handles": n, "freed_bytes": freed, "detach_s": 4e-4 + n * 45e-6,
               "attach_s": 1e-3 + n * 0.2e-3 + (0.4e-3 if freed else 0.0)}
              for n, freed in ((1, 2 * mib), (2, 2 * mib), (4, 2 * mib), (2, 0), (2, 0))]
    costs = transition_costs(points)
    assert costs["attach_cache_gib_s"] == 0.0
    # the 0.4 ms lands on the fixed and per-handle terms, as a least-squares line over them
    model = VmmCostModel(handle_bytes=512 * 2**20, costs=VmmCosts(**costs))
    assert model.attach_s(2 * 512 * 2**20, 300 * mib) == pytest.approx(
        model.attach_s(2 * 512 * 2**20, 0))
    assert 1.4e-3 < model.attach_s(2 * 512 * 2**20, 300 * mib) < 1.8e-3


def test_report_names_the_gpu_and_versions_it_was_measured_with(runs):
    """The replays' own versions when they recorded them, else the calibration's profile run's,
    and says which; never a silent blank."""
    import copy

    from validation.report import markdown

    v = validate([copy.deepcopy(runs[0])], TRUE, None, "true", fit=False, log=lambda _: None)
    assert "driver and library versions not recorded" in markdown(v, [])
    v.calibration_versions = {"driver": "580.1", "triton": "3.6.0", "cuda-bindings": None}
    assert "driver 580.1, triton 3.6.0 (of the calibration's profile run)" in markdown(v, [])
    v.runs[0].gpu.summary.setdefault("measured", {}).update(
        gpu_name="NVIDIA H200", versions={"driver": "590.2", "torch": "2.11"})
    text = markdown(v, [])
    assert "Measured on NVIDIA H200; driver 590.2, torch 2.11 (recorded by the replays)" in text
    assert "Replayed without" not in text  # no kernel flags recorded: nothing to warn of
    kernels = {"fused_layers": True, "decode_split_plan": True, "decode_target_waves": 4}
    v.runs[0].gpu.summary["measured"]["kernels"] = kernels
    assert "Replayed without" not in markdown(v, [])
    kernels["decode_split_plan"] = False
    text = markdown(v, [])
    assert (f"**Replayed without the decode split plan (GPU_BACKEND_DECODE_PLAN=0) in "
            f"{v.runs[0].label}: the cost model prices the engine with them") in text
    assert "fused norm" not in text


def test_report_says_not_recorded_for_cached_tokens_a_replay_lacks(runs):
    """A replay whose summary predates num_cached_tokens: its cell says so; it is not 0."""
    import copy

    from validation.report import markdown

    def cached_row(run) -> str:
        v = validate([run], TRUE, None, "true", fit=False, log=lambda _: None)
        return next(line for line in markdown(v, []).splitlines()
                    if line.startswith("| num_cached_tokens (tokens) |"))

    recorded = copy.deepcopy(runs[0])
    assert recorded.summary["num_cached_tokens"] == 0  # azure-code names no prefix blocks
    assert cached_row(recorded).endswith("| 0 / 0 (+0.0%) |")
    old = copy.deepcopy(runs[0])
    del old.summary["num_cached_tokens"]
    assert cached_row(old).endswith("| 0 / not recorded |")


# ------------------------------------------------------------------ piecewise prefill graphs
def piecewise_config(policy: Policy, chunk: int) -> EngineConfig:
    """`config` with prefill steps padded as `gpu_backend replay --piecewise-graphs` pads them."""
    from sim.core.cost_model import piecewise_capture_sizes

    return config(policy, chunk).with_(piecewise_graph_sizes=piecewise_capture_sizes(chunk))


def test_step_prediction_equals_the_simulators_piecewise_step_times():
    trace = load_trace("azure-code").head(60)
    engine = piecewise_config(Policy.ELASTIC, 1024)
    _, recorder = simulate_logged(RunSpec(engine, efficiency=TRUE), trace)
    table = recorder.table()
    cost = CostModel(LLAMA_8B, H200, 1, TRUE, token_graph_sizes=engine.piecewise_graph_sizes)
    np.testing.assert_allclose(predict_step_times(cost, table), table.duration_s, rtol=1e-9)
    # priced unpadded, the device-bound prefill steps come out shorter, the others the same
    eager = predict_step_times(CostModel(LLAMA_8B, H200, 1, TRUE), table)
    prefill, measured = table.has_prefill, table.duration_s
    assert (eager[prefill] <= measured[prefill] * (1 + 1e-9)).all()
    assert (eager[prefill] < measured[prefill] * (1 - 1e-3)).any()
    np.testing.assert_allclose(eager[~prefill], measured[~prefill], rtol=1e-9)


def test_cli_fit_of_piecewise_replays_takes_a_piecewise_calibration_only(tmp_path, capsys):
    from sim.core.cost_model import piecewise_capture_sizes
    from validation.runs import check_calibration_graphs

    gpu_dir = tmp_path / "gpu"
    for chunk in (1024, 4096):  # both on the capture grid: one fit prices them both
        write_gpu_style_run(gpu_dir, RunSpec(piecewise_config(Policy.STATIC, chunk),
                                             efficiency=TRUE), SLICE)
    eager = write_calibration_json(tmp_path / "eager.json", Efficiency())
    out = tmp_path / "fitted.json"
    assert main(["fit", "--gpu-dir", str(gpu_dir), "--calibration", str(eager),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"the calibration {eager} was profiled without piecewise CUDA graphs" in err
    assert str(gpu_dir) in err and "re-profile with --piecewise-graphs" in err
    assert not out.exists()
    profiled = tmp_path / "piecewise.json"
    profiled.write_text(json.dumps({"efficiency": asdict(Efficiency()),
                                    "piecewise_sizes": list(piecewise_capture_sizes(8192))}))
    assert main(["fit", "--gpu-dir", str(gpu_dir), "--calibration", str(profiled),
                 "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    # the padding priced exactly (priced unpadded, the prefill steps' p99 error is ~2%)
    assert saved["fit"]["holdout_after"]["p99_abs"] < 1e-6
    assert saved["piecewise_sizes"] == list(piecewise_capture_sizes(4096))
    check_calibration_graphs(out, [load_run(f) for f in find_runs(gpu_dir)])  # pairs with them


def test_capped_piecewise_replays_need_a_profile_that_timed_fully_eager_steps(tmp_path):
    """Replays whose piecewise graphs stop at 512 tokens ran their longer steps fully eager:
    a calibration whose grid ran every step through its graphs did not measure the launch
    time of those, and is refused; one profiled with the same cap pairs with them. The
    simulator prices such replays step by step as the engine ran them."""
    from sim.core.cost_model import piecewise_sizes_for
    from validation.runs import check_calibration_graphs

    capped = replace(config(Policy.STATIC, 4096),
                     piecewise_graph_sizes=piecewise_sizes_for(4096, 512))
    truth = replace(TRUE, eager_launch_s=0.02, piecewise_launch_s=0.004)
    trace = load_trace("azure-code").head(60)
    _, recorder = simulate_logged(RunSpec(capped, efficiency=truth), trace)
    table = recorder.table()
    cost = CostModel(LLAMA_8B, H200, 1, truth, token_graph_sizes=capped.piecewise_graph_sizes)
    np.testing.assert_allclose(predict_step_times(cost, table), table.duration_s, rtol=1e-9)
    assert (table.num_tokens[table.has_prefill] > 512).any()  # some steps ran fully eager

    gpu_dir = tmp_path / "gpu"
    write_gpu_style_run(gpu_dir, RunSpec(capped, efficiency=truth), SLICE)
    runs = [load_run(f) for f in find_runs(gpu_dir)]

    def profile(name: str, sizes: tuple[int, ...]) -> Path:
        records = [{"kind": "prefill", "prefills": [[n, 0]], "num_decodes": 0}
                   for n in (64, 300, 1024, 2048, 4096, 8192)]
        path = tmp_path / name
        path.write_text(json.dumps({"efficiency": asdict(truth), "piecewise_sizes": list(sizes),
                                    "measurements": records}))
        return path

    uncapped = profile("uncapped.json", piecewise_sizes_for(8192))
    with pytest.raises(ValueError, match=r"up to 512 tokens and ran its longer steps fully eager"
                                         r".*re-profile with --piecewise-max-tokens 512"):
        check_calibration_graphs(uncapped, runs)
    check_calibration_graphs(profile("capped.json", piecewise_sizes_for(8192, 512)), runs)


# ------------------------------------------------------------------ attention key splits
def test_step_prediction_prices_the_split_launch_as_the_simulator(tmp_path):
    """A small model whose short prefills split their attention keys (sim.core.cost_model's
    split_launch_s): the vectorised prediction equals the simulator's step times, from its
    own step log and from the GPU-style steps.csv written and read back."""
    qwen = get_model("qwen2.5-0.5b")
    eff = Efficiency(eager_launch_s=3e-3, split_launch_s=1.3e-3, step_overhead_s=1.4e-3,
                     launch_serial_fraction=0.3)
    engine = EngineConfig(qwen, H200, policy=Policy.STATIC, max_num_batched_tokens=2048,
                          async_scheduling=False)
    spec = RunSpec(engine, efficiency=eff)
    _, recorder = simulate_logged(spec, load_trace("azure-conv").head(40))
    table = recorder.table()
    cost = CostModel(qwen, H200, 1, eff)
    np.testing.assert_allclose(predict_step_times(cost, table), table.duration_s, rtol=1e-9)
    splits = table.has_prefill & (cost.num_splits_array(
        table.num_tokens, table.num_seqs, table.max_query_len, table.max_seq_len) > 1)
    assert 0 < splits.sum() < table.has_prefill.sum()  # some prefill steps split, some not
    folder = write_gpu_style_run(tmp_path, spec, TraceSlice("azure-conv", limit=40))
    from validation.step_table import read_steps_csv

    written = read_steps_csv(folder / "steps.csv")
    np.testing.assert_allclose(predict_step_times(cost, written), written.duration_s, rtol=1e-9)
    # launch-bound prefill steps (their launch 3.0 or 4.3 ms above the device time): the
    # split adds 1.3 ms of launch, less the serial share of the device time it now overlaps
    without = predict_step_times(CostModel(qwen, H200, 1, replace(eff, split_launch_s=0.0)),
                                 table)
    device = predict_step_times(CostModel(qwen, H200, 1, Efficiency(
        step_overhead_s=0.0, per_seq_overhead_s=0.0)), table)
    bound = table.has_prefill & (device < 3e-3)
    assert bound.sum() > 3
    np.testing.assert_allclose((table.duration_s - without)[bound],
                               np.where(splits, 1.3e-3, 0.0)[bound], atol=1e-12)
