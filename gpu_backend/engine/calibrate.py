"""`python -m gpu_backend profile`: time a grid of engine steps on the GPU and fit the
simulator's cost model to them.

The grid is `profile_grid.default_grid`. Each point: warm-up, then the median of several
runs timed like the engine's steps in a replay: the engine's RequestMirror builds the host
arrays -> device -> forward -> sampled ids on the host (host arrays built outside the timed
region left replays' decode steps of many sequences up to 10% above the fit, ~3.6 us per
sequence on a 2-core CPU, benchmarks/host_build.py). Each point also records the medians of
its phases as a replay's steps.csv does (`build_s`, `enqueue_s`, `device_s`:
ModelRunner.phases), which show how much of it is host time, and, launched back to back as
async scheduling runs them (`time_step_ahead`), the SM clock, power and energy per step
while they ran (`ahead_sm_clock_mhz`, `ahead_power_w`, `ahead_power_capped_share`,
`ahead_energy_j`; NaN without NVML): whether the step ran at the board's power cap.
`--replay-setup` times the grid on a replay's setup (profile_engine). The attention of
every grid step with prefill tokens is timed on its own too (`attention_profile`), and the
engine's elastic transitions (`transitions.measure_transitions`).

This module builds the engine a profile times (`profile_engine`) and assembles the
calibration; the timing of the grid and the fit to it are `calibrate_timing`'s. Both need
torch; the file format, its checks, the fits and the provenance every profile records live
in `sim.core.calibration`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from gpu_backend.engine.attention_profile import attention_inputs
from gpu_backend.engine.calibrate_timing import ProfileEngine, fit_timed, time_profile
from gpu_backend.engine.profile_grid import default_grid, grid_max_len
from gpu_backend.engine.shapes import StepShape, blocks_needed, scheduler_output
from gpu_backend.engine.transitions import measure_transitions
from gpu_backend.env import versions
from sim.core.calibration import (
    EngineKind,
    Provenance,
    invoked_command,
    parse_calibration,
    profile_provenance,
    save_calibration,
)
from sim.core.calibration.merge import merge_profiles
from sim.core.calibration.profile_fit import refit_profile
from sim.core.calibration.records import check_fit_records
from sim.core.cost_model import piecewise_sizes_for
from sim.core.engine_config import EngineConfig
from sim.recording.folder import atomic_path

# `python -m gpu_backend refit --merge` merges through this module
__all__ = ["calibrate", "merge_profiles", "refit_calibration", "write_calibration"]


REPLAY_POOL_SHARE = 0.6  # of free memory, for the replay setup's pool


def profile_engine(config: EngineConfig, grid: list[StepShape], seed: int = 0,
                   min_blocks: int = 0, replay_setup: bool = False,
                   piecewise: bool = False, piecewise_max_tokens: int | None = None,
                   attention_backend: str = "triton") -> ProfileEngine:
    """Build the model, a KV pool and decode graphs for `grid` on the current CUDA device.

    Default: a pool big enough for the grid's largest step and `min_blocks` (at most 60% of
    free memory), each sequence's blocks side by side, and one decode graph per decode batch
    size of the grid (exact sizes, tables as wide as the grid's longest sequence).
    `replay_setup`: as a replay runs its steps: the graphs of capture_sizes(max_num_seqs) (a
    batch runs padded to the next size up), tables `config`'s max_model_len wide, a pool over
    60% of free memory and every step's blocks scattered over it at random (seeded).
    `piecewise`: steps with prefill tokens replay piecewise graphs captured at the sizes a
    replay of `config`'s chunk captures, up to `piecewise_max_tokens` when given (a larger
    grid step runs fully eager, as it would there: the fit then sees both launch terms).
    `attention_backend`: the model's (gpu_backend.layers.ATTENTION_BACKENDS but torch).
    """
    import torch

    from gpu_backend.engine.memory import dummy_store, kv_caches_of
    from gpu_backend.engine.runner import ModelRunner
    from gpu_backend.engine.setup import measure_memory

    device = torch.device("cuda", torch.cuda.current_device())
    config, table_len, piecewise_tokens = _fitted_config(config, grid, replay_setup, piecewise,
                                                         piecewise_max_tokens)
    # the piecewise graphs' memory counted as a replay counts it (the calibration's
    # activation profile is what the simulator plans the KV pool with)
    model, m = measure_memory(config, device, seed, use_graphs=True,
                              piecewise_tokens=piecewise_tokens,
                              attention_backend=attention_backend)
    num_blocks = _pool_blocks(config, grid, device, min_blocks, replay_setup)
    store = dummy_store(config.model, num_blocks, config.block_size, device)
    caches = kv_caches_of(store, config.model.num_layers)
    graphs, pieces, sizes = _capture_graphs(model, caches, config, grid, table_len, device,
                                            replay_setup, piecewise_tokens)
    runner = ModelRunner(model, caches, device, graphs, pieces)
    setup = _setup_record(config, replay_setup, sizes, table_len, num_blocks, pieces,
                          attention_backend)
    return ProfileEngine(config, runner, graphs, m, num_blocks, device, setup,
                         seed if replay_setup else None)


def _fitted_config(config: EngineConfig, grid: list[StepShape], replay_setup: bool,
                   piecewise: bool, piecewise_max_tokens: int | None
                   ) -> tuple[EngineConfig, int, int | None]:
    """`config` with max_num_batched_tokens and max_model_len fitted to `grid`; the decode
    graphs' table width in tokens (at least `config`'s effective max_model_len with
    `replay_setup`); the largest piecewise graph's tokens (None without `piecewise`)."""
    max_prefill = max(s.num_tokens for s in grid if s.kind == "prefill")
    # the replay's piecewise graphs: up to its chunk (before the grid's own token budget
    # replaces it), or to the cap
    piecewise_tokens = (max(piecewise_sizes_for(config.chunk_tokens, piecewise_max_tokens))
                        if piecewise else None)
    max_len = grid_max_len(grid, config.block_size, config.max_model_len)
    table_len = max(max_len, config.memory_config().effective_max_model_len) \
        if replay_setup else max_len
    config = config.with_(max_num_batched_tokens=max_prefill, max_model_len=max_len)
    return config, table_len, piecewise_tokens


