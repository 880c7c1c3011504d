"""Per-operator step-time model: what one engine step costs on one GPU of a TP group.

Each operator is a roofline: time = max(FLOPs / achieved FLOP/s, bytes / achieved bandwidth),
with achieved rates = peak x an efficiency. Operators:

    linear     q/k/v/o and MLP matmuls of all layers: 2 x params x tokens FLOPs, weights read
               once per step (small steps are weight-bandwidth bound, large ones compute bound)
    attention  prefill chunks: causal FLOPs of a chunk of c tokens on a prefix of p,
               4 x c x (p + c/2) x heads x head_dim per layer, and a fixed time per new
               token, KV head and layer; decode: KV bytes read; a decode row beside a
               chunk: its 128-row tile's FLOPs over its keys at a rate of their own (below),
               or, where the decode rows run apart (EngineConfig.mixed_split_bytes), their
               reads and two more launches per layer.
               A step that runs SPLIT (attention backends split, auto): its SPLIT
               sequences' padded SDPA products and calls, the rest as the Triton paged
               kernel's prefill, the decode rows as reads (OperatorCosts.split_chunks).
               On flashinfer the prefill rows are priced in the Triton kernel's form (its
               own profile fits the rates) and a mixed step's decode rows always run apart
    allreduce  two per layer under TP (after attention and after the MLP), ring algorithm:
               2 (tp-1)/tp x bytes / link bandwidth + a latency per call
    logits     lm_head for the rows that sample (weights read once, 2 x hidden x vocab FLOPs)
    overhead   a fixed per-step cost (scheduling, input preparation, launches) + per sequence

A step's time is its device's busy time (the longer of its device work and its eager
launches, plus the share of the shorter that does not overlap) plus the overhead. The fitted
overhead holds per-step device time as well as the host's; what a synchronous engine's host
keeps the device idle each step (input build and copy, the ids read back) is measured apart
(`Efficiency.host_gap_s`: a profile's step time less its device span). Under async scheduling
(EngineConfig.async_scheduling) the host does that work while the step before runs, so the
overhead loses it; and the step's eager launches go out while the step before runs too, so no
share of the shorter of its device work and its launches is left serial: a step launched ahead
is busy for the longer of the two (`step_total_s`). A decode-only step, a graph replayed, loses
what the profile's small decode steps shed launched back to back instead
(`Efficiency.decode_host_gap_s`): inside a synchronous one the device also waits on the launch.

The efficiencies behind the achieved rates, their defaults and what-if variants live in
`sim.core.efficiency`; how a step launches (attention splits, CUDA graph padding) in
`sim.core.launch_shapes`. Callers may import them from here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from sim.core.catalog import GpuSpec, ModelSpec
from sim.core.efficiency import (
    FIT_PARAMETERS,
    HOST_TERMS,
    SERIAL_FRACTIONS,
    Efficiency,
    efficiency_dict,
    host_slower,
    slower,
)
from sim.core.launch_shapes import (
    APART_LAUNCHES,
    ATTENTION_TILE_ROWS,
    MAX_NUM_SPLITS,
    MIN_KEYS_PER_SPLIT,
    SPLIT_TARGET_WAVES,
    attention_num_splits,
    attention_num_splits_array,
    padded_batch,
    padded_batch_array,
    piecewise_capture_sizes,
    piecewise_sizes_for,
    step_extents,
)
from sim.core.operator_costs import OperatorCosts
from sim.core.split_shapes import FLASHINFER_ATTENTION
from sim.core.step import SchedulerOutput

if TYPE_CHECKING:
    from sim.core.engine_config import EngineConfig

__all__ = [
    "APART_LAUNCHES", "ATTENTION_TILE_ROWS", "FIT_PARAMETERS", "HOST_TERMS", "MAX_NUM_SPLITS",
    "MIN_KEYS_PER_SPLIT", "SERIAL_FRACTIONS", "SPLIT_TARGET_WAVES", "CostArgs", "CostModel",
    "Efficiency", "OperatorCosts", "StepCost", "attention_num_splits", "attention_num_splits_array",
    "efficiency_dict", "host_slower", "padded_batch", "padded_batch_array",
    "piecewise_capture_sizes", "piecewise_sizes_for", "slower", "step_extents",
    "step_total_array", "step_total_s",
]


def step_total_s(device: float, launch: float, fraction: float, overhead: float,
                 hidden_s: float = 0.0) -> float:
    """A step's seconds from its device work, eager launch time, the launches' serial
    fraction and its overhead; `hidden_s`: the host time async scheduling hides behind the
    step before (`Efficiency.host_gap_s`; 0 for a synchronous engine or a step with none in
    flight before it), taken off the overhead. A step launched so is busy for the longer of
    its device work and its launches, with no serial share (module docstring)."""
    longer, shorter = (device, launch) if device > launch else (launch, device)
    if hidden_s > 0:
        return longer + (overhead - hidden_s if overhead > hidden_s else 0.0)
    return longer + fraction * shorter + overhead


def step_total_array(device: np.ndarray, launch: np.ndarray | float, fraction: float,
                     *overheads: np.ndarray | float, hidden_s: float = 0.0) -> np.ndarray:
    """`step_total_s` of many steps at once, the overhead given as terms added in order."""
    if hidden_s <= 0:
        total = np.maximum(device, launch) + fraction * np.minimum(device, launch)
        for overhead in overheads:
            total = total + overhead
        return total
    overhead_sum: np.ndarray | float = 0.0
    for overhead in overheads:
        overhead_sum = overhead_sum + overhead
    return np.maximum(device, launch) + np.maximum(np.subtract(overhead_sum, hidden_s), 0.0)


@dataclass(frozen=True, slots=True)
class StepCost:
    linear_s: float
    attention_s: float
    allreduce_s: float
    logits_s: float
    overhead_s: float  # serial: scheduling, input copies, graph launch, per-sequence work
    launch_s: float = 0.0  # eager kernel launches, overlapped with the device work
    launch_serial_fraction: float = 0.0  # Efficiency.launch_serial_fraction
    hidden_s: float = 0.0  # async scheduling: the host time hidden behind the step before

    @property
    def device_s(self) -> float:
        return self.linear_s + self.attention_s + self.allreduce_s + self.logits_s

    @property
    def total_s(self) -> float:
        return step_total_s(self.device_s, self.launch_s, self.launch_serial_fraction,
                            self.overhead_s, self.hidden_s)


class CostArgs(NamedTuple):
    """What a fit prices every candidate efficiency with: model, GPU, tensor-parallel size,
    the engine's attention backend, its mixed split, its decode graph sizes and whether it
    schedules asynchronously (`CostModel.for_engine` builds from these, so a fit prices a
    step as the simulator does)."""
    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    attention_backend: str = "triton"
    mixed_split_min_keys: int = 0  # EngineConfig.mixed_split_min_keys the steps ran with
    # EngineConfig.cuda_graph_sizes; empty: every decode step priced at its own size (a
    # profile's grid captures a graph at each decode batch it times)
    graph_sizes: tuple[int, ...] = ()
    # EngineConfig.async_scheduling: each step's overhead loses the host gap (CostModel's
    # `host_hidden`); False for a profile, whose grid times every step synchronously
    host_hidden: bool = False

    @classmethod
    def for_engine(cls, engine: EngineConfig) -> CostArgs:
        return cls(engine.model, engine.gpu, engine.tensor_parallel_size,
                   engine.attention_backend, engine.mixed_split_min_keys,
                   tuple(engine.cuda_graph_sizes), engine.async_scheduling)

    def cost_model(self, efficiency: Efficiency | None,
                   token_graph_sizes: Sequence[int] = ()) -> CostModel:
        return CostModel(self.model, self.gpu, self.tp, efficiency, self.graph_sizes,
                         token_graph_sizes=token_graph_sizes,
                         attention_backend=self.attention_backend,
                         host_hidden=self.host_hidden,
                         mixed_split_min_keys=self.mixed_split_min_keys)


class CostModel(OperatorCosts):
    """Step times from the model's shape, the GPU's peak rates and the fitted efficiencies.

    `graph_sizes`: the batch sizes the engine captured decode CUDA graphs at (ascending). A
    decode-only step of n rows then runs the graph of the next size up: the padded rows cost
    their share of the linear layers and logits (not attention: their context is one token),
    and a batch larger than every size runs eagerly (its launches as a prefill's). Empty: every
    decode-only step is a graph of exactly its rows (measured on the H200, Llama-3.1-8B: 24
    rows padded to 32 took 1.9% longer, 40 padded to 48 4.3%; benchmarks/decode_gap.py).

    `token_graph_sizes`: the token counts the engine captured piecewise CUDA graphs at for
    steps that run no decode graph (ascending; `piecewise_capture_sizes` of the chunk, or of a
    smaller cap). A step of T tokens then runs the graphs of the next size up: its linear
    layers and all-reduces compute the padded count, while attention runs eagerly on the T
    real tokens between the pieces and lm_head on the rows that sample; its launch term is
    `piecewise_launch_s`. Beyond the largest size the step runs fully eager: unpadded, with
    `eager_launch_s`. Empty: every such step runs fully eager.

    `host_hidden`: the engine schedules asynchronously (EngineConfig.async_scheduling), so
    each step's overhead loses the host gap (`Efficiency.host_gap_s`, `step_total_s`; a
    decode-only step's, `Efficiency.decode_host_gap_s`).
    """

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int = 1,
                 efficiency: Efficiency | None = None, graph_sizes: Sequence[int] = (),
                 token_graph_sizes: Sequence[int] = (), attention_backend: str = "triton",
                 host_hidden: bool = False, mixed_split_min_keys: int = 0) -> None:
        super().__init__(model, gpu, tp, efficiency, attention_backend)
        self.mixed_split_min_keys = mixed_split_min_keys
        self.hidden_s = self.eff.host_gap_s if host_hidden else 0.0  # step_total_s's
        # what a decode-only step hides (Efficiency.decode_host_gap_s)
        decode_gap = self.eff.decode_host_gap_s
        self.decode_hidden_s = (self.hidden_s if decode_gap is None or not host_hidden
                                else decode_gap)
        # whether any step hides host time (one with none in flight before it hides none)
        self.hides_host = self.hidden_s > 0 or self.decode_hidden_s > 0
        self.graph_sizes = tuple(sorted(graph_sizes))
        self.token_graph_sizes = tuple(sorted(token_graph_sizes))
        self._decode_terms: dict[int, tuple[float, float, float, float, float]] = {}

    @classmethod
    def for_engine(cls, engine: EngineConfig, efficiency: Efficiency | None = None) -> CostModel:
        """The cost model of an engine configuration: its model, GPU and TP size, its CUDA
        graph sizes, its attention backend and whether it schedules asynchronously: the
        `CostArgs.for_engine` a fit prices with, at the engine's piecewise graph sizes."""
        return CostArgs.for_engine(engine).cost_model(efficiency, engine.piecewise_graph_sizes)

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
        return padded_batch_array(num_rows, self.graph_sizes)

    def eager_step(self, num_tokens: int) -> tuple[int, float]:
        """(tokens the linear layers and all-reduces compute, launch time) of a step of
        `num_tokens` tokens that runs no decode graph (one with prefill tokens, or a decode
        batch beyond every decode graph): the piecewise graphs of the next size up when one
        holds it, else every kernel launched eagerly on exactly its tokens."""
        padded = padded_batch(num_tokens, self.token_graph_sizes)
        if padded is None:
            return num_tokens, self.eff.eager_launch_s
        return padded, self.eff.piecewise_launch

    def eager_step_array(self, num_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`eager_step` of many steps at once: (tokens computed, runs piecewise graphs?)."""
        num_tokens = np.asarray(num_tokens, dtype=np.int64)
        if not self.token_graph_sizes:
            return num_tokens, np.zeros(num_tokens.shape, dtype=bool)
        padded, beyond = padded_batch_array(num_tokens, self.token_graph_sizes)
        return padded, ~beyond

    def prefill_tokens(self, num_tokens: int) -> int:
        """Tokens the linear layers and all-reduces compute in a step of `num_tokens` tokens
        with prefill among them (`eager_step`)."""
        return self.eager_step(num_tokens)[0]

    def step(self, out: SchedulerOutput) -> StepCost:
        """Cost of one step of `out` (the first step, for a decode run)."""
        num_tokens = out.num_prefill_tokens + out.num_decode_tokens
        rows, sampled, eager = num_tokens, out.num_sampled_rows, out.num_prefill_tokens > 0
        if num_tokens and not eager:
            rows, eager = self.decode_rows(num_tokens)
            sampled = rows if not eager else sampled
        launch = 0.0
        if eager:  # no decode graph: piecewise graphs where a size holds the step, else eager
            rows, launch = self.eager_step(num_tokens)
        split = self.split_chunks(out.prefill_chunks) if out.num_prefill_tokens else None
        apart = split is None and out.num_prefill_tokens > 0 and self.runs_apart(
            out.decode_context_tokens)
        decode = 0.0  # the decode rows' own launch, where they run apart
        if split is not None:  # SPLIT's sequences, the rest on the Triton paths
            attention = self.split_step_attention_s(split, out.decode_context_tokens)
        elif apart:  # the decode rows read as a decode step's, the chunks launched alone
            decode = self.decode_attention_s(out.decode_context_tokens)
            attention = self.prefill_attention_s(out.prefill_chunks)
            launch += APART_LAUNCHES * self.eff.split_launch_s
        else:
            attention = self.prefill_attention_s(out.prefill_chunks) + (
                self.mixed_decode_attention_s(out.decode_context_tokens)
                if out.num_prefill_tokens else self.decode_attention_s(out.decode_context_tokens))
        if split is None and out.num_prefill_tokens and (self.eff.split_launch_s
                                                         or self._program_flops_s):
            if apart:  # the chunks' launch: the prefill rows alone
                chunks = out.prefill_chunks
                tokens, seqs = out.num_prefill_tokens, len(chunks)
                max_query = max(c for c, _ in chunks)
                max_seq = max(c + p for c, p in chunks)
            else:
                tokens, seqs = num_tokens, len(out.scheduled)
                max_query, max_seq = step_extents(out)
            splits = self.num_splits(tokens, seqs, max_query, max_seq)
            if splits > 1:
                launch += self.eff.split_launch_s
            # the launch lasts at least its longest program (Efficiency.attention_program)
            attention = float(self.launch_attention_s(
                attention, self.longest_program_s(max_seq, splits)))
        attention += decode
        return StepCost(
            linear_s=self.linear_s(rows), attention_s=attention,
            allreduce_s=self.allreduce_s(rows), logits_s=self.logits_s(sampled),
            overhead_s=self.eff.step_overhead_s + self.eff.per_seq_overhead_s * len(out.scheduled),
            launch_s=launch, launch_serial_fraction=self.eff.launch_serial_fraction,
            hidden_s=self.hidden_s if out.num_prefill_tokens else self.decode_hidden_s,
        )

    @property
    def apart_min_keys(self) -> int:
        """From how many decode keys a step with prefill tokens runs its decode rows apart (0:
        never): `mixed_split_min_keys` on the Triton kernel (EngineConfig.mixed_split_bytes),
        any on flashinfer, whose prefill launch takes the prefill rows only."""
        return 1 if self.attention_backend == FLASHINFER_ATTENTION else self.mixed_split_min_keys

    def runs_apart(self, decode_context_tokens: int) -> bool:
        """Whether a step with prefill tokens runs its decode rows apart (`apart_min_keys`)."""
        return 0 < self.apart_min_keys <= decode_context_tokens

    def decode_step_terms(self, batch_size: int) -> tuple[float, float, float, float, float]:
        """(fixed seconds, seconds per context token, launch seconds, launch serial fraction,
        overhead seconds) of a decode-only step of `batch_size` sequences. A step whose
        contexts sum to C tokens takes `step_total_s` of d = fixed + C x per-token (the step's
        device time) and these terms; they depend on the batch size only, so they are
        computed once per size."""
        terms = self._decode_terms.get(batch_size)
        if terms is None:
            rows, eager = self.decode_rows(batch_size)
            launch, sampled = 0.0, rows
            if eager:  # beyond every decode graph: as CostModel.step prices it
                rows, launch = self.eager_step(batch_size)
                sampled = batch_size
            fixed_s = self.linear_s(rows) + self.allreduce_s(rows) + self.logits_s(sampled)
            terms = (fixed_s, self._kv_bytes_per_token / self._kv_bytes_s, launch,
                     self.eff.launch_serial_fraction,
                     self.eff.step_overhead_s + self.eff.per_seq_overhead_s * batch_size)
            self._decode_terms[batch_size] = terms
        return terms

    def decode_run_s(self, batch_size: int, context_tokens: int, num_steps: int) -> np.ndarray:
        """Durations of `num_steps` consecutive decode-only steps of `batch_size` sequences
        whose contexts sum to `context_tokens` at the first step and grow by one each step."""
        fixed_s, per_token_s, launch, fraction, overhead = self.decode_step_terms(batch_size)
        contexts = context_tokens + batch_size * np.arange(num_steps, dtype=np.float64)
        device = fixed_s + contexts * per_token_s
        return step_total_array(device, launch, fraction, overhead,
                                hidden_s=self.decode_hidden_s)
