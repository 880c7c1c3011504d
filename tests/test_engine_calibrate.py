"""Calibration pieces without a GPU: synthetic steps, the cost-model fit, memory sizing."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from test_engine_helpers import TINY, toy_config, toy_core

from gpu_backend.engine.device_clock import StepPhases
from gpu_backend.engine.memory import (
    MemoryMeasurement,
    dummy_batch,
    fit_envelope,
    kv_caches_of,
    measured_plan,
    profile_token_counts,
)
from gpu_backend.engine.profile_grid import default_grid, grid_max_len
from gpu_backend.engine.runner import ModelRunner
from gpu_backend.engine.setup import plain_store
from gpu_backend.engine.shapes import host_batch, mixed_shape, prompt_shapes, scheduler_output
from gpu_backend.engine.step_timing import time_step, time_step_ahead
from gpu_backend.model import build_model
from sim.core.calibration import MIN_PROGRAM_STEPS, num_program_bound
from sim.core.calibration.profile_fit import fit_profile
from sim.core.catalog import GIB, MIB, get_gpu, get_model
from sim.core.cost_model import CostArgs, CostModel, Efficiency
from sim.core.engine_config import EngineConfig
from sim.core.memory_plan import ActivationProfile


def timed_by(gpu_name: str, kv_memory: float):
    """Llama-3.1-8B's default grid on `gpu_name`, each step timed at a known Efficiency's
    price: (model, gpu, grid, outputs, measured seconds)."""
    model, gpu = get_model("llama-3.1-8b"), get_gpu(gpu_name)
    truth = Efficiency(linear_compute=0.6, memory=0.8, kv_memory=kv_memory,
                       attention_compute=0.3, step_overhead_s=2e-3, per_seq_overhead_s=1e-5)
    grid = default_grid()
    outputs = [scheduler_output(s) for s in grid]
    measured = np.array([CostModel(model, gpu, 1, truth).step(o).total_s for o in outputs])
    return model, gpu, grid, outputs, measured


def test_fit_recovers_known_efficiencies():
    model, gpu, _, outputs, measured = timed_by("h200", kv_memory=Efficiency().kv_memory)
    fitted, error = fit_profile(CostArgs(model, gpu), outputs, measured)
    assert error["median_abs_rel"] < 0.02 and error["max_abs_rel"] < 0.1
    assert fitted.linear_compute == pytest.approx(0.6, rel=0.1)
    assert fitted.memory == pytest.approx(0.8, rel=0.1)
    assert fitted.step_overhead_s == pytest.approx(2e-3, rel=0.2)
    assert fitted.attention_program is None  # no step's longest attention program binds


# Llama-3.1-8B's weights (8.03e9 bf16 parameters) and 256 sequences' KV of 8,192 tokens
# (32 layers x 2 x 8 KV heads x 128 x 2 bytes = 131,072 bytes a token), read once at the
# H200's datasheet 4.8 TB/s: the fastest a decode of 256 x 8,192 can be.
DECODE_256_8K_ROOFLINE_S = (8.03e9 * 2 + 256 * 8192 * 131072) / 4.8e12  # 60.6 ms


def test_a_step_timed_faster_than_its_roofline_is_left_out_of_the_fit():
    """A grid step measured faster than the datasheet lets it be (its KV re-read from the
    cache) is named and left out: the fit still finds the rates the other steps ran at."""
    model, gpu, grid, outputs, measured = timed_by("h200", kv_memory=0.8)
    fast = next(i for i, s in enumerate(grid) if s.decodes == (8192,) * 256)
    assert measured[fast] > DECODE_256_8K_ROOFLINE_S
    measured[fast] = 0.9 * DECODE_256_8K_ROOFLINE_S
    fitted, error = fit_profile(CostArgs(model, gpu), outputs, measured)
    assert error["beyond_roofline"] == [fast]
    assert len(error["per_point_rel"]) == len(grid) and error["per_point_rel"][fast] > 0.3
    assert error["median_abs_rel"] < 0.02 and error["max_abs_rel"] < 0.1
    assert fitted.kv_memory == pytest.approx(0.8, rel=0.05)
    measured[fast] = 1.05 * DECODE_256_8K_ROOFLINE_S  # slow enough to be read from memory
    _, error = fit_profile(CostArgs(model, gpu), outputs, measured)
    assert error["beyond_roofline"] == []


def test_steps_whose_kv_outgrew_the_profiles_pool_are_left_out_of_the_fit():
    """With a pool of 19,470 blocks of 16 tokens (311,504 tokens), 64 x 8,192 (524,288 tokens)
    outgrows it and 32 x 8,192 (262,144) does not. The steps that outgrow it, timed 15% fast
    (as the cache or their sheer size made them), are left out, and the fit finds the rate the
    others ran at; a setup without a pool size leaves nothing out."""
    from sim.core.calibration.profile_fit import outgrew_pool

    model, gpu, grid, outputs, measured = timed_by("h100", kv_memory=0.85)
    setup = {"blocks": "side by side; rows at random where a step outgrows the pool",
             "pool_blocks": 19470, "block_size": 16}
    outgrew = outgrew_pool(setup, outputs)
    index = {s.decodes: i for i, s in enumerate(grid) if s.kind == "decode"}
    assert outgrew[index[(8192,) * 64]] and outgrew[index[(16384,) * 32]]
    assert not outgrew[index[(8192,) * 32]] and not outgrew[index[(16384,) * 16]]
    assert not any(outgrew[i] for i, s in enumerate(grid) if s.kind != "decode")
    assert outgrew_pool({**setup, "block_size": 32}, outputs).sum() < outgrew.sum()
    measured[outgrew] *= 0.85
    fitted, error = fit_profile(CostArgs(model, gpu), outputs, measured, outgrew=outgrew)
    assert error["outgrew_pool"] == [int(i) for i in np.flatnonzero(outgrew)]
    assert fitted.kv_memory == pytest.approx(0.85, rel=0.03)
    kept, _ = fit_profile(CostArgs(model, gpu), outputs, measured)
    assert kept.kv_memory > 0.88  # kept, the fast steps make KV look faster
    assert not outgrew_pool({"blocks": "side by side"}, outputs).any()


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.2-3b", "qwen2.5-0.5b"])
def test_the_grid_tells_the_longest_attention_programs_speed(name):
    """Grid steps made with attention_program 0.35: its chunks beside long decode rows last
    as long as their longest row's program, and the fit finds the speed again."""
    model, gpu = get_model(name), get_gpu("h200")
    truth = Efficiency(linear_compute=0.6, memory=0.8, attention_compute=0.4,
                       step_overhead_s=2e-3, per_seq_overhead_s=1e-5, eager_launch_s=3e-3,
                       attention_program=0.35)
    outputs = [scheduler_output(s) for s in default_grid()]
    with_term = np.array([CostModel(model, gpu, 1, truth).step(o).total_s for o in outputs])
    without = replace(truth, attention_program=None)
    plain = np.array([CostModel(model, gpu, 1, without).step(o).total_s for o in outputs])
    assert num_program_bound(with_term, plain) >= MIN_PROGRAM_STEPS
    fitted, error = fit_profile(CostArgs(model, gpu), outputs, with_term)
    assert fitted.attention_program == pytest.approx(0.35, rel=0.02)
    assert fitted.attention_program_serial == pytest.approx(0.0, abs=1e-3)
    assert error["median_abs_rel"] < 1e-3


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.2-3b"])
def test_the_grid_tells_how_much_of_the_longest_program_the_work_does_not_hide(name):
    """Grid steps made with attention_program_serial 0.5 (each chunk beside long decode rows
    lasts the longer of its work and its longest program and half the shorter): the fit finds
    both terms again, where one held at 0 misprices those steps."""
    model, gpu = get_model(name), get_gpu("h200")
    truth = Efficiency(linear_compute=0.6, memory=0.8, attention_compute=0.4,
                       step_overhead_s=2e-3, per_seq_overhead_s=1e-5, eager_launch_s=3e-3,
                       attention_program=0.35, attention_program_serial=0.5)
    outputs = [scheduler_output(s) for s in default_grid()]
    measured = np.array([CostModel(model, gpu, 1, truth).step(o).total_s for o in outputs])
    fitted, error = fit_profile(CostArgs(model, gpu), outputs, measured)
    assert fitted.attention_program == pytest.approx(0.35, rel=0.02)
    assert fitted.attention_program_serial == pytest.approx(0.5, abs=0.02)
    assert error["max_abs_rel"] < 1e-3
    _, held = fit_profile(CostArgs(model, gpu), outputs, measured,
                             hold=("attention_program_serial",))
    assert held["max_abs_rel"] > 0.02


