"""Per-operator step-time model: what one engine step costs on one GPU of a TP group.

Each operator is a roofline: time = max(FLOPs / achieved FLOP/s, bytes / achieved bandwidth),
with achieved rates = peak x an efficiency. Operators:

    linear     q/k/v/o and MLP matmuls of all layers: 2 x params x tokens FLOPs, weights read
               once per step (small steps are weight-bandwidth bound, large ones compute bound)
    attention  prefill chunks: causal FLOPs of a chunk of c tokens on a prefix of p,
               4 x c x (p + c/2) x heads x head_dim per layer; decode: KV bytes read
    allreduce  two per layer under TP (after attention and after the MLP), ring algorithm:
               2 (tp-1)/tp x bytes / link bandwidth + a latency per call
    logits     lm_head for the rows that sample (weights read once, 2 x hidden x vocab FLOPs)
    overhead   a fixed per-step cost (scheduling, input preparation, launches) + per sequence

Default efficiencies come from DESIGN.md's H200 measurements: Llama-3.1-8B linear layers cost
0.58-0.64 us per token per layer at 512-16,384 tokens (2 x 218 M params / 0.6 us = 727 TFLOP/s,
0.73 of the 989 TFLOP/s datasheet peak) and turn weight-bound below ~256 tokens (1.0 us at 128
tokens = 436 MB in 128 us = 3.4 TB/s, 0.71 of 4.8 TB/s). A calibration JSON written by
`python -m gpu_backend profile` replaces them with values fitted on the user's GPU.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from sim.core.catalog import GpuSpec, ModelSpec
from sim.core.step import SchedulerOutput


@dataclass(frozen=True)
class Efficiency:
    linear_compute: float = 0.73  # of peak bf16 FLOP/s, large GEMMs
    memory: float = 0.71  # of HBM bandwidth, weight streaming by the linear layers
    kv_memory: float = 0.71  # of HBM bandwidth, KV streaming by decode attention (paged reads)
    attention_compute: float = 0.45  # of peak, causal prefill attention (flash-style kernels)
    interconnect: float = 0.8  # of the link bandwidth, ring all-reduce
    allreduce_latency_s: float = 8e-6  # per all-reduce call (NCCL on NVLink, small messages)
    step_overhead_s: float = 1.0e-3  # per step: scheduler, input preparation, launches
    per_seq_overhead_s: float = 4e-6  # per scheduled sequence (block tables, metadata)
    # Host time to launch a step that runs eagerly: one with prefill tokens, as engines capture
    # CUDA graphs for decode-only steps only (vLLM before piecewise graphs, this project's
    # engine). The host enqueues kernels while the device runs the earlier ones, so such a
    # step takes max(device time, this), not the sum: short chunks are launch-bound, long
    # ones compute-bound (H200, Llama-3.1-8B, torch layers: prefills of 16 to 1,024 tokens
    # all took ~42 ms). 0 where every step is graphed.
    eager_launch_s: float = 0.0
    # How much of the shorter of a linear layer's compute and weight-read times is NOT hidden
    # under the longer: 0 is the roofline (max of the two), 1 adds them. Skinny GEMMs (decode
    # batches of 8..64 rows) sit between: measured H200 decode steps grow with the batch long
    # before the roofline's compute term overtakes the weight read.
    linear_serial_fraction: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value < 0 or (f.name in ("linear_compute", "memory", "kv_memory",
                                        "attention_compute", "interconnect")
                             and not 0 < value <= 1) or (f.name == "linear_serial_fraction"
                                                         and value > 1):
                raise ValueError(f"efficiency {f.name}={value} is out of range")


@dataclass(frozen=True, slots=True)
class StepCost:
    linear_s: float
    attention_s: float
    allreduce_s: float
    logits_s: float
    overhead_s: float  # serial: scheduling, input copies, graph launch, per-sequence work
    launch_s: float = 0.0  # eager kernel launches, overlapped with the device work

    @property
    def device_s(self) -> float:
        return self.linear_s + self.attention_s + self.allreduce_s + self.logits_s

    @property
    def total_s(self) -> float:
        return max(self.device_s, self.launch_s) + self.overhead_s


def padded_batch(num_rows: int, sizes: Sequence[int]) -> int | None:
    """Smallest of `sizes` (ascending) >= num_rows, or None when the batch is larger than all."""
    for size in sizes:
        if size >= num_rows:
            return size
    return None


class CostModel:
    """Step times from the model's shape, the GPU's peak rates and the fitted efficiencies.

    `graph_sizes`: the batch sizes the engine captured decode CUDA graphs at (ascending). A
    decode-only step of n rows then runs the graph of the next size up: the padded rows cost
    their share of the linear layers and logits (not attention: their context is one token),
    and a batch larger than every size runs eagerly (its launches as a prefill's). Empty: every
    decode-only step is a graph of exactly its rows (measured on the H200, Llama-3.1-8B: 24
    rows padded to 32 took 1.9% longer, 40 padded to 48 4.3%; benchmarks/decode_gap.py).
    """

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int = 1,
                 efficiency: Efficiency | None = None, graph_sizes: Sequence[int] = ()) -> None:
        self.model, self.gpu, self.tp = model, gpu, tp
        self.eff = efficiency or Efficiency()
        self.graph_sizes = tuple(sorted(graph_sizes))
        h, vocab = model.hidden_size, model.padded_vocab_size(tp)
        self._lm_head_flops_per_row = 2.0 * h * vocab
        self._layer_flops_per_token = model.linear_flops_per_token(tp) - 2.0 * h * model.vocab_size / tp
        self._layer_weight_bytes = self._layer_flops_per_token / 2.0 * model.dtype_bytes
        self._lm_head_bytes = float(h * vocab * model.dtype_bytes)
        self._flops_s = gpu.peak_bf16_flops * self.eff.linear_compute
        self._attn_flops_s = gpu.peak_bf16_flops * self.eff.attention_compute
        self._bytes_s = gpu.memory_bandwidth_bytes_s * self.eff.memory
        self._kv_bytes_s = gpu.memory_bandwidth_bytes_s * self.eff.kv_memory
        heads = model.num_attention_heads // tp
        self._attn_flops_per_pair = 4.0 * heads * model.head_dim * model.num_layers
        self._kv_bytes_per_token = float(model.kv_bytes_per_token(tp))
        self._allreduce_bytes_per_token = float(h * model.dtype_bytes)

    # ------------------------------------------------------------- operators
    def linear_s(self, num_tokens: int) -> float:
        compute = num_tokens * self._layer_flops_per_token / self._flops_s
        weights = self._layer_weight_bytes / self._bytes_s
        return max(compute, weights) + self.eff.linear_serial_fraction * min(compute, weights)

    def prefill_attention_s(self, chunks: tuple[tuple[int, int], ...]) -> float:
        pairs = sum(c * (p + c / 2.0) for c, p in chunks)
        return pairs * self._attn_flops_per_pair / self._attn_flops_s

    def decode_attention_s(self, context_tokens: int) -> float:
        return context_tokens * self._kv_bytes_per_token / self._kv_bytes_s

    def allreduce_s(self, num_tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        ring = 2.0 * (self.tp - 1) / self.tp
        link = self.gpu.interconnect_bytes_s * self.eff.interconnect
        per_call = ring * num_tokens * self._allreduce_bytes_per_token / link
        return 2 * self.model.num_layers * (per_call + self.eff.allreduce_latency_s)

    def logits_s(self, num_rows: int) -> float:
        if num_rows == 0:
            return 0.0
        return max(num_rows * self._lm_head_flops_per_row / self._flops_s,
                   self._lm_head_bytes / self._bytes_s)

    # ----------------------------------------------------------------- steps
    def decode_rows(self, num_rows: int) -> tuple[int, bool]:
        """(rows computed, eager?) of a decode-only step of `num_rows` rows."""
        if not self.graph_sizes:
            return num_rows, False
        padded = padded_batch(num_rows, self.graph_sizes)
        return (num_rows, True) if padded is None else (padded, False)

    def decode_rows_array(self, num_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`decode_rows` of many decode-only steps at once: (rows computed, eager?)."""
        num_rows = np.asarray(num_rows, dtype=np.int64)
        if not self.graph_sizes:
            return num_rows, np.zeros(num_rows.shape, dtype=bool)
        sizes = np.asarray(self.graph_sizes, dtype=np.int64)
        index = np.searchsorted(sizes, num_rows)  # the first size >= the rows
        eager = index == len(sizes)
        return np.where(eager, num_rows, sizes[np.minimum(index, len(sizes) - 1)]), eager

    def step(self, out: SchedulerOutput) -> StepCost:
        """Cost of one step of `out` (the first step, for a decode run)."""
        num_tokens = out.num_prefill_tokens + out.num_decode_tokens
        rows, sampled, eager = num_tokens, out.num_sampled_rows, out.num_prefill_tokens > 0
        if not eager and num_tokens:
            rows, eager = self.decode_rows(num_tokens)
            sampled = rows if not eager else sampled
        attention = self.prefill_attention_s(out.prefill_chunks)
        attention += self.decode_attention_s(out.decode_context_tokens)
        return StepCost(
            linear_s=self.linear_s(rows), attention_s=attention,
            allreduce_s=self.allreduce_s(rows), logits_s=self.logits_s(sampled),
            overhead_s=self.eff.step_overhead_s + self.eff.per_seq_overhead_s * len(out.scheduled),
            launch_s=self.eff.eager_launch_s if eager else 0.0,
        )

    def decode_run_s(self, batch_size: int, context_tokens: int, num_steps: int) -> np.ndarray:
        """Durations of `num_steps` consecutive decode-only steps of `batch_size` sequences
        whose contexts sum to `context_tokens` at the first step and grow by one each step."""
        rows, eager = self.decode_rows(batch_size)
        device = self.linear_s(rows) + self.allreduce_s(rows) + self.logits_s(rows)
        contexts = context_tokens + batch_size * np.arange(num_steps, dtype=np.float64)
        attention = contexts * (self._kv_bytes_per_token / self._kv_bytes_s)
        overhead = self.eff.step_overhead_s + self.eff.per_seq_overhead_s * batch_size
        launch = self.eff.eager_launch_s if eager else 0.0  # as in StepCost.total_s
        return np.maximum(device + attention, launch) + overhead

    def migration_s(self, num_bytes: int) -> float:
        """Device-to-device copy of migrated KV blocks: read and write each byte once."""
        return 2.0 * num_bytes / self._bytes_s


# Efficiency fields fitted to measured step times: (name, bounds, typical scale). Interconnect
# and all-reduce latency stay as given: a TP-1 run cannot see them.
FIT_PARAMETERS = (
    ("linear_compute", (0.05, 1.0), 1.0),
    ("memory", (0.05, 1.0), 1.0),
    ("kv_memory", (0.05, 1.0), 1.0),
    ("attention_compute", (0.02, 1.0), 1.0),
    ("step_overhead_s", (0.0, 0.05), 1e-3),
    ("per_seq_overhead_s", (0.0, 1e-3), 1e-6),
    ("eager_launch_s", (0.0, 0.2), 1e-3),
    ("linear_serial_fraction", (0.0, 1.0), 1.0),
)


def slower(eff: Efficiency, factor: float) -> Efficiency:
    """`eff` with every step `factor` (>= 1) times as long: each rate's efficiency divided by
    it, each fixed time multiplied (what-if and sensitivity runs)."""
    if factor < 1:
        raise ValueError(f"slower() needs a factor >= 1 (efficiencies stay <= 1), got {factor}")
    return replace(eff, **{name: getattr(eff, name) / factor for name in (
        "linear_compute", "memory", "kv_memory", "attention_compute", "interconnect")},
        **{name: getattr(eff, name) * factor for name in (
            "allreduce_latency_s", "step_overhead_s", "per_seq_overhead_s", "eager_launch_s")})


HOST_TERMS = ("step_overhead_s", "per_seq_overhead_s", "eager_launch_s")


def host_slower(eff: Efficiency, factor: float) -> Efficiency:
    """`eff` on a host `factor` times slower: the per-step terms a calibration fits multiplied,
    the device's rates kept. The lent H200's host ran a fixed Python loop in 7 to 14 ms in
    different sessions, and eager steps' launch time moved with it (benchmarks/host_noise.py).
    The eager launch term is host time; the step overhead also holds per-step device time (the
    Llama-3.1-8B profile fits 1.68 ms, of which a small decode graph step's host build and
    enqueue are 0.3-0.5 ms), so for graph steps this is an upper bound."""
    if factor <= 0:
        raise ValueError(f"host_slower() needs a positive factor, got {factor}")
    return replace(eff, **{name: getattr(eff, name) * factor for name in HOST_TERMS})


def load_efficiency(path: str | Path) -> Efficiency:
    """Read a calibration JSON's "efficiency" object; unknown keys are an error, not ignored."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read calibration JSON: {exc}") from None
    values = data.get("efficiency")
    if not isinstance(values, dict):
        raise ValueError(f"{path}: no \"efficiency\" object; expected one with keys "
                         f"{', '.join(f.name for f in fields(Efficiency))}")
    known = {f.name for f in fields(Efficiency)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"{path}: unknown efficiency keys {sorted(unknown)}; known: {sorted(known)}")
    return Efficiency(**values)


def efficiency_dict(eff: Efficiency) -> dict[str, float]:
    return asdict(eff)
