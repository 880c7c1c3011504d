"""The calibration module (sim.core.calibration): the file checked with errors that name the
file and key, provenance, the shipped calibration a run takes by default, the line naming what
priced an output, and a calibration carried to another model."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from sim.core.calibration import (
    ROOFLINE,
    SHIPPED_DIR,
    UNCALIBRATED,
    EngineKind,
    attention_mismatch,
    choose_calibration,
    describe,
    invoked_command,
    load_calibration,
    pricing,
    save_calibration,
    select_calibration,
    transfer,
)
from sim.core.catalog import get_gpu, get_model
from sim.core.cost_model import Efficiency
from sim.core.elastic import VmmCosts
from sim.core.memory_plan import ActivationProfile

EFF = Efficiency(linear_compute=0.65, memory=0.88, step_overhead_s=2e-3,
                 piecewise_launch_s=1.6e-3, split_launch_s=1.2e-3)
PROFILE = ActivationProfile(96_000.0, 46_000_000, 1_386_000_000)
VMM = VmmCosts(attach_handle_s=4e-4, attach_gib_s=0.0, detach_handle_s=4e-4, detach_gib_s=0.0)
SIZES = [16, 32, 512, 2048, 8192]


def calibration_data(model: str = "llama-3.2-3b", sizes: list[int] | None = SIZES,
                     **provenance) -> dict:
    """A profile's calibration as `python -m gpu_backend profile` writes it (no grid)."""
    record = {"gpu": "NVIDIA H200", "driver": "580.159.04", "torch": "2.11.0+cu130",
              "measured_on": "2026-11-30", "engine": "piecewise" if sizes else "eager",
              "command": f"python -m gpu_backend profile --model {model}", **provenance}
    return {"model": model, "gpu_preset": "h200-141gb", "efficiency": asdict(EFF),
            "activation": asdict(PROFILE), "vmm": {"costs": asdict(VMM)},
            "piecewise_sizes": sizes, "provenance": record}


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


# ------------------------------------------------------------------------------ the file
def test_a_saved_calibration_loads_back_with_its_parts_and_provenance(tmp_path):
    path = tmp_path / "out" / "cal.json"
    save_calibration(path, calibration_data())
    cal = load_calibration(path)
    # its non-torch bytes hold the pool of its piecewise graphs, the largest of 8,192 tokens
    assert cal.parts() == (EFF, replace(PROFILE, graph_tokens=8192), VMM)
    assert cal.piecewise_sizes == tuple(SIZES)
    p = cal.provenance
    assert (p.model, p.gpu_preset, p.gpu_name, p.measured_on) == (
        "llama-3.2-3b", "h200-141gb", "NVIDIA H200", "2026-11-30")
    assert (p.driver, p.torch, p.engine) == ("580.159.04", "2.11.0+cu130", EngineKind(True))
    assert p.command == "python -m gpu_backend profile --model llama-3.2-3b"


def test_a_profiles_non_torch_bytes_hold_its_largest_piecewise_graph(tmp_path):
    """The graph pool in a profile's non-torch bytes is that of its own piecewise graphs."""
    def loaded(sizes, **activation):
        data = calibration_data(sizes=sizes)
        data["activation"] = {**data["activation"], "non_torch_bytes": 10**9, **activation}
        return load_calibration(write(tmp_path / "cal.json", data)).activation

    assert loaded(SIZES).graph_tokens == 8192
    assert loaded(None).graph_tokens == 0
    assert loaded(SIZES, graph_tokens=512).graph_tokens == 512  # the file's own word
    with pytest.raises(ValueError, match="activation.graph_tokens is -1"):
        loaded(SIZES, graph_tokens=-1)
    assert loaded(SIZES, non_torch_bytes=None).graph_tokens is None  # nothing to adjust