def test_copy_bandwidth_pins_weight_streaming_and_the_step_overhead_takes_the_rest():
    """Launch overhead hidden in a low 'memory' efficiency would halve under TP=2; pinned to
    the copy bandwidth, the fixed cost stays in the per-step term."""
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h200")
    truth = Efficiency(linear_compute=0.7, memory=0.88, attention_compute=0.4,
                       step_overhead_s=4e-3, per_seq_overhead_s=1e-5,
                       linear_serial_fraction=0.5)
    outputs = [scheduler_output(s) for s in default_grid()]
    measured = np.array([CostModel(model, gpu, 1, truth).step(o).total_s for o in outputs])
    copy = 0.88 * gpu.memory_bandwidth_bytes_s
    fitted, error = fit_profile(CostArgs(model, gpu), outputs, measured,
                                   copy_bandwidth_bytes_s=copy)
    assert fitted.memory == pytest.approx(0.88, rel=1e-12)  # held, not fitted
    assert error["median_abs_rel"] < 0.01
    assert fitted.step_overhead_s == pytest.approx(4e-3, rel=0.1)
    assert fitted.linear_serial_fraction == pytest.approx(0.5, abs=0.1)
    # the same TP=1 grid, explained by a fit that is told the weights stream at 0.5
    wrong, _ = fit_profile(CostArgs(model, gpu), outputs, measured,
                              copy_bandwidth_bytes_s=0.5 * gpu.memory_bandwidth_bytes_s)
    assert wrong.memory == pytest.approx(0.5) and wrong.step_overhead_s < fitted.step_overhead_s


