"""The attention of the profile's prefill and mixed steps, timed on its own.

A whole step's time holds its linear layers and its attention; a fit of whole steps alone
cannot tell them apart where both grow with the chunk, and on the H200 it did not: with
Llama-3.1-8B's profile the Mooncake replays' chunk-2,048 steps, their attention timed alone
(benchmarks/replay_attention.py), ran 23-45% over the fitted attention while the whole steps
came out within 7%, the linear layers priced long by as much. So `python -m gpu_backend
profile` also times one layer's attention launch of every grid step with prefill tokens, as the
engine launches it (decode rows first, then each chunk, one eager launch over paged K/V in
shuffled blocks), on the device alone (`device_ms`). The attention's own terms
(`ATTENTION_PARAMETERS`) are fitted to those times first and the whole-step fit holds them
(`sim.core.calibration.attention_fit`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gpu_backend.engine.shapes import StepShape, scheduler_output
from sim.core.calibration.attention_fit import ATTENTION_PARAMETERS, fit_attention_terms
from sim.core.cost_model import CostArgs, Efficiency

__all__ = ["ATTENTION_PARAMETERS", "PagedLayer", "attention_inputs", "attention_records",
           "attention_shapes", "device_ms", "fit_attention", "launch_ms", "time_attention"]

QUEUE_AHEAD_CYCLES = 1_000_000  # ~0.5 ms of GPU sleep before each timed call
BLOCK_SIZE = 16  # the K/V blocks' tokens (the kernel walks keys through the table alike)


def attention_shapes(grid: Sequence[StepShape]) -> list[StepShape]:
    """The shapes of `grid` whose attention runs the prefill kernel (prefill tokens in it)."""
    return [s for s in grid if s.prefills]


def device_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3,
              queue_cycles: int = QUEUE_AHEAD_CYCLES) -> float:
    """Median device milliseconds of fn(), timed with CUDA events. A GPU-side sleep of
    `queue_cycles` is queued before each timed launch so the host has enqueued the whole call
    before the start event fires: device time, free of Python launch overhead (the cost model
    prices launches apart). A call of many launches needs a longer sleep."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(queue_cycles)
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


def fit_attention(cost_args: CostArgs, shapes: Sequence[StepShape], measured_s: np.ndarray,
                  start: Efficiency | None = None,
                  hold: Sequence[str] = ()) -> tuple[Efficiency, dict]:
    """`sim.core.calibration.attention_fit.fit_attention_terms` of the launches of `shapes`
    timed alone (`measured_s`): the attention's terms fitted, the rest of `start` kept."""
    return fit_attention_terms(cost_args, [scheduler_output(s) for s in shapes], measured_s,
                               start, hold)


def attention_records(shapes: Sequence[StepShape], timed: Sequence[dict]) -> list[dict]:
    """The calibration's "attention_measurements": each shape's record and its timing."""
    return [{**shape.describe(), **timing} for shape, timing in zip(shapes, timed)]


def attention_inputs(data: dict) -> tuple[list[StepShape], np.ndarray] | None:
    """(shapes, attention seconds) of a calibration's "attention_measurements"; None where it
    has none (a profile taken with --no-attention-profile, or before the attention was timed
    alone)."""
    records = data.get("attention_measurements")
    if not records:
        return None
    return ([StepShape.from_record(r) for r in records],
            np.array([float(r["measured_s"]) for r in records]))