@pytest.mark.parametrize("change, named", [
    ({"efficiency": {"memory": "0.8"}}, "efficiency.memory is '0.8'; expected a number"),
    ({"efficiency": {"linaer_compute": 0.5}}, "unknown efficiency keys ['linaer_compute']"),
    ({"efficiency": None}, 'no "efficiency" object'),
    ({"efficiency": {"memory": 1.5}}, "memory=1.5 is out of range"),
    ({"activation": {"bytes_per_token": "96k", "fixed_bytes": 0}},
     "activation.bytes_per_token is '96k'"),
    ({"activation": [1, 2]}, '"activation" needs an object'),
    ({"vmm": {"costs": {"attach_s": 1e-3}}}, '"vmm" needs a "costs" object'),
    ({"vmm": {"costs": {**asdict(VMM), "detach_handle_s": "fast"}}},
     "vmm.costs.detach_handle_s is 'fast'"),
    ({"piecewise_sizes": "16,32"}, "piecewise_sizes is '16,32'"),
    ({"provenance": {"measured_on": 20261130}}, "provenance.measured_on is 20261130"),
    ({"provenance": {"date": "2026-11-30"}}, '"provenance" needs an object with keys'),
    ({"provenance": {"engine": "eager"}}, "provenance.engine is 'eager' but piecewise_sizes"),
    ({"model": 8}, "model is 8; expected a string"),
    ({"measurements": [{"kind": "prefill", "prefills": [["a", 0]]}]}, "measurements[0] needs"),
])
def test_a_wrong_type_or_key_is_one_error_naming_the_file_and_key(tmp_path, change, named):
    path = write(tmp_path / "bad.json", {**calibration_data(), **change})
    with pytest.raises(ValueError) as info:
        load_calibration(path)
    assert str(path) in str(info.value) and named in str(info.value)


@pytest.mark.parametrize("text, named", [
    ("{not json", "cannot read calibration JSON"),
    ("[1, 2]", 'no "efficiency" object'),
])
def test_an_unreadable_file_is_named(tmp_path, text, named):
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=named):
        load_calibration(path)
    with pytest.raises(ValueError, match="cannot read calibration JSON"):
        load_calibration(tmp_path / "absent.json")


def test_save_refuses_what_load_would_refuse_and_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="efficiency.memory"):
        save_calibration(tmp_path / "c.json", {**calibration_data(), "efficiency": {"memory": -1}})
    assert not (tmp_path / "c.json").exists()


def test_files_without_provenance_read_it_from_their_top_level_keys(tmp_path):
    """Profiles written before "provenance": model, GPU and versions from the top level, the
    engine kind from the piecewise sizes and which steps the grid timed fully eager."""
    old = {"gpu": "NVIDIA H200", "gpu_preset": "h200-141gb", "model": "llama-3.1-8b",
           "versions": {"driver": "580.1", "cuda": "13.0"}, "efficiency": {},
           "piecewise_sizes": [16, 256, 512],
           "measurements": [{"kind": "prefill", "prefills": [[n, 0]], "num_decodes": 0}
                            for n in (100, 1024, 2048, 4096)]}
    cal = load_calibration(write(tmp_path / "old.json", old))
    p = cal.provenance
    assert (p.model, p.gpu_name, p.driver, p.cuda, p.measured_on, p.command) == (
        "llama-3.1-8b", "NVIDIA H200", "580.1", "13.0", None, None)
    assert p.engine == EngineKind(True, 512)  # three steps past the graphs ran fully eager
    uncapped = {**old, "measurements": old["measurements"][:2]}
    assert load_calibration(write(tmp_path / "u.json", uncapped)).engine == EngineKind(True)
    assert "date measured not recorded" in describe(cal)


def test_an_engine_variant_is_kept_beside_the_kind(tmp_path):
    data = calibration_data(sizes=None, engine="torch layers without the fused kernels")
    cal = load_calibration(write(tmp_path / "v.json", data))
    assert cal.engine == EngineKind()
    assert cal.provenance.engine_variant == "torch layers without the fused kernels"
    assert "eager engine (torch layers without the fused kernels)" in describe(cal)