def test_linear_time_between_roofline_and_sum():
    """The serial share adds the whole shorter side at the ridge (compute = weight read) and
    fades away from it: a chunk's compute-bound GEMMs and a small batch's weight-bound ones
    hide the other side."""
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h200")
    roof, half, serial = (CostModel(model, gpu, 1, Efficiency(linear_serial_fraction=f))
                          for f in (0.0, 0.5, 1.0))
    weights = roof._layer_weight_bytes / roof._bytes_s
    ridge = weights * roof._flops_s / roof._layer_flops_per_token  # tokens where they are equal
    assert 100 < ridge < 1000  # an H200 8B GEMM's ridge: a few hundred rows
    at_ridge = int(round(ridge))  # a whole token: within 0.1% of the ridge
    compute = at_ridge * roof._layer_flops_per_token / roof._flops_s
    assert serial.linear_s(at_ridge) == pytest.approx(compute + weights, rel=1e-3)
    assert half.linear_s(at_ridge) == pytest.approx(max(compute, weights)
                                                    + 0.5 * min(compute, weights), rel=1e-3)
    for tokens in (1, 32, 256, 4096, 65536):
        compute = tokens * roof._layer_flops_per_token / roof._flops_s
        assert roof.linear_s(tokens) == pytest.approx(max(compute, weights))
        assert roof.linear_s(tokens) < half.linear_s(tokens) < serial.linear_s(tokens)
        assert serial.linear_s(tokens) <= compute + weights
    # 64 times past the ridge (or below it) the shorter side adds 1/64 of itself
    far = 64 * at_ridge
    compute = far * roof._layer_flops_per_token / roof._flops_s
    assert serial.linear_s(far) - roof.linear_s(far) == pytest.approx(weights / 64, rel=0.01)


def test_scheduler_output_of_a_mixed_step_matches_the_core_fields():
    out = scheduler_output(mixed_shape(100, 50, 3, 20))
    assert (out.num_prefill_tokens, out.num_decode_tokens) == (100, 3)
    assert out.prefill_chunks == ((100, 50),) and out.decode_context_tokens == 60
    assert out.num_sampled_rows == 4 and len(out.scheduled) == 4


def test_a_chunked_prompt_is_its_chunks_over_the_prefix_before_each():
    alone = prompt_shapes(5000, 2048)
    assert [(s.kind, s.prefills, s.decodes) for s in alone] == [
        ("prefill", ((2048, 0),), ()), ("prefill", ((2048, 2048),), ()),
        ("prefill", ((904, 4096),), ())]
    beside = prompt_shapes(5000, 8192, num_decodes=3, decode_context=100)
    assert [(s.kind, s.prefills, s.decodes) for s in beside] == [
        ("mixed", ((5000, 0),), (100, 100, 100))]


def test_grid_shapes_run_through_the_tiny_model_on_cpu():
    config = toy_config()
    core = toy_core(config, num_kv_blocks=64)
    store = plain_store(core, "cpu", torch.float32)
    model = build_model(TINY, "cpu", torch.float32, attention_backend="torch", max_position=2048)
    runner = ModelRunner(model, kv_caches_of(store, TINY.num_layers), torch.device("cpu"))
    for shape in default_grid(quick=True):
        batch = host_batch(shape, config.block_size, store.num_blocks)
        used = np.arange(batch.block_tables.shape[1]) < -(-batch.seq_lens[:, None] // 16)
        assert config.block_size == 16 and batch.block_tables.max() < store.num_blocks
        assert batch.block_tables[used].min() >= 1  # block 0 (scratch) pads the rows only
        assert not batch.block_tables[~used].any()
        ids = runner.execute(batch)
        assert ids.shape == (len(shape.prefills) + len(shape.decodes),)


def test_dummy_batch_spreads_tokens_over_sequences():
    batch, num_blocks = dummy_batch(100, 8, 16, torch.device("cpu"))
    assert batch.query_start_loc.tolist()[-1] == 100 and batch.seq_lens.tolist()[:5] == [13] * 4 + [12]
    assert num_blocks == 2 and batch.logits_indices.shape == (8,)
    assert batch.slot_mapping.min() >= 16  # block 0 is scratch
    assert profile_token_counts(8192, 256) == [256, 1024, 2048, 4096, 8192]


def test_envelope_covers_every_peak():
    peaks = {256: 50_000_000, 1024: 120_000_000, 4096: 410_000_000, 8192: 800_000_000}
    slope, fixed = fit_envelope(peaks)
    assert all(fixed + slope * n >= peak for n, peak in peaks.items())
    assert slope == pytest.approx(95_000, rel=0.1)


def test_measured_plan_uses_measured_sizes_and_the_block_quantum():
    config = EngineConfig(get_model("qwen2.5-0.5b"), get_gpu("h200"), max_num_batched_tokens=2048,
                          max_num_seqs=256)
    profile = ActivationProfile(20_000.0, 300 * MIB, 700 * MIB)
    m = MemoryMeasurement(140 * GIB, 1 * GIB, {2048: 330 * MIB}, profile, 500 * MIB, 200 * MIB)
    plan = measured_plan(config, m)
    reserve = int(300 * MIB + 20_000 * 2048)
    assert plan.activation_reserve_bytes == reserve and plan.weights_bytes == GIB
    assert plan.non_torch_bytes == 700 * MIB
    assert (plan.num_kv_blocks + 1) % 32 == 0  # 192 KiB blocks: 32 per 6 MiB of granules
    left = int(140 * GIB * 0.9) - GIB - reserve - 700 * MIB
    assert 0 <= left - plan.kv_pool_bytes < 32 * plan.block_bytes
    capped = measured_plan(config, m, max_kv_blocks=100)
    assert capped.num_kv_blocks == 127
    assert replace(capped, num_kv_blocks=0).num_kv_blocks == 0


def test_calibration_json_loads_in_the_simulator(tmp_path):
    from gpu_backend.engine.calibrate import write_calibration
    from sim.core.calibration import load_calibration

    fitted = Efficiency(linear_compute=0.5)
    result = {"gpu": "NVIDIA H200", "model": "llama-3.1-8b", "versions": {},
              "efficiency": fitted.__dict__ | {},
              "activation": {"bytes_per_token": 1e5, "fixed_bytes": 10, "non_torch_bytes": 20},
              "measurements": [], "fit_error": {}}
    write_calibration(tmp_path / "c.json", result)
    efficiency, profile, vmm_costs = load_calibration(tmp_path / "c.json").parts()
    assert efficiency == fitted
    # no piecewise_sizes: the non-torch bytes hold no piecewise graph's pool
    assert profile == ActivationProfile(1e5, 10, 20, graph_tokens=0)
    assert vmm_costs is None  # no "vmm" measured: the simulator's driver figures


def test_a_bad_calibration_is_named_by_its_file_and_leaves_the_old_one_whole(tmp_path):
    """write_calibration checks the result while writing a temporary beside the file: the
    error names the file it was meant for, and the file it would replace is untouched."""
    from gpu_backend.engine.calibrate import write_calibration

    path = tmp_path / "c.json"
    path.write_text("kept")
    bad = {"model": "llama-3.1-8b", "efficiency": {"linear_compute": "fast"}}
    with pytest.raises(ValueError, match=f"^{path}: efficiency.linear_compute is 'fast'"):
        write_calibration(path, bad)
    assert path.read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]


