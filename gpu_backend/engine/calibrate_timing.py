"""The timing and fitting half of `python -m gpu_backend profile`: the engine a profile
times (`ProfileEngine`, which calibrate.profile_engine builds), the grid timed on it and the
cost model fitted to those timings.

`time_profile` times the grid's steps (step_timing's medians, phases and clocks, with the
host's speed beside each point) and, on their own, the attention launches of the steps with
prefill tokens, on the attention backend the steps run (`time_backend_attention`,
`backend_launch_ms`). `fit_timed` fits the cost model to those timings
(sim.core.calibration.profile_fit) and prices every grid step with the fit. Building the
engine, the provenance and the calibration file are calibrate's.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from functools import partial

import numpy as np

from gpu_backend.engine.attention_profile import (
    PagedLayer,
    attention_inputs,
    attention_records,
    attention_shapes,
    device_ms,
    time_attention,
)
from gpu_backend.engine.hostprobe import probe
from gpu_backend.engine.hostprobe import summarize as summarize_probes
from gpu_backend.engine.shapes import (
    StepShape,
    engine_step,
    scatter_tables,
    scheduler_output,
)
from gpu_backend.engine.step_timing import measure_grid, time_step, time_step_ahead
from gpu_backend.env import ClockSampler, per_step_clocks
from sim.core.calibration.attention_fit import attention_start
from sim.core.calibration.profile_fit import fit_profile, outgrew_pool, with_host_gap
from sim.core.cost_model import CostArgs, Efficiency
from sim.core.engine_config import EngineConfig


@dataclass
class ProfileEngine:
    """The engine a profile times: model, a dummy KV pool and decode graphs for a grid."""
    config: EngineConfig  # max_num_batched_tokens and max_model_len fitted to the grid
    runner: object  # gpu_backend.engine.runner.ModelRunner
    graphs: object  # its DecodeGraphs
    memory: object  # setup.measure_memory's result (activation profile, weights)
    num_blocks: int
    device: object  # torch.device
    setup: dict  # how the graphs and the pool were set up (written into the calibration)
    scatter_seed: int | None = None  # replay setup: tables scattered over the pool (seeded)

    def step(self, shape: StepShape):
        """The engine's RequestMirror and SchedulerOutput of `shape` on this pool."""
        mirror, out = engine_step(shape, self.config.block_size, self.num_blocks,
                                  self.config.model.vocab_size)
        if self.scatter_seed is not None:
            scatter_tables(mirror, self.num_blocks, self.scatter_seed)
        return mirror, out


def time_profile(engine: ProfileEngine, grid: list[StepShape], warmup: int, repeat: int,
                 passes: int, attention: bool, sample_clocks: bool = True
                 ) -> tuple[list[dict], list[dict]]:
    """The grid's steps timed on `engine` (time_step's medians and the host's speed beside
    each point), and with `attention` each prefill launch's attention alone (its records)."""
    def measure(shape: StepShape) -> dict[str, float]:
        mirror, out = engine.step(shape)
        host = probe()  # the host's speed next to this point (hostprobe)
        build = partial(mirror.build, out, engine.num_blocks)  # blocks laid over the pool
        alone = time_step(engine.runner, build, warmup, repeat)
        sampler = ClockSampler() if sample_clocks else None
        with sampler or nullcontext():  # the stream's clock and power (time_step_ahead)
            ahead = time_step_ahead(engine.runner, build, warmup, repeat)
        return {**alone, **ahead,
                **per_step_clocks(sampler.summary() if sampler else {}, warmup + repeat + 1),
                "host_probe_s": host}

    timed = measure_grid(grid, measure, passes)
    records: list[dict] = []  # the attention of every step with prefill tokens, on its own
    if attention:
        launches = attention_shapes(grid)
        backend = engine.setup["attention_backend"]
        records = attention_records(launches, measure_grid(
            launches, lambda shape: time_backend_attention(shape, engine.config.model, backend),
            passes))
    return timed, records


SPLIT_QUEUE_CYCLES = 8_000_000  # ~4 ms of GPU sleep: SPLIT enqueues a few launches per sequence