def test_a_profile_on_another_attention_backend_is_named_in_every_output(tmp_path):
    """A calibration whose steps ran another backend than the Triton kernel says so wherever
    it prices, and a run on a backend its profile never timed is told what was not fitted."""
    data = {**calibration_data(sizes=None), "attention_backend": "auto"}
    cal = load_calibration(write(tmp_path / "a.json", data))
    assert "eager engine (auto attention)" in describe(cal)
    assert cal.provenance.engine_variant is None  # nothing derived is written back
    assert attention_mismatch(cal, {"auto"}) is None and attention_mismatch(cal, {"triton"}) is None
    both = {**calibration_data(sizes=None, engine="torch layers"), "attention_backend": "split"}
    split = load_calibration(write(tmp_path / "b.json", both))
    assert "(torch layers; split attention)" in describe(split)
    assert "Triton prefill terms are defaults" in attention_mismatch(split, {"auto"})
    plain = load_calibration(write(tmp_path / "c.json", {**calibration_data(sizes=None),
                                                          "attention_backend": "triton"}))
    assert plain.provenance.engine_variant is None and "attention" not in describe(plain)
    assert attention_mismatch(plain, {"triton"}) is None
    assert "--attention-backend auto" in attention_mismatch(plain, {"triton", "auto"})
    with pytest.raises(ValueError, match="attention_backend is 'flash'"):
        load_calibration(write(tmp_path / "d.json", {**calibration_data(sizes=None),
                                                     "attention_backend": "flash"}))
    # FlashInfer's prefill priced by another backend's profile, and the reverse
    assert "profile with --attention-backend flashinfer" in attention_mismatch(
        plain, {"triton", "flashinfer"})
    assert "FlashInfer's prefill is priced at the Triton kernel's" in attention_mismatch(
        load_calibration(write(tmp_path / "e.json", data)), {"flashinfer"})
    fi = load_calibration(write(tmp_path / "f.json", {
        **calibration_data(sizes=None, flashinfer="0.7.4"), "attention_backend": "flashinfer"}))
    assert fi.provenance.flashinfer == "0.7.4" and fi.provenance.to_dict()["flashinfer"] == "0.7.4"
    assert plain.provenance.flashinfer is None and "flashinfer" not in plain.provenance.to_dict()
    assert "eager engine (flashinfer attention)" in describe(fi)
    assert attention_mismatch(fi, {"flashinfer"}) is None
    assert "steps on auto, triton are priced at FlashInfer's" in attention_mismatch(
        fi, {"flashinfer", "triton", "auto"})
    assert "SPLIT's at their defaults" in attention_mismatch(fi, {"auto"})
    assert "Triton prefill terms, defaults on a split profile" in attention_mismatch(
        split, {"flashinfer"})


# ----------------------------------------------------------------------------- engine kind
def test_engine_kinds_of_runs_and_their_labels():
    assert EngineKind.of_run((), 8192).label == "eager"
    assert EngineKind.of_run((16, 8192), 8192).label == "piecewise"
    assert EngineKind.of_run((16, 512), 8192).label == "piecewise512"
    assert EngineKind.of_run((16, 300), 300).label == "piecewise"  # the chunk under the cap
    for label in ("eager", "piecewise", "piecewise512"):
        assert EngineKind.parse(label).label == label
    assert EngineKind.parse("piecewise512").fallbacks() == (EngineKind(True, 512),
                                                            EngineKind(True))
    for bad in ("eager512", "graphs", "piecewise-512"):
        with pytest.raises(ValueError, match="expected eager, piecewise or piecewise<N>"):
            EngineKind.parse(bad)


# -------------------------------------------------------------------------------- selection
@pytest.fixture
def shipped(tmp_path) -> Path:
    root = tmp_path / "calibration"
    write(root / "h200" / "llama-3.2-3b-piecewise.json", calibration_data())
    write(root / "h200" / "llama-3.2-3b.json", calibration_data(sizes=None))
    write(root / "host_fit" / "llama-3.2-3b.json", {"efficiency": {}})  # not a GPU folder
    return root