def _capture_graphs(model, caches, config: EngineConfig, grid: list[StepShape],
                    table_len: int, device, replay_setup: bool,
                    piecewise_tokens: int | None) -> tuple[object, object, list[int]]:
    """The profile's decode graphs, captured: one per decode batch size of `grid` (and of
    capture_sizes(max_num_seqs) with `replay_setup`), tables `table_len` tokens wide; the
    piecewise graphs up to `piecewise_tokens`, captured (None when it is None); the decode
    graphs' sizes."""
    from gpu_backend.engine.graphs import capture_sizes
    from gpu_backend.engine.piecewise import PiecewiseGraphs
    from gpu_backend.engine.runner import DecodeGraphs

    sizes = sorted({len(s.decodes) for s in grid if s.kind == "decode"})
    if replay_setup:
        sizes = sorted(set(capture_sizes(config.num_seqs)) | set(sizes))
    graphs = DecodeGraphs(model, caches, sizes[-1], table_len, config.block_size, device, sizes)
    graphs.capture()
    pieces = None
    if piecewise_tokens is not None:
        pieces = PiecewiseGraphs(model, caches, piecewise_tokens, device)
        pieces.capture()
    return graphs, pieces, sizes


def _pool_blocks(config: EngineConfig, grid: list[StepShape], device, min_blocks: int,
                 replay_setup: bool) -> int:
    """The profile's KV pool in blocks: the grid's largest step and `min_blocks`, or a
    replay's share of free memory (`replay_setup`), never more than that share."""
    import torch

    block_bytes = config.block_size * config.model.kv_bytes_per_token()
    free, _ = torch.cuda.mem_get_info(device)
    want = max(max(blocks_needed(s, config.block_size) for s in grid) + 1, min_blocks)
    if replay_setup:
        want = max(want, int(REPLAY_POOL_SHARE * free // block_bytes))
    return int(min(want, REPLAY_POOL_SHARE * free // block_bytes))


def _setup_record(config: EngineConfig, replay_setup: bool, sizes: list[int], table_len: int,
                  num_blocks: int, pieces, attention_backend: str) -> dict:
    """The calibration's "setup": how the profile laid its pool, graphs and attention."""
    return {"replay_setup": replay_setup, "graph_sizes": list(sizes), "table_tokens": table_len,
            "block_size": config.block_size,
            "pool_blocks": num_blocks,
            # a step that outgrows the pool: each row's blocks at random (shapes.pool_tables)
            "blocks": ("scattered" if replay_setup else "side by side")
            + "; rows at random where a step outgrows the pool",
            "piecewise_sizes": list(pieces.sizes) if pieces is not None else None,
            "piecewise_capture_s": pieces.capture_s if pieces is not None else None,
            "attention_backend": attention_backend,
            # a mixed step's decode rows ran apart from this many keys (0: one launch)
            "mixed_split_min_keys": config.mixed_split_min_keys}


def calibrate(config: EngineConfig, *, seed: int = 0, quick: bool = False,
              warmup: int = 2, repeat: int = 5, replay_setup: bool = False,
              piecewise: bool = False, passes: int = 2,
              piecewise_max_tokens: int | None = None, attention: bool = True,
              attention_backend: str = "triton", command: str | None = None,
              sample_clocks: bool = True) -> dict:
    """Profile `config`'s engine on the step grid and fit the cost model (module docstring);
    `attention`: also time each prefill launch's attention alone (attention_profile), on
    `attention_backend` as the steps run it. `sample_clocks`: read the SM clock, power and
    energy while each step runs back to back (`per_step_clocks`; NaN when False).
    `command`: what the provenance records as the measuring command (default: this
    process's command line)."""
    from gpu_backend.env import copy_bandwidth_bytes_s

    measured_on = datetime.now(timezone.utc).date().isoformat()
    grid = default_grid(quick, config.max_num_batched_tokens, config.max_model_len)
    engine = profile_engine(config, grid, seed, replay_setup=replay_setup, piecewise=piecewise,
                            piecewise_max_tokens=piecewise_max_tokens,
                            attention_backend=attention_backend)
    timed, records = time_profile(engine, grid, warmup, repeat, passes, attention,
                                  sample_clocks)
    result = fit_timed(engine, grid, timed, records, copy_bandwidth_bytes_s())
    found = versions()
    provenance = _provenance(config, engine, measured_on, command, found)
    return {
        "gpu": provenance.gpu_name, "gpu_preset": config.gpu.name, "model": config.model.name,
        "versions": found, "provenance": provenance.to_dict(), **result,
        "attention_backend": attention_backend, **_memory_record(engine.memory),
        "graph_capture_s": engine.graphs.capture_s,
        "setup": engine.setup, "passes": passes,
        # the piecewise graphs' token sizes the eager steps ran at (None: fully eager)
        "piecewise_sizes": engine.setup["piecewise_sizes"],
        "vmm": measure_transitions(engine.runner, engine.config, engine.device,
                                   engine.num_blocks),
    }


def _provenance(config: EngineConfig, engine: ProfileEngine, measured_on: str,
                command: str | None, found: dict) -> Provenance:
    """The profile's provenance (sim.core.calibration.profile_provenance): the model, GPU and
    engine it timed, when, by which command (default: this process's command line) and with
    which `found` versions."""
    import torch

    return profile_provenance(
        model=config.model.name, gpu_preset=config.gpu.name,
        gpu_name=torch.cuda.get_device_name(engine.device),
        engine=EngineKind.of_run(engine.setup["piecewise_sizes"] or (), config.chunk_tokens),
        measured_on=measured_on, command=command or invoked_command(), versions=found)


def _memory_record(memory) -> dict:
    """The calibration's part of `memory` (setup.measure_memory's MemoryMeasurement): the
    activation profile, the activation peaks by token count and the weights' bytes."""
    profile = memory.profile
    return {"activation": {"bytes_per_token": profile.bytes_per_token,
                           "fixed_bytes": profile.fixed_bytes,
                           "non_torch_bytes": profile.non_torch_bytes},
            "activation_peaks": {str(k): v for k, v in memory.activation_peaks.items()},
            "weights_bytes": memory.weights_bytes}


def refit_calibration(data: dict, copy_bandwidth_bytes_s: float | None = None,
                      program_from: tuple[str, dict] | None = None,
                      attention_from: tuple[str, dict] | None = None,
                      source: str = "the calibration to refit") -> dict:
    """`sim.core.calibration.profile_fit.refit_profile` of a calibration's stored grid: its
    records made the steps the cost model prices (no GPU needed). The provenance keeps the
    measurement's and records this command as the one that fitted it. `source` names the
    calibration in the errors its records get (`check_fit_records`)."""
    check_fit_records(data, source)
    provenance = parse_calibration(data, source).provenance
    outputs = [scheduler_output(StepShape.from_record(m)) for m in data["measurements"]]
    attention = attention_inputs(data)
    if attention is not None:
        attention = ([scheduler_output(s) for s in attention[0]], attention[1])
    result = refit_profile(data, outputs, attention, copy_bandwidth_bytes_s, program_from,
                           attention_from)
    fitted = replace(provenance, fitted_by=invoked_command())
    return {**result, "provenance": fitted.to_dict()}


def write_calibration(path: Path, result: dict) -> None:
    """Check `result` as a calibration and write it (sim.core.calibration.save_calibration)
    beside `path` first, then into its place: an interrupted write leaves the file it
    replaces (refit's input, by default) whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as part:
        save_calibration(part, result, source=str(path))  # errors name the file meant