def test_refit_recovers_efficiencies_from_stored_measurements():
    """A calibration's stored grid can be fitted again without a GPU (new cost-model terms)."""
    from dataclasses import asdict

    from gpu_backend.engine.calibrate import refit_calibration
    from gpu_backend.engine.profile_grid import default_grid
    from gpu_backend.engine.shapes import scheduler_output
    from sim.core.catalog import get_gpu, get_model
    from sim.core.cost_model import CostModel, Efficiency

    true = Efficiency(linear_compute=0.66, memory=0.61, kv_memory=0.83, attention_compute=0.35,
                      step_overhead_s=2e-3, per_seq_overhead_s=1e-5, eager_launch_s=0.03)
    cost = CostModel(get_model("llama-3.1-8b"), get_gpu("h200"), 1, true)
    measurements = [{**shape.describe(), "measured_s": cost.step(scheduler_output(shape)).total_s}
                    for shape in default_grid()]
    data = {"model": "llama-3.1-8b", "gpu_preset": "h200-141gb", "measurements": measurements,
            "efficiency": asdict(Efficiency())}
    result = refit_calibration(data)
    assert result["fit_error"]["median_abs_rel"] < 1e-3
    for name in ("linear_compute", "memory", "kv_memory", "eager_launch_s"):
        assert abs(result["efficiency"][name] - getattr(true, name)) <= 0.03 * getattr(true, name)


def test_refit_fits_the_transition_costs_again_from_their_points():
    """A refit fits the elastic transitions' costs to their stored points by today's rule: a
    cache slope fitted before over a 2 MiB spread of freed bytes goes (transition_costs)."""
    from dataclasses import asdict

    from gpu_backend.engine.calibrate import refit_calibration
    from gpu_backend.engine.profile_grid import default_grid
    from gpu_backend.engine.shapes import scheduler_output
    from sim.core.calibration.profile_fit import transition_costs
    from sim.core.catalog import get_gpu, get_model
    from sim.core.cost_model import CostModel, Efficiency

    cost = CostModel(get_model("llama-3.1-8b"), get_gpu("h200"), 1, Efficiency())
    measurements = [{**shape.describe(), "measured_s": cost.step(scheduler_output(shape)).total_s}
                    for shape in default_grid()]
    mib = 2**20
    points = [{"handles": n, "freed_bytes": freed, "attach_s": 1e-3 + (0.4e-3 if freed else 0),
               "detach_s": 5e-4} for n, freed in ((1, 2 * mib), (2, 2 * mib), (2, 0))]
    stale = {**transition_costs(points), "attach_cache_gib_s": 0.2}
    data = {"model": "llama-3.1-8b", "gpu_preset": "h200-141gb", "measurements": measurements,
            "efficiency": asdict(Efficiency()),
            "vmm": {"handle_bytes": 512 * mib, "reclaim": "release", "points": points,
                    "costs": stale}}
    vmm = refit_calibration(data)["vmm"]
    assert vmm["points"] == points and vmm["handle_bytes"] == 512 * mib
    assert vmm["costs"]["attach_cache_gib_s"] == 0.0
    assert vmm["costs"]["attach_fixed_s"] > 1e-3  # the 0.4 ms went to the other terms


def test_step_shape_records_round_trip_skewed_batches_and_read_old_files():
    """A calibration stores each grid step as a record; a skewed decode batch (one long
    sequence among short ones) must come back with every row's context, and records written
    before decode_groups existed (one context for all rows) must still load."""
    from gpu_backend.engine.shapes import (
        StepShape,
        mixed_shape,
        scheduler_output,
        skewed_decode_shape,
    )

    for shape in (skewed_decode_shape(20, 256, 12000, 4), mixed_shape(512, 2048, 3, 700),
                  StepShape("prefill", ((64, 0),))):
        back = StepShape.from_record(json.loads(json.dumps(shape.describe())))
        assert back == shape
        assert scheduler_output(back).decode_context_tokens == sum(shape.decodes)
    old = {"kind": "decode", "prefills": [], "num_decodes": 3, "decode_context": 900}
    assert StepShape.from_record(old).decodes == (900, 900, 900)
    skewed = skewed_decode_shape(32, 512, 16384)
    assert sorted(skewed.decodes)[-1] == 16384 and sum(skewed.decodes) == 31 * 512 + 16384