def test_a_run_takes_the_shipped_calibration_of_its_model_gpu_and_engine(shipped):
    eager = select_calibration("llama-3.2-3b", "h200-141gb", "eager", shipped)
    assert eager.source == "calibration/h200/llama-3.2-3b.json" and not eager.piecewise_sizes
    piecewise = select_calibration("llama-3.2-3b", "h200", EngineKind(True), shipped)
    assert piecewise.source == "calibration/h200/llama-3.2-3b-piecewise.json"
    # no capped profile shipped: the capped engine takes the uncapped piecewise one
    capped = select_calibration("llama-3.2-3b", "h200", "piecewise512", shipped)
    assert capped.source == piecewise.source
    assert select_calibration("llama-3.1-8b", "h200", "eager", shipped) is None
    assert select_calibration("llama-3.2-3b", "h100", "eager", shipped) is None


def test_a_misfiled_calibration_is_refused_with_its_place_named(shipped):
    write(shipped / "h200" / "llama-3.1-8b.json", calibration_data(sizes=None))  # a 3B profile
    with pytest.raises(ValueError, match=r"calibration/h200/llama-3.1-8b.json: measured "
                                         r"llama-3.2-3b on h200-141gb, but filed as llama-3.1-8b"):
        select_calibration("llama-3.1-8b", "h200", "eager", shipped)


def test_none_forces_the_roofline_and_a_file_is_taken_for_its_own_model(shipped, tmp_path):
    """A file measured on the run's model and GPU is taken as it is; on another model or GPU
    it is carried to the run's, and its provenance says from where."""
    assert choose_calibration(ROOFLINE, "llama-3.2-3b", "h200", "eager", shipped) is None
    assert choose_calibration(Path("none"), "llama-3.2-3b", "h200", "eager", shipped) is None
    given = write(tmp_path / "mine.json", calibration_data(model="llama-3.1-8b", sizes=None))
    chosen = choose_calibration(given, "llama-3.1-8b", "h200", "eager", shipped)
    assert chosen.source == str(given) and chosen.provenance.model == "llama-3.1-8b"
    carried = choose_calibration(given, "llama-3.2-3b", "h200", "eager", shipped)
    assert carried.source == f"{given} -> llama-3.2-3b"
    assert carried.provenance.model == "llama-3.2-3b"
    assert carried.provenance.derived_from == f"transferred from llama-3.1-8b ({given})"
    moved = choose_calibration(given, "llama-3.1-8b", "h100", "eager", shipped)
    assert moved.source == f"{given} -> llama-3.1-8b on h100-80gb"
    assert moved.efficiency == chosen.efficiency  # the same layers: every term as measured
    assert choose_calibration(None, "llama-3.2-3b", "h200", "eager", shipped).source == (
        "calibration/h200/llama-3.2-3b.json")


def test_outputs_name_the_file_gpu_model_engine_and_date(shipped):
    cal = select_calibration("llama-3.2-3b", "h200", "piecewise", shipped)
    assert describe(cal) == ("calibration/h200/llama-3.2-3b-piecewise.json (NVIDIA H200, "
                             "llama-3.2-3b, piecewise engine, measured 2026-11-30)")
    record = pricing(cal)
    assert record["calibration"] == "calibration/h200/llama-3.2-3b-piecewise.json"
    assert record["provenance"]["measured_on"] == "2026-11-30"
    assert json.loads(json.dumps(record)) == record  # goes into summary.json as it is
    assert describe(None) == UNCALIBRATED == "uncalibrated: datasheet roofline, default efficiencies"
    assert pricing(None)["calibration"] is None


def test_every_shipped_calibration_loads_and_is_filed_where_its_provenance_says():
    """calibration/<gpu>/<model>[-<engine>][-<backend>].json: the folder names its GPU, the
    name its model and engine kind (or another variant of the engine) and the attention
    backend its profile ran where not the Triton kernel, and the provenance records the date
    and the command that measured it."""
    files = [f for d in sorted(SHIPPED_DIR.iterdir()) if d.is_dir() for f in sorted(d.glob("*"))
             if _gpu_folder(d)]
    for path in files:
        cal = load_calibration(path)
        p = cal.provenance
        gpu = get_gpu(path.parent.name).name
        assert p.gpu_preset == gpu, path
        assert path.stem.startswith(f"{p.model}"), path
        suffix = path.stem[len(p.model):].lstrip("-")
        if p.attention_backend != "triton":
            assert suffix.endswith(p.attention_backend), path
            suffix = suffix[:-len(p.attention_backend)].rstrip("-")
        assert suffix in ("", p.engine.label) or p.engine_variant, path
        assert p.measured_on and p.command and p.gpu_name, path