def backend_launch_ms(shape: StepShape, backend: str, num_heads: int, num_kv_heads: int,
                      head_dim: int, reps: int = 20, device: str = "cuda", dtype=None,
                      timer: Callable[..., float] = device_ms) -> float:
    """Device milliseconds of one layer's attention of `shape` as `backend` (one of
    gpu_backend.layers.ATTENTION_BACKENDS) runs it: PagedAttention's per-step plan made once,
    then its attend timed (decode rows first, then the chunks). `device`, `dtype` and
    `timer` other than the defaults: the CPU check of this path under Triton's interpreter."""
    import torch

    from gpu_backend.batch import ForwardBatch, HostLens
    from gpu_backend.layers import PagedAttention

    seq = [int(n) for n in shape.decodes] + [new + prefix for new, prefix in shape.prefills]
    new_tokens = [1] * len(shape.decodes) + [new for new, _ in shape.prefills]
    layer = PagedLayer(seq, num_kv_heads, head_dim, dtype, device=device)
    q = torch.randn(sum(new_tokens), num_heads, head_dim, device=device, dtype=layer.k.dtype)
    qsl = np.concatenate(([0], np.cumsum(new_tokens))).astype(np.int32)
    lens = np.array(seq, dtype=np.int32)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    batch = ForwardBatch(
        input_ids=empty, positions=empty, slot_mapping=empty, block_tables=layer.tables,
        seq_lens=torch.as_tensor(lens, device=device),
        query_start_loc=torch.as_tensor(qsl, device=device), logits_indices=empty,
        max_query_len=max(new_tokens), max_seq_len=max(seq), num_decodes=len(shape.decodes),
        host_lens=HostLens(qsl, lens))
    attn = PagedAttention(num_heads, num_kv_heads, head_dim, backend)  # type: ignore[arg-type]
    prepared = attn.prepare(batch, layer.k)
    many_launches = attn.runs_split(prepared) and device == "cuda"
    kwargs = {"queue_cycles": SPLIT_QUEUE_CYCLES} if many_launches else {}
    return timer(lambda: attn.attend(q, layer.k, layer.v, prepared), reps=reps, **kwargs)


def time_backend_attention(shape: StepShape, model, backend: str,
                           reps: int = 20) -> dict[str, float]:
    """`{"measured_s": ...}`: the attention of `shape` on `backend` over all of `model`'s
    layers (attention_profile.time_attention's launch on triton)."""
    if backend == "triton":
        return time_attention(shape, model, reps)
    ms = backend_launch_ms(shape, backend, model.num_attention_heads, model.num_kv_heads,
                           model.head_dim, reps)
    return {"measured_s": 1e-3 * ms * model.num_layers}


def fit_timed(engine: ProfileEngine, grid: list[StepShape], timed: list[dict],
              records: list[dict], bandwidth_bytes_s: float) -> dict:
    """The calibration's fitted part: efficiency, the grid's records with their prices, the
    fits' errors (sim.core.calibration.profile_fit)."""
    token_sizes = engine.setup["piecewise_sizes"] or ()
    outputs = [scheduler_output(shape) for shape in grid]
    cost_args = CostArgs(engine.config.model, engine.config.gpu, 1,
                         engine.setup["attention_backend"],
                         engine.setup["mixed_split_min_keys"])
    attention = attention_inputs({"attention_measurements": records})
    if attention is not None:
        attention = ([scheduler_output(s) for s in attention[0]], attention[1])
    start, hold, attention_error = attention_start(cost_args, attention, Efficiency(), ())
    efficiency, fit_error = fit_profile(
        cost_args, outputs, np.array([t["measured_s"] for t in timed]), start=start,
        copy_bandwidth_bytes_s=bandwidth_bytes_s, token_graph_sizes=token_sizes, hold=hold,
        outgrew=outgrew_pool(engine.setup, outputs))
    efficiency = with_host_gap(efficiency, timed)
    cost = cost_args.cost_model(efficiency, token_sizes)
    measurements = [{**shape.describe(), **timing, "predicted_s": cost.step(out).total_s}
                    for shape, timing, out in zip(grid, timed, outputs)]
    return {"efficiency": asdict(efficiency),
            "host_probe": summarize_probes([t["host_probe_s"] for t in timed]),
            "copy_bandwidth_bytes_s": bandwidth_bytes_s, "measurements": measurements,
            "fit_error": fit_error, "attention_measurements": records,
            "attention_fit_error": attention_error}