def test_engine_step_builds_what_host_batch_builds():
    """The calibration times the engine's own RequestMirror.build (as replays time it); the
    batch it builds must be the grid step host_batch describes: same tokens, positions, slots,
    sequence lengths and sampled rows, and the same blocks in every used table entry."""
    from gpu_backend.engine.shapes import (
        engine_step,
        host_batch,
        mixed_shape,
        prefill_shape,
        skewed_decode_shape,
    )

    for shape in (mixed_shape(100, 40, 5, 70), skewed_decode_shape(9, 33, 300, 2),
                  prefill_shape(64, 17)):
        expect = host_batch(shape, 16, 50)
        mirror, out = engine_step(shape, 16, 50, vocab_size=1000)
        got = mirror.build(out, 50)  # the pool's usable blocks, as engine_step laid them
        for name in ("input_ids", "positions", "slot_mapping", "seq_lens", "query_start_loc",
                     "logits_indices"):
            np.testing.assert_array_equal(getattr(got, name), getattr(expect, name), name)
        used = -(-expect.seq_lens // 16)
        for row, n in enumerate(used):
            np.testing.assert_array_equal(got.block_tables[row, :n], expect.block_tables[row, :n])
        assert (got.max_query_len, got.max_seq_len) == (expect.max_query_len, expect.max_seq_len)


def test_a_step_that_fits_the_pool_lies_side_by_side_and_one_that_outgrows_it_at_random():
    from gpu_backend.engine.shapes import decode_shape, engine_step

    fits, _ = engine_step(decode_shape(3, 160), 16, 31, vocab_size=100)  # 30 blocks, 30 usable
    assert [list(fits.tables[r]) for r in range(3)] == [list(range(k, k + 10))
                                                         for k in (0, 10, 20)]
    # 8 rows of 100 blocks over 300: round-robin would give rows 0, 3 and 6 the same blocks
    # in the same order, which the kernel reads together (an L2 hit a real step never gets)
    big, _ = engine_step(decode_shape(8, 1600), 16, 301, vocab_size=100)
    rows = np.array([big.tables[r] for r in range(8)])
    assert rows.shape == (8, 100) and rows.min() >= 0 and rows.max() < 300
    assert all(len(set(row)) == 100 for row in rows)  # a row never reads a block twice
    same_place = [(rows[a] == rows[b]).mean() for a in range(8) for b in range(a + 1, 8)]
    assert max(same_place) < 0.05
    again, _ = engine_step(decode_shape(8, 1600), 16, 301, vocab_size=100)
    assert (np.array([again.tables[r] for r in range(8)]) == rows).all()  # seeded


def test_transition_cycles_run_through_the_engines_executor_and_leak_nothing():
    """The profile times attach/detach by the engine's own ElasticExecutor (what replays
    time); on the fake driver each cycle maps the whole reserve and gives it all back."""
    from gpu_backend.engine.elastic import ElasticExecutor
    from gpu_backend.engine.transitions import cycle_transitions
    from gpu_backend.vmm import ElasticKVPool
    from gpu_backend.vmm.fake_driver import FakeCudaDriver
    from gpu_backend.vmm.layout import KVLayout
    from sim.core.elastic import Policy

    fake, mib = FakeCudaDriver(), 1024 * 1024
    pool = ElasticKVPool(KVLayout.from_name("llama-3.1-8b"), 1, 6 * mib,
                         elastic_handle_bytes=2 * mib, reclaim="release", driver=fake)
    mapped, cache = [], {"reserved": 0}  # a stand-in for torch's caching allocator

    def prefill() -> None:  # each prefill leaves 3 MiB of activations cached
        cache["reserved"] += 3 * mib

    executor = ElasticExecutor(pool, Policy.ELASTIC, block_id_offset=0, num_core_base_blocks=1,
                               sync=lambda: None, on_mapped=mapped.append,
                               empty_cache=lambda: cache.update(reserved=0),
                               reserved_bytes=lambda: cache["reserved"])
    result = cycle_transitions(executor, prefill, pool.plan.num_elastic_blocks, cycles=3)
    assert len(executor.attach_latencies_s) == 3
    assert result["attach_s"] > 0 and result["detach_s"] > 0
    assert result["freed_bytes"] == 3 * mib  # what each attach handed back
    assert mapped == [6 * mib, 0] * 3  # every handle mapped, then every one released
    assert not pool.attached
    pool.close()
    assert fake.leaks() == []


class ScriptedRunner:
    """Reports the given phases, one per execute(), as the engine's runner sets them."""

    def __init__(self, phases: list[tuple[float, float]]) -> None:
        self.script, self.calls = iter(phases), 0

    def execute(self, batch) -> None:
        self.calls += 1
        self.phases = StepPhases(*next(self.script))


def test_time_step_reports_the_median_of_each_phase():
    # 2 warm-ups (not counted), then 5 timed runs: enqueue medians 3, device medians 30
    runner = ScriptedRunner([(99, 99), (99, 99), (1, 50), (5, 10), (3, 30), (2, 40), (4, 20)])
    timing = time_step(runner, lambda: None, warmup=2, repeat=5)
    assert runner.calls == 7
    assert timing["enqueue_s"] == 3 and timing["device_s"] == 30
    assert timing["measured_s"] >= timing["build_s"] >= 0


class AheadRunner:
    """Launches steps that end on a scripted device: each runs `device_s` once the step before
    it has ended and its own launch is done (`launch_s` of host time after the launch before),
    as a stream of steps launched ahead runs on one GPU."""

    def __init__(self, launch_s: float, device_s: float) -> None:
        self.launch_s, self.device_s = launch_s, device_s
        self.host_t = self.device_t = 0.0
        self.launches = 0

    def launch(self, batch):
        runner = self
        self.launches += 1
        self.host_t += self.launch_s
        start = max(self.host_t, self.device_t)
        self.device_t = start + self.device_s

        class Launched:
            done_t = None
            phases = StepPhases()

            def collect(self, end=self.device_t, span=self.device_t - start):
                runner.host_t = max(runner.host_t, end)  # the host waits for the step
                self.done_t, self.phases = end, StepPhases(math.nan, span)

        return Launched()


def test_time_step_ahead_reports_the_period_of_a_stream_of_steps():
    # device-bound: 10 ms steps launched in 4 ms each run back to back, every 10 ms
    runner = AheadRunner(launch_s=0.004, device_s=0.010)
    timing = time_step_ahead(runner, lambda: None, warmup=2, repeat=5)
    assert runner.launches == 8  # 2 warm-ups, 5 timed, one more launched behind the last
    assert timing["ahead_s"] == pytest.approx(0.010)
    assert timing["ahead_device_s"] == pytest.approx(0.010)
    # host-bound: the launch (12 ms) sets the period; the device idles between steps
    runner = AheadRunner(launch_s=0.012, device_s=0.010)
    timing = time_step_ahead(runner, lambda: None, warmup=2, repeat=5)
    assert timing["ahead_s"] == pytest.approx(0.012)


def test_split_launch_is_fitted_where_the_grid_splits_and_held_where_it_barely_does():
    """The grid's steps whose attention splits its keys (sim.core.cost_model.attention_num_splits):
    enough of them for both models, so a known split launch comes back; with only one such
    step (a grid without such steps, as Llama-3.1-8B's once was) it stays at 0."""
    from sim.core.calibration import MIN_SPLIT_STEPS
    from sim.core.cost_model import step_extents

    gpu = get_gpu("h200")
    # launch times as measured: Qwen with piecewise graphs, Llama eager (its short steps are
    # launch-bound there, so a split shows)
    for name, launch in (("qwen2.5-0.5b", 3e-3), ("llama-3.1-8b", 15e-3)):
        truth = Efficiency(linear_compute=0.5, memory=0.85, attention_compute=0.35,
                           step_overhead_s=1.4e-3, per_seq_overhead_s=2e-6,
                           eager_launch_s=launch, split_launch_s=1.2e-3)
        model = get_model(name)
        cost = CostModel(model, gpu, 1, truth)
        outputs = [scheduler_output(s) for s in default_grid()]
        split = [o for o in outputs if o.num_prefill_tokens and cost.splits(
            o.num_prefill_tokens + o.num_decode_tokens, len(o.scheduled), *step_extents(o))]
        assert len(split) >= MIN_SPLIT_STEPS, name
        measured = np.array([cost.step(o).total_s for o in outputs])
        fitted, error = fit_profile(CostArgs(model, gpu), outputs, measured)
        assert fitted.split_launch_s == pytest.approx(1.2e-3, rel=0.05), name
        assert error["median_abs_rel"] < 0.01, name
        # one splitting step only: the term is held at its start (0), not fitted to it
        keep = [o for o in outputs if o not in split[1:]]
        times = np.array([cost.step(o).total_s for o in keep])
        held, _ = fit_profile(CostArgs(model, gpu), keep, times)
        assert held.split_launch_s == 0.0, name


def test_a_capped_grid_fits_both_launch_terms_and_an_uncapped_one_holds_the_eager_one():
    """Piecewise graphs up to 512 tokens: the grid's shorter prefill steps run them (3 ms of
    launches), its longer ones fully eager (15 ms); a fit recovers both. Graphs up to the
    largest step (no cap): no step ran fully eager, so eager_launch_s keeps its start (0,
    not measured) and the piecewise term is fitted; an eager grid leaves the piecewise
    term unset."""
    from sim.core.cost_model import piecewise_capture_sizes, piecewise_sizes_for

    gpu, model = get_gpu("h200"), get_model("qwen2.5-0.5b")
    truth = Efficiency(linear_compute=0.5, memory=0.85, attention_compute=0.35,
                       step_overhead_s=1.4e-3, per_seq_overhead_s=2e-6, eager_launch_s=15e-3,
                       piecewise_launch_s=3e-3)
    outputs = [scheduler_output(s) for s in default_grid()]
    pinned = {"copy_bandwidth_bytes_s": 0.85 * gpu.memory_bandwidth_bytes_s}
    capped = piecewise_sizes_for(8192, 512)
    cost = CostModel(model, gpu, 1, truth, token_graph_sizes=capped)
    measured = np.array([cost.step(o).total_s for o in outputs])
    fitted, error = fit_profile(CostArgs(model, gpu), outputs, measured, token_graph_sizes=capped,
                                   **pinned)
    assert fitted.eager_launch_s == pytest.approx(15e-3, rel=0.05)
    assert fitted.piecewise_launch_s == pytest.approx(3e-3, rel=0.05)
    assert error["median_abs_rel"] < 0.01

    full = piecewise_capture_sizes(8192)
    cost = CostModel(model, gpu, 1, truth, token_graph_sizes=full)
    measured = np.array([cost.step(o).total_s for o in outputs])
    fitted, _ = fit_profile(CostArgs(model, gpu), outputs, measured, token_graph_sizes=full,
                               **pinned)
    assert fitted.eager_launch_s == 0.0
    assert fitted.piecewise_launch_s == pytest.approx(3e-3, rel=0.05)

    cost = CostModel(model, gpu, 1, truth)
    measured = np.array([cost.step(o).total_s for o in outputs])
    fitted, _ = fit_profile(CostArgs(model, gpu), outputs, measured, **pinned)
    assert fitted.piecewise_launch_s is None
    assert fitted.eager_launch_s == pytest.approx(15e-3, rel=0.05)


def test_a_grid_timed_in_two_passes_cancels_a_linear_drift_of_the_host():
    """Each point's true time plus a drift that grows with every measurement: one pass leaves
    the drift on the later points; forward then reverse gives every point the same offset."""
    from gpu_backend.engine.shapes import prefill_shape
    from gpu_backend.engine.step_timing import measure_grid

    shapes = [prefill_shape(n) for n in (16, 64, 256, 1024, 2048)]
    true = {16: 3.0, 64: 3.1, 256: 3.3, 1024: 4.5, 2048: 5.8}
    order = []

    def measure(shape):  # 0.2 ms slower with every measurement taken
        order.append(shape.num_tokens)
        drift = 0.2 * (len(order) - 1)
        return {"measured_s": true[shape.num_tokens] + drift, "enqueue_s": 1.0 + drift}

    one = measure_grid(shapes, measure, passes=1)
    assert [p["measured_s"] - true[s.num_tokens] for p, s in zip(one, shapes)] == \
        pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8])
    order.clear()
    two = measure_grid(shapes, measure, passes=2)
    assert order == [16, 64, 256, 1024, 2048, 2048, 1024, 256, 64, 16]
    for point, shape in zip(two, shapes):  # every offset (0.2 * 9) / 2
        assert point["measured_s"] - true[shape.num_tokens] == pytest.approx(0.9)
        assert point["enqueue_s"] == pytest.approx(1.9)
        assert len(point["passes_measured_s"]) == 2
    order.clear()
    three = measure_grid(shapes, measure, passes=3)  # the median of three passes
    assert three[0]["passes_measured_s"] == pytest.approx([3.0, 4.8, 5.0])
    assert three[0]["measured_s"] == pytest.approx(4.8)
    with pytest.raises(ValueError, match="at least once"):
        measure_grid(shapes, measure, passes=0)