def _gpu_folder(folder: Path) -> bool:
    try:
        get_gpu(folder.name)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------- transfer
def test_a_transfer_scales_launches_by_layers_and_activation_by_the_models_shapes(tmp_path):
    source = load_calibration(write(tmp_path / "3b.json", calibration_data()))
    moved = transfer(source, "llama-3.1-8b")
    eff = moved.efficiency
    # rates are shares of the datasheet peak: carried as they are
    assert (eff.linear_compute, eff.memory, eff.step_overhead_s) == (0.65, 0.88, 2e-3)
    # a launch enqueues a fixed number of kernels per layer: 32 layers over 28
    assert eff.piecewise_launch_s == pytest.approx(1.6e-3 * 32 / 28)
    assert eff.split_launch_s == pytest.approx(1.2e-3 * 32 / 28)
    # per token the forward holds 2 hidden rows and the MLP block (3 x intermediate + hidden)
    # in bf16, and 20 bytes of inputs: 8B (4096, 14336) 110,612 B over 3B (3072, 8192) 67,604
    assert moved.activation.bytes_per_token == pytest.approx(96_000 * 110_612 / 67_604)
    assert moved.activation.fixed_bytes == PROFILE.fixed_bytes
    assert moved.vmm_costs == VMM
    p = moved.provenance
    assert (p.model, p.measured_on, p.engine) == ("llama-3.1-8b", "2026-11-30", EngineKind(True))
    assert "transferred from llama-3.2-3b" in describe(moved)
    save_calibration(tmp_path / "8b.json", moved.data)  # a valid calibration on its own
    assert load_calibration(tmp_path / "8b.json").parts() == moved.parts()


def test_a_transfer_of_the_device_terms_takes_host_and_engine_from_the_target(tmp_path):
    """`host_from`: a calibration of the target's host and engine gives the per-step host
    terms, how launches overlap the device, the piecewise sizes and the VMM costs; the device
    rates still come from the source."""
    source = load_calibration(write(tmp_path / "3b.json", calibration_data()))
    host = Efficiency(linear_compute=0.5, step_overhead_s=3e-3, per_seq_overhead_s=1e-7,
                      eager_launch_s=0.013, split_launch_s=1.5e-3, launch_serial_fraction=0.2)
    eager = {**calibration_data("llama-3.1-8b", sizes=None), "efficiency": asdict(host),
             "vmm": None}
    own = load_calibration(write(tmp_path / "8b.json", eager))
    moved = transfer(source, "llama-3.1-8b", host_from=own)
    eff = moved.efficiency
    assert eff.linear_compute == 0.65 and eff.memory == 0.88  # the source's device rates
    assert (eff.step_overhead_s, eff.per_seq_overhead_s, eff.eager_launch_s,
            eff.piecewise_launch_s, eff.split_launch_s, eff.launch_serial_fraction) == (
        3e-3, 1e-7, 0.013, None, 1.5e-3, 0.2)
    assert moved.engine == EngineKind() and moved.piecewise_sizes == ()
    assert moved.vmm_costs is None
    assert "host terms from" in describe(moved) and str(tmp_path / "8b.json") in describe(moved)
    # the shipped profile's grid, with another calibration's launch terms: its records would
    # misreport which launches timed them, so they go
    shipped = load_calibration(SHIPPED_DIR / "h200" / "llama-3.1-8b.json")
    hosted = transfer(shipped, "llama-3.1-8b", "h100", host_from=own)
    assert not {"measurements", "attention_measurements", "grid_of"} & set(hosted.data)


