"""The attention of the profile's prefill and mixed steps, timed on its own.

A whole step's time holds its linear layers and its attention; a fit of whole steps alone
cannot tell them apart where both grow with the chunk, and on the H200 it did not: with
Llama-3.1-8B's profile the Mooncake replays' chunk-2,048 steps, their attention timed alone
(benchmarks/replay_attention.py), ran 23-45% over the fitted attention while the whole steps
came out within 7%, the linear layers priced long by as much. So `python -m gpu_backend
profile` also times one layer's attention launch of every grid step with prefill tokens, as the
engine launches it (decode rows first, then each chunk, one eager launch over paged K/V in
shuffled blocks), on the device alone (`device_ms`), and fits the attention's own terms
(`ATTENTION_PARAMETERS`) to those times first; the whole-step fit then holds them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from scipy.optimize import minimize_scalar

from gpu_backend.engine.shapes import StepShape, scheduler_output
from sim.core.calibration import fit_with_program_term, num_program_bound
from sim.core.cost_model import FIT_PARAMETERS, CostModel, Efficiency

# What one launch's attention time tells: its work rate, the speed of one program (the
# longest binds a chunk beside long decode rows) and how much of the shorter of the two the
# longer does not hide (CostModel.launch_attention_s).
ATTENTION_PARAMETERS = ("attention_compute", "attention_program", "attention_program_serial")
QUEUE_AHEAD_CYCLES = 1_000_000  # ~0.5 ms of GPU sleep before each timed call
BLOCK_SIZE = 16  # the K/V blocks' tokens (the kernel walks keys through the table alike)


def attention_shapes(grid: Sequence[StepShape]) -> list[StepShape]:
    """The shapes of `grid` whose attention runs the prefill kernel (prefill tokens in it)."""
    return [s for s in grid if s.prefills]


def device_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Median device milliseconds of fn(), timed with CUDA events. A GPU-side sleep is queued
    before each timed launch so the host has enqueued the whole call before the start event
    fires: device time, free of Python launch overhead (the cost model prices launches
    apart)."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


class PagedLayer:
    """One layer's paged K/V for sequences of `lengths` keys, blocks shuffled over the pool
    (random values: the kernel's time does not depend on them)."""

    def __init__(self, lengths: Sequence[int], num_kv_heads: int, head_dim: int,
                 dtype=None, block_size: int = BLOCK_SIZE, device: str = "cuda") -> None:
        import torch

        dtype = dtype or torch.bfloat16
        blocks = [-(-int(n) // block_size) for n in lengths]
        total = sum(blocks)
        self.k = torch.randn(total, block_size, num_kv_heads, head_dim, device=device,
                             dtype=dtype)
        self.v = torch.randn_like(self.k)
        perm = torch.randperm(total, device=device).int()
        self.tables = torch.zeros(len(blocks), max(blocks), dtype=torch.int32, device=device)
        used = 0
        for i, n in enumerate(blocks):
            self.tables[i, :n] = perm[used:used + n]
            used += n


def launch_ms(shape: StepShape, num_heads: int, num_kv_heads: int, head_dim: int,
              reps: int = 20, device: str = "cuda", dtype=None,
              timer: Callable[..., float] = device_ms) -> float:
    """Device milliseconds of one layer's attention of `shape`: decode rows first, then each
    chunk over its prefix, one eager launch (and its combine kernel where it splits).
    `timer(fn, reps=...)` times the launch (`device`, `dtype` and `timer` other than the
    defaults: the CPU check of this path under Triton's interpreter)."""
    import torch

    from gpu_backend.kernels import paged_attention

    seq = [int(n) for n in shape.decodes] + [new + prefix for new, prefix in shape.prefills]
    new_tokens = [1] * len(shape.decodes) + [new for new, _ in shape.prefills]
    layer = PagedLayer(seq, num_kv_heads, head_dim, dtype, device=device)
    q = torch.randn(sum(new_tokens), num_heads, head_dim, device=device, dtype=layer.k.dtype)
    seq_lens = torch.tensor(seq, dtype=torch.int32, device=device)
    qsl = torch.tensor(np.concatenate(([0], np.cumsum(new_tokens))), dtype=torch.int32,
                       device=device)
    return timer(lambda: paged_attention(q, layer.k, layer.v, layer.tables, seq_lens, qsl,
                                         head_dim ** -0.5, max_query_len=max(new_tokens),
                                         max_seq_len=max(seq)), reps=reps)


def time_attention(shape: StepShape, model, reps: int = 20) -> dict[str, float]:
    """`{"measured_s": ...}`: the attention of `shape` over all of `model`'s layers (one layer
    timed, times the layer count: every layer launches the same kernel on the same shapes)."""
    ms = launch_ms(shape, model.num_attention_heads, model.num_kv_heads, model.head_dim, reps)
    return {"measured_s": 1e-3 * ms * model.num_layers}


def fit_attention(cost_args: tuple, shapes: Sequence[StepShape], measured_s: np.ndarray,
                  start: Efficiency | None = None,
                  hold: Sequence[str] = ()) -> tuple[Efficiency, dict]:
    """`start` with ATTENTION_PARAMETERS fitted to the attention times `measured_s` of
    `shapes` (CostModel.step's attention_s against them, least squares on relative error;
    the program's terms only where the steps tell them, `fit_with_program_term`), and the
    fit's errors and the launch's fixed device time fitted beside them (`launch_floor_s`, not a
    cost-model term). `hold`: terms kept at `start`'s values (attention_program taken from
    another profile, `python -m gpu_backend refit --program-from`)."""
    start = start or Efficiency()
    outputs = [scheduler_output(s) for s in shapes]
    measured_s = np.asarray(measured_s, dtype=np.float64)
    if len(outputs) != len(measured_s) or not len(outputs):
        raise ValueError(f"{len(measured_s)} attention times for {len(outputs)} shapes")

    def times(eff: Efficiency) -> np.ndarray:
        cost = CostModel(*cost_args, efficiency=eff)
        return np.array([cost.step(o).attention_s for o in outputs])

    def num_bound(eff: Efficiency) -> int:
        return num_program_bound(times(eff), times(replace(eff, attention_program=None)))

    fixed = (*(name for name, _, _ in FIT_PARAMETERS if name not in ATTENTION_PARAMETERS),
             *hold)

    def fit_at(floor: float) -> tuple[Efficiency, np.ndarray]:
        fitted, _ = fit_with_program_term(
            start, lambda e: (times(e) + floor) / measured_s - 1.0, num_bound, fixed,
            x_scale="jac")
        return fitted, (times(fitted) + floor) / measured_s - 1.0

    # A launch's fixed device time (kernel start, the combine, over all layers): the whole-step
    # fit prices it in its per-step terms; fitted here beside the rates, or the smallest
    # launches (16-token prefills: a few us of work, tens of us timed) would set them.
    best = minimize_scalar(lambda floor: float(np.sum(fit_at(floor)[1] ** 2)),
                           bounds=(0.0, float(measured_s.min())), method="bounded",
                           options={"xatol": 1e-4 * float(measured_s.min())})
    floor = float(best.x)
    fitted, after = fit_at(floor)
    return fitted, {"median_abs_rel": float(np.median(np.abs(after))),
                    "max_abs_rel": float(np.max(np.abs(after))),
                    "launch_floor_s": floor, "per_point_rel": [float(r) for r in after]}


def attention_records(shapes: Sequence[StepShape], timed: Sequence[dict]) -> list[dict]:
    """The calibration's "attention_measurements": each shape's record and its timing."""
    return [{**shape.describe(), **timing} for shape, timing in zip(shapes, timed)]


def attention_inputs(data: dict) -> tuple[list[StepShape], np.ndarray] | None:
    """(shapes, attention seconds) of a calibration's "attention_measurements"; None where it
    has none (profiles from before 2026-11-30's ninth session)."""
    records = data.get("attention_measurements")
    if not records:
        return None
    return ([StepShape.from_record(r) for r in records],
            np.array([float(r["measured_s"]) for r in records]))