def test_profiles_of_one_grid_merge_to_the_median_of_each_point(tmp_path, capsys):
    """`gpu_backend refit CAL --merge OTHER...`: two profiles of the same grid, one with a host
    slowed down through its second half, merge (median of three with a third clean one) to
    the clean timings, and the fit recovers the efficiencies; a profile of another grid or
    model is refused with its file named."""
    from dataclasses import asdict

    from gpu_backend.__main__ import main
    from gpu_backend.engine.profile_grid import default_grid
    from gpu_backend.engine.shapes import scheduler_output
    from sim.core.catalog import get_gpu, get_model
    from sim.core.cost_model import CostModel, Efficiency

    true = Efficiency(linear_compute=0.66, memory=0.61, kv_memory=0.83, attention_compute=0.35,
                      step_overhead_s=2e-3, per_seq_overhead_s=1e-5, eager_launch_s=0.03)
    cost = CostModel(get_model("llama-3.1-8b"), get_gpu("h200"), 1, true)
    grid = default_grid()
    clean = [cost.step(scheduler_output(shape)).total_s for shape in grid]

    def profile(name: str, times: list[float], model: str = "llama-3.1-8b") -> str:
        points = [{**shape.describe(), "measured_s": t, "enqueue_s": t / 2}
                  for shape, t in zip(grid, times)]
        path = tmp_path / name
        path.write_text(json.dumps({"model": model, "gpu_preset": "h200-141gb",
                                    "measurements": points, "efficiency": asdict(Efficiency()),
                                    "piecewise_sizes": None}))
        return str(path)

    half = len(grid) // 2
    drifted = profile("b.json", [t * (1.3 if i >= half else 1.0) for i, t in enumerate(clean)])
    base = profile("a.json", clean)
    third = profile("c.json", clean)
    out = tmp_path / "merged.json"
    assert main(["refit", base, "--merge", drifted, third, "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["merged_from"] == [drifted, third]
    assert [m["measured_s"] for m in merged["measurements"]] == pytest.approx(clean)
    assert merged["measurements"][-1]["profiles_measured_s"] == pytest.approx(
        [clean[-1], clean[-1] * 1.3, clean[-1]])
    assert merged["fit_error"]["median_abs_rel"] < 1e-3
    capsys.readouterr()
    other_model = profile("d.json", clean, model="qwen2.5-0.5b")
    assert main(["refit", base, "--merge", other_model, "--out", str(out)]) == 2
    assert f"{other_model}: model 'qwen2.5-0.5b' differs" in capsys.readouterr().err
    short = tmp_path / "e.json"
    short.write_text(json.dumps({**json.loads((tmp_path / "a.json").read_text()),
                                 "measurements": json.loads((tmp_path / "a.json").read_text())[
                                     "measurements"][:-1]}))
    assert main(["refit", base, "--merge", str(short), "--out", str(out)]) == 2
    assert "its grid differs" in capsys.readouterr().err
    (tmp_path / "f.json").write_text("[]")
    assert main(["refit", str(tmp_path / "f.json"), "--out", str(out)]) == 2
    assert "not a calibration" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["replay", "profile"])
def test_piecewise_max_tokens_needs_the_piecewise_graphs(command, capsys):
    from gpu_backend.__main__ import main

    trace = ["--trace", "azure-conv", "--limit", "2"] if command == "replay" else []
    assert main([command, *trace, "--piecewise-max-tokens", "512"]) == 2
    assert "caps the piecewise graphs: add --piecewise-graphs" in capsys.readouterr().err
    assert main([command, *trace, "--piecewise-graphs", "--piecewise-max-tokens", "0"]) == 2
    assert "argument --piecewise-max-tokens: give 1 or more, got '0'" in capsys.readouterr().err


def test_the_profile_is_as_long_as_every_grid_steps_longest_sequence():
    """The profile's max_model_len (rotary tables, block tables) covers every row of every grid
    step: a mixed step's 30k-key decode row beside a 2k chunk included."""
    grid = default_grid()
    longest = max(max(n + p for n, p in s.prefills) if s.prefills else 0 for s in grid)
    rows = max(max(s.decodes, default=0) for s in grid)
    assert rows > longest  # a decode row is the grid's longest sequence
    assert grid_max_len(grid, 16) == rows + 16
    assert grid_max_len([mixed_shape(2048, 0, 4, 30000)], 16) == 30016
    assert grid_max_len([mixed_shape(2048, 40000, 4, 30000)], 16) == 42064


def test_refit_names_the_grid_steps_it_leaves_out(tmp_path, capsys):
    """The shipped H100 profile's two largest decodes (128 and 256 sequences of 8,192 tokens,
    3.4x and 6.7x its pool's blocks) were timed faster than the H100's 3.35 TB/s allows: the
    refit says so, and fits without them."""
    from gpu_backend.__main__ import main

    out = tmp_path / "refit.json"
    shipped = Path(__file__).resolve().parents[1] / "calibration/h100/llama-3.1-8b.json"
    assert main(["refit", str(shipped), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "(2 of 78 grid steps" in err
    assert "#30 128 x 8192 decode tokens of context: 43.8 ms" in err
    assert "#34 256 x 8192 decode tokens of context: 80.8 ms" in err
    refit = json.loads(out.read_text())
    assert refit["fit_error"]["beyond_roofline"] == [30, 34]
    # its other six steps whose KV outgrew the pool (19,470 blocks)
    assert "(6 of 78 grid steps): #26 64 x 8192 decode tokens of context: 28.6 ms" in err
    assert refit["fit_error"]["outgrew_pool"] == [26, 29, 33, 37, 47, 49]


def test_the_grid_reaches_the_engines_limits_where_they_pass_it():
    from gpu_backend.engine.profile_grid import base_grid, default_grid
    from sim.core.calibration.coverage import grid_extent

    def extent(grid):
        return grid_extent({"measurements": [shape.describe() for shape in grid]})

    base = extent(base_grid())
    assert (base.tokens, base.sequence_keys) == (16384, 30000)
    # limits inside the grid add nothing
    assert default_grid(max_step_tokens=8192, max_model_len=16384) == base_grid()
    assert default_grid(quick=True, max_step_tokens=65536) == base_grid(quick=True)
    wide = extent(default_grid(max_step_tokens=32768, max_model_len=65536))
    # the longest sequences stop 256 keys short of max_model_len (the profile's spare block)
    assert (wide.tokens, wide.sequence_keys, wide.decode_keys) == (32768, 65280, base.decode_keys)
    added = default_grid(max_step_tokens=32768, max_model_len=65536)[len(base_grid()):]
    assert [(s.kind, s.num_tokens) for s in added] == [
        ("prefill", 32768), ("prefill", 32768), ("prefill", 2048), ("mixed", 2049)]
    assert len(added[1].prefills) == 32  # prompts of 1,024 tokens filling the budget


def test_the_profiles_max_model_len_stays_within_the_one_it_was_given():
    from gpu_backend.engine.profile_grid import base_grid, default_grid, grid_max_len

    # qwen2.5-0.5b's whole context, 32,768, given as --max-model-len with a budget of 32,768:
    # the one-prompt step is 32,768 long, and a block to spare would pass the context
    at_context = default_grid(max_step_tokens=32768, max_model_len=32768)
    assert grid_max_len(at_context, 16, cap=32768) == 32768
    assert grid_max_len(at_context, 16) == 32768 + 16
    # a cap the grid fits in with its spare block, or one its longest sequence passes: no effect
    assert grid_max_len(base_grid(), 16, cap=40000) == 30016
    assert grid_max_len(base_grid(), 16, cap=20000) == 30016