def test_a_replays_fit_records_its_engine_model_and_command(tmp_path, monkeypatch):
    """`python -m validation fit` of replays whose piecewise graphs stop at 512 tokens: the
    calibration names that engine although it holds no grid to tell it from."""
    from validation.calibrate import FitResult, write_calibration

    monkeypatch.setattr("sys.argv", ["/x/validation/__main__.py", "fit", "--gpu-dir", "runs"])
    result = FitResult(EFF, Efficiency(), 10, 10, {}, {}, {}, True, "ok", (16, 256, 512))
    path = tmp_path / "fit.json"
    write_calibration(path, result, PROFILE, {"model": "llama-3.1-8b", "gpu": "h200-141gb",
                                              "gpu_dir": "runs"}, VMM, EngineKind(True, 512))
    cal = load_calibration(path)
    p = cal.provenance
    assert (p.model, p.gpu_preset, p.engine) == ("llama-3.1-8b", "h200-141gb",
                                                 EngineKind(True, 512))
    assert p.command == "python -m validation fit --gpu-dir runs"
    assert p.derived_from == "fitted on the replays in runs"
    assert cal.parts() == (EFF, replace(PROFILE, graph_tokens=512), VMM)


def test_a_named_engine_must_match_the_piecewise_sizes(tmp_path):
    capped = calibration_data(sizes=[16, 256, 512], engine="piecewise512")
    assert load_calibration(write(tmp_path / "a.json", capped)).engine == EngineKind(True, 512)
    wrong = calibration_data(sizes=[16, 256, 512], engine="piecewise1024")
    with pytest.raises(ValueError, match="provenance.engine is 'piecewise1024' but "
                                         r"piecewise_sizes is \[16, 256, 512\]"):
        load_calibration(write(tmp_path / "b.json", wrong))


def test_a_carry_keeps_the_grid_that_tells_where_its_terms_were_measured():
    """The shipped 8B H200 profile carried to the H100 (same model) and to the 3B: the grid's
    records stay, so the run's extrapolation note and the piecewise note still speak for the
    terms; the source's fit errors go, and the model's measured bytes go with the model."""
    from sim.core.calibration.coverage import grid_extent
    from sim.core.calibration.schema import timed_launch_kinds
    source = load_calibration(SHIPPED_DIR / "h200" / "llama-3.1-8b.json")
    extent = grid_extent(source.data)
    assert extent is not None and extent.tokens >= 16384  # its 16k prefill
    for model, gpu in (("llama-3.1-8b", "h100"), ("llama-3.2-3b", None)):
        moved = transfer(source, model, gpu)
        assert grid_extent(moved.data) == extent
        assert timed_launch_kinds(moved.data) == timed_launch_kinds(source.data)
        assert moved.data["grid_of"] == {"model": "llama-3.1-8b", "gpu_preset": "h200-141gb"}
        assert "fit_error" not in moved.data and "attention_fit_error" not in moved.data
    on_h100 = transfer(source, "llama-3.1-8b", "h100")
    assert on_h100.data["weights_bytes"] == source.data["weights_bytes"]
    assert "weights_bytes" not in transfer(source, "llama-3.2-3b").data
    # carried twice, the grid still names the model and GPU that ran it
    again = transfer(transfer(source, "llama-3.2-3b"), "qwen2.5-7b", "h100")
    assert again.data["grid_of"] == {"model": "llama-3.1-8b", "gpu_preset": "h200-141gb"}


def test_a_transfer_needs_the_source_model(tmp_path):
    data = calibration_data()
    del data["model"]
    with pytest.raises(ValueError, match="its model is not recorded"):
        transfer(load_calibration(write(tmp_path / "c.json", data)), get_model("llama-3.1-8b"))


def test_the_command_recorded_is_the_one_typed(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/x/gpu_backend/__main__.py", "profile", "--out", "a b.json"])
    assert invoked_command() == "python -m gpu_backend profile --out 'a b.json'"
    monkeypatch.setattr("sys.argv", ["bench.py", "--quick"])
    assert invoked_command() == "python bench.py --quick"



# ------------------------------------------------------------------------- the host gap
def test_the_host_gap_is_the_median_step_time_less_device_span():
    from sim.core.calibration.profile_fit import with_host_gap
    from sim.core.efficiency import measured_host_gap_s

    records = [{"measured_s": 0.010, "device_s": 0.0094},  # 0.6 ms
               {"measured_s": 0.020, "device_s": 0.0198},  # 0.2 ms
               {"measured_s": 0.005, "device_s": float("nan")},  # no span: left out
               {"measured_s": 0.007, "device_s": 0.0066},  # 0.4 ms
               {"measured_s": 0.030, "device_s": 0.0293}]  # 0.7 ms
    assert measured_host_gap_s(records) == pytest.approx(0.0005)  # (0.4 + 0.6) / 2
    assert measured_host_gap_s(records[:2]) == pytest.approx(0.0004)
    assert measured_host_gap_s([{"measured_s": 0.01}]) is None
    assert with_host_gap(EFF, records).host_gap_s == pytest.approx(0.0005)
    assert with_host_gap(EFF, []) == EFF


def test_the_decode_gap_is_what_the_small_decode_steps_shed_launched_ahead():
    from sim.core.calibration.profile_fit import with_host_gap
    from sim.core.efficiency import measured_decode_gap_s

    def record(kind, seqs, measured, ahead):
        return {"kind": kind, "num_decodes": seqs, "measured_s": measured, "ahead_s": ahead,
                "device_s": measured - 1e-4}

    records = [record("decode", 1, 0.0020, 0.0014),  # 0.6 ms
               record("decode", 8, 0.0030, 0.0023),  # 0.7 ms
               record("decode", 4, 0.0025, 0.0020),  # 0.5 ms
               record("decode", 64, 0.0050, 0.0030),  # 2 ms, a larger batch: left out
               record("mixed", 8, 0.0300, 0.0200),  # not decode-only: left out
               record("decode", 2, 0.0020, float("nan"))]  # not launched ahead: left out
    assert measured_decode_gap_s(records) == pytest.approx(6e-4)
    assert measured_decode_gap_s(records[3:]) is None
    fitted = with_host_gap(EFF, records)
    assert fitted.decode_host_gap_s == pytest.approx(6e-4)
    assert fitted.host_gap_s == pytest.approx(1e-4)
    assert with_host_gap(EFF, records[3:5]).decode_host_gap_s is EFF.decode_host_gap_s


def test_a_file_without_the_decode_gap_takes_it_from_its_own_grid(tmp_path):
    import statistics

    shipped = json.loads((SHIPPED_DIR / "h200" / "qwen2.5-0.5b-piecewise.json").read_text())
    shipped["efficiency"].pop("decode_host_gap_s", None)
    sheds = [m["measured_s"] - m["ahead_s"] for m in shipped["measurements"]
             if m["kind"] == "decode" and m["num_decodes"] <= 8]
    assert len(sheds) >= 8
    loaded = load_calibration(write(tmp_path / "c.json", shipped)).efficiency
    assert loaded.decode_host_gap_s == pytest.approx(statistics.median(sheds))
    assert loaded.host_gap_s < loaded.decode_host_gap_s < 1e-3
    bare = calibration_data()  # no grid: unset, so decode steps hide the host gap
    assert load_calibration(write(tmp_path / "d.json", bare)).efficiency.decode_host_gap_s is None


def test_a_file_without_the_host_gap_takes_it_from_its_own_grid(tmp_path):
    import statistics

    shipped = json.loads((SHIPPED_DIR / "h200" / "llama-3.1-8b.json").read_text())
    # as a profile written before the host gap was stored: the grid without the key
    shipped["efficiency"].pop("host_gap_s", None)
    gaps = [m["measured_s"] - m["device_s"] for m in shipped["measurements"]]
    loaded = load_calibration(write(tmp_path / "c.json", shipped))
    assert loaded.efficiency.host_gap_s == pytest.approx(statistics.median(gaps))
    assert 2e-4 < loaded.efficiency.host_gap_s < 1e-3
    bare = calibration_data()  # no grid and no host gap: the default
    bare["efficiency"] = {k: v for k, v in bare["efficiency"].items() if k != "host_gap_s"}
    assert load_calibration(write(tmp_path / "d.json", bare)).efficiency.host_gap_s == \
        Efficiency().host_gap_s
    given = {**bare, "efficiency": {**bare["efficiency"], "host_gap_s": 7e-4}}
    assert load_calibration(write(tmp_path / "e.json", given)).efficiency.host_gap_s == 7e-4
