"""Per-operator step-time model: what one engine step costs on one GPU of a TP group.

Each operator is a roofline: time = max(FLOPs / achieved FLOP/s, bytes / achieved bandwidth),
with achieved rates = peak x an efficiency. Operators:

    linear     q/k/v/o and MLP matmuls of all layers: 2 x params x tokens FLOPs, weights read
               once per step (small steps are weight-bandwidth bound, large ones compute bound)
    attention  prefill chunks: causal FLOPs of a chunk of c tokens on a prefix of p,
               4 x c x (p + c/2) x heads x head_dim per layer; decode: KV bytes read; a
               decode row beside a chunk: its 128-row tile's FLOPs over its keys (below)
    allreduce  two per layer under TP (after attention and after the MLP), ring algorithm:
               2 (tp-1)/tp x bytes / link bandwidth + a latency per call
    logits     lm_head for the rows that sample (weights read once, 2 x hidden x vocab FLOPs)
    overhead   a fixed per-step cost (scheduling, input preparation, launches) + per sequence

Default efficiencies come from DESIGN.md's H200 measurements: Llama-3.1-8B linear layers cost
0.58-0.64 us per token per layer at 512-16,384 tokens (2 x 218 M params / 0.6 us = 727 TFLOP/s,
0.73 of the 989 TFLOP/s datasheet peak) and turn weight-bound below ~256 tokens (1.0 us at 128
tokens = 436 MB in 128 us = 3.4 TB/s, 0.71 of 4.8 TB/s). A calibration written by
`python -m gpu_backend profile` replaces them with values fitted on the user's GPU
(`sim.core.calibration` reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from sim.core.catalog import GpuSpec, ModelSpec
from sim.core.step import SchedulerOutput

# Efficiency's shares of a shorter time not hidden under a longer one: each within [0, 1].
SERIAL_FRACTIONS = ("linear_serial_fraction", "launch_serial_fraction", "attention_program_serial")


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
    # Host time to launch a step that runs piecewise CUDA graphs (CostModel's
    # token_graph_sizes): attention launched eagerly between the graph pieces, every piece a
    # graph replay (Qwen2.5-0.5B on the H200: 3-5 ms against 11-22 ms fully eager). None: as
    # eager_launch_s (a calibration from before this term, whose eager_launch_s was fitted on
    # the piecewise steps it timed, or one that timed no piecewise step).
    piecewise_launch_s: float | None = None
    # How much of the shorter of a linear layer's compute and weight-read times is NOT hidden
    # under the longer: 0 is the roofline (max of the two), 1 adds them. Skinny GEMMs (decode
    # batches of 8..64 rows) sit between: measured H200 decode steps grow with the batch long
    # before the roofline's compute term overtakes the weight read.
    linear_serial_fraction: float = 0.0
    # Host time added to an eager step's launch when its attention splits each tile's keys
    # over several programs (`attention_num_splits`): per layer a combine kernel and two scratch
    # buffers more. Qwen2.5-0.5B with piecewise graphs on the H200: 4.4-4.7 ms launches with
    # splits against 3.1-3.4 ms without (profile grid; replays alike).
    split_launch_s: float = 0.0
    # How much of the shorter of an eager step's device time and launch time is NOT hidden
    # under the longer (as linear_serial_fraction for a GEMM's compute and weight read): the
    # device waits for the first launches and runs the last ones after the host is done. 0 is
    # a perfect overlap. It shows where the two are close: Qwen2.5-0.5B's piecewise steps of
    # 1-2k tokens (3-4 ms of launches, as long on the device) took 15-20% over the max.
    launch_serial_fraction: float = 0.0
    # Of one SM's share of the peak bf16 FLOP/s: how fast one program of a prefill or mixed
    # attention launch works through its keys (CostModel.longest_program_s). Such a launch
    # gives every sequence's 128-row tile, a decode row's too, one program per KV head, and
    # splits no keys once the programs fill the SMs, so it lasts at least as long as its
    # longest sequence's program: a 2,048-token chunk beside decode rows of ~30k keys
    # (Mooncake) took 13 ms more than its total work predicts on Llama-3.1-8B and -3.2-3B
    # alike. None: not priced (calibrations from before this term, or grids without such steps).
    attention_program: float | None = None
    # How much of the shorter of such a launch's total work and its longest program is NOT
    # hidden under the longer (as linear_serial_fraction): the long programs do not all start
    # at once, and the SMs they hold share their bandwidth. The Mooncake replays' own
    # chunk-2,048 steps (18 decode rows, five of ~27k keys), their attention timed alone, ran
    # 1.3-1.7x the longer of the two (benchmarks/replay_attention.py); 0 is max(work, longest).
    attention_program_serial: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in ("piecewise_launch_s", "attention_program"):
                continue
            if value < 0 or (f.name in ("linear_compute", "memory", "kv_memory",
                                        "attention_compute", "interconnect",
                                        "attention_program")
                             and not 0 < value <= 1) or (f.name in SERIAL_FRACTIONS and value > 1):
                raise ValueError(f"efficiency {f.name}={value} is out of range")

    @property
    def piecewise_launch(self) -> float:
        """The launch time of a step that runs piecewise graphs (piecewise_launch_s, or
        eager_launch_s where that is None)."""
        return self.eager_launch_s if self.piecewise_launch_s is None else self.piecewise_launch_s


@dataclass(frozen=True, slots=True)
class StepCost:
    linear_s: float
    attention_s: float
    allreduce_s: float
    logits_s: float
    overhead_s: float  # serial: scheduling, input copies, graph launch, per-sequence work
    launch_s: float = 0.0  # eager kernel launches, overlapped with the device work
    launch_serial_fraction: float = 0.0  # Efficiency.launch_serial_fraction

    @property
    def device_s(self) -> float:
        return self.linear_s + self.attention_s + self.allreduce_s + self.logits_s

    @property
    def total_s(self) -> float:
        device = self.device_s
        overlap = min(device, self.launch_s) * self.launch_serial_fraction
        return max(device, self.launch_s) + overlap + self.overhead_s


# The engine's prefill attention (gpu_backend/kernels/attention.py) tiles 128 query rows
# (tokens x GQA group) per program; when tiles x KV heads leave SMs idle it splits every
# tile's keys (at least MIN_KEYS_PER_SPLIT each) and launches a second kernel to combine the
# parts, as flash-attention's split-KV heuristic does. tests/test_cost_model.py holds this
# rule to the kernel's choose_num_splits.
ATTENTION_TILE_ROWS = 128
MIN_KEYS_PER_SPLIT = 256
SPLIT_TARGET_WAVES = 2  # programs per SM a split aims for
MAX_NUM_SPLITS = 32


def attention_num_splits(num_tokens: int, num_seqs: int, max_query_len: int, max_seq_len: int,
                         num_kv_heads: int, group: int, num_sms: int) -> int:
    """Into how many programs the attention of a step with prefill tokens splits each tile's
    keys (1: no split; num_sms 0, an unknown GPU: never). Plain integers: the simulator asks
    this for every step."""
    block_q = max(1, ATTENTION_TILE_ROWS // group)
    tiles = num_seqs if max_query_len <= block_q else num_tokens // block_q + num_seqs
    programs = tiles * num_kv_heads
    if programs >= num_sms:
        return 1
    splits = min(-(-SPLIT_TARGET_WAVES * num_sms // max(1, programs)),
                 -(-max_seq_len // MIN_KEYS_PER_SPLIT))
    return max(1, min(splits, MAX_NUM_SPLITS))


def attention_num_splits_array(num_tokens: np.ndarray, num_seqs: np.ndarray,
                               max_query_len: np.ndarray, max_seq_len: np.ndarray,
                               num_kv_heads: int, group: int, num_sms: int) -> np.ndarray:
    """`attention_num_splits` of many steps at once (int64 array): tiles x KV heads below
    the SMs split into enough programs for SPLIT_TARGET_WAVES per SM, each of at least
    MIN_KEYS_PER_SPLIT of the longest sequence's keys, at most MAX_NUM_SPLITS."""
    block_q = max(1, ATTENTION_TILE_ROWS // group)
    tiles = np.where(max_query_len <= block_q, num_seqs, num_tokens // block_q + num_seqs)
    programs = np.maximum(1, tiles * num_kv_heads)
    splits = np.minimum(-(-SPLIT_TARGET_WAVES * num_sms // programs),
                        -(-np.asarray(max_seq_len) // MIN_KEYS_PER_SPLIT))
    splits = np.clip(splits, 1, MAX_NUM_SPLITS)
    return np.where(tiles * num_kv_heads < num_sms, splits, 1).astype(np.int64)


def step_extents(out: SchedulerOutput) -> tuple[int, int]:
    """(longest query, longest sequence after the step) of one step's scheduled rows."""
    max_query = max_seq = 0
    for row in out.scheduled:
        max_query = max(max_query, row.num_new_tokens)
        max_seq = max(max_seq, row.num_computed_tokens + row.num_new_tokens)
    return max_query, max_seq


def padded_batch(num_rows: int, sizes: Sequence[int]) -> int | None:
    """Smallest of `sizes` (ascending) >= num_rows, or None when the batch is larger than all."""
    for size in sizes:
        if size >= num_rows:
            return size
    return None


def padded_batch_array(num_rows: np.ndarray,
                       sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """`padded_batch` of many batches: (the padded size, or the batch itself beyond every
    size; beyond every size?). `sizes` ascending and not empty."""
    sizes_array = np.asarray(sizes, dtype=np.int64)
    index = np.searchsorted(sizes_array, num_rows)  # the first size >= the rows
    beyond = index == len(sizes_array)
    return np.where(beyond, num_rows, sizes_array[np.minimum(index, len(sizes_array) - 1)]), beyond


def piecewise_capture_sizes(max_tokens: int) -> tuple[int, ...]:
    """Token counts to capture piecewise CUDA graphs at for steps of up to `max_tokens`
    tokens (the GPU engine imports this rule, so the simulator pads as the engine does).

    16 to 256 in steps of 16, 320 to 1,024 in steps of 64, 1,280 to 8,192 in steps of 256,
    then steps of 512: fine where a step is short and padding a large share of it, coarse
    where it is long (fewer graphs to capture and hold). The sizes below `max_tokens`, then
    `max_tokens` itself, so every step the scheduler can build has a graph.
    """
    if max_tokens < 1:
        raise ValueError(f"piecewise_capture_sizes needs max_tokens >= 1, got {max_tokens}")
    grid = [*range(16, 257, 16), *range(320, 1025, 64), *range(1280, 8193, 256),
            *range(8704, max_tokens, 512)]
    return (*(size for size in grid if size < max_tokens), max_tokens)


def piecewise_sizes_for(chunk: int, max_tokens: int | None = None) -> tuple[int, ...]:
    """`piecewise_capture_sizes` of an engine whose chunk is `chunk` and whose piecewise
    graphs stop at `max_tokens` (None: at the chunk). A step of more tokens runs fully eager;
    vLLM captures up to 512 by default, where a step's launches still outweigh its compute."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"a piecewise graph cap of {max_tokens} tokens: give 1 or more")
    return piecewise_capture_sizes(chunk if max_tokens is None else min(chunk, max_tokens))


# CostModel's leading arguments (model, GPU, tensor-parallel size), as a fit passes them on
CostArgs = tuple[ModelSpec, GpuSpec, int]


class CostModel:
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
    """

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int = 1,
                 efficiency: Efficiency | None = None, graph_sizes: Sequence[int] = (),
                 token_graph_sizes: Sequence[int] = ()) -> None:
        self.model, self.gpu, self.tp = model, gpu, tp
        self.eff = efficiency or Efficiency()
        self.graph_sizes = tuple(sorted(graph_sizes))
        self.token_graph_sizes = tuple(sorted(token_graph_sizes))
        h, vocab = model.hidden_size, model.padded_vocab_size(tp)
        self._lm_head_flops_per_row = 2.0 * h * vocab
        self._layer_flops_per_token = model.linear_flops_per_token(tp) - 2.0 * h * model.vocab_size / tp
        # decoder weights a one-token step reads (every dense weight; an MoE model's active
        # experts); linear_s asks the model for a larger MoE step's expected experts
        self._layer_weight_bytes = model.layer_weight_bytes_read(1, tp)
        self._lm_head_bytes = float(h * vocab * model.dtype_bytes)
        self._flops_s = gpu.peak_bf16_flops * self.eff.linear_compute
        self._attn_flops_s = gpu.peak_bf16_flops * self.eff.attention_compute
        self._bytes_s = gpu.memory_bandwidth_bytes_s * self.eff.memory
        self._kv_bytes_s = gpu.memory_bandwidth_bytes_s * self.eff.kv_memory
        heads = model.num_attention_heads // tp
        self._kv_heads = max(1, model.num_kv_heads // tp)  # per GPU (replicated below tp)
        self._group = max(1, model.num_attention_heads // model.num_kv_heads)
        self._attn_flops_per_pair = 4.0 * heads * model.head_dim * model.num_layers
        # one program: a 128-row tile's QK^T and PV products per key, over every layer
        self._program_flops_per_key = 4.0 * ATTENTION_TILE_ROWS * model.head_dim * model.num_layers
        self._program_flops_s = (gpu.peak_bf16_flops / gpu.num_sms * self.eff.attention_program
                                 if self.eff.attention_program and gpu.num_sms else 0.0)
        self._kv_bytes_per_token = float(model.kv_bytes_per_token(tp))
        self._allreduce_bytes_per_token = float(h * model.dtype_bytes)

    # ------------------------------------------------------------- operators
    def linear_s(self, num_tokens: int) -> float:
        compute = num_tokens * self._layer_flops_per_token / self._flops_s
        weight_bytes = (self._layer_weight_bytes if self.model.moe is None
                        else self.model.layer_weight_bytes_read(num_tokens, self.tp))
        weights = weight_bytes / self._bytes_s
        return max(compute, weights) + self.eff.linear_serial_fraction * min(compute, weights)

    def prefill_attention_s(self, chunks: tuple[tuple[int, int], ...]) -> float:
        pairs = sum(c * (p + c / 2.0) for c, p in chunks)
        return pairs * self._attn_flops_per_pair / self._attn_flops_s

    def decode_attention_s(self, context_tokens: int) -> float:
        return context_tokens * self._kv_bytes_per_token / self._kv_bytes_s

    def mixed_decode_attention_s(self, context_tokens: int) -> float:
        """The decode rows of a step with prefill tokens: one launch of 128-row tiles runs
        the whole step, a decode row's tile too (one query, its GQA group of rows used), so
        every key of those rows costs a tile's FLOPs per KV head at `attention_compute`, not
        a read at `kv_memory`. Measured on the H200 (benchmarks/replay_attention.py, the
        Mooncake replays' own chunk-2,048 steps alone): 18 decode rows of 218k keys beside a
        2,030-token chunk took 1.37 ms per layer, priced 0.79 as reads (the longest program)."""
        return (context_tokens * self._kv_heads * self._program_flops_per_key
                / self._attn_flops_s)

    def longest_program_s(self, max_seq_len: np.ndarray | int,
                          num_splits: np.ndarray | int = 1) -> np.ndarray | float:
        """The longest program of a prefill or mixed attention launch, over every layer: the
        longest sequence's keys (its share of them where the launch splits) at
        `attention_program` of one SM. 0 where that term is unset or the SM count unknown."""
        if not self._program_flops_s:
            return 0.0 * np.asarray(max_seq_len) if np.ndim(max_seq_len) else 0.0
        keys = -(-np.asarray(max_seq_len) // np.asarray(num_splits))
        seconds = keys * self._program_flops_per_key / self._program_flops_s
        return seconds if np.ndim(seconds) else float(seconds)

    def launch_attention_s(self, work_s: np.ndarray | float,
                           longest_s: np.ndarray | float) -> np.ndarray | float:
        """A prefill or mixed attention launch of total work `work_s` whose longest program
        takes `longest_s`: the longer of the two, and `attention_program_serial` of the
        shorter. Where the longest program is not priced (0), the work alone."""
        work, longest = np.asarray(work_s, dtype=np.float64), np.asarray(longest_s, dtype=np.float64)
        serial = np.where(longest > 0, self.eff.attention_program_serial, 0.0)
        seconds = np.maximum(work, longest) + serial * np.minimum(work, longest)
        return seconds if np.ndim(seconds) else float(seconds)

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
        attention = self.prefill_attention_s(out.prefill_chunks) + (
            self.mixed_decode_attention_s(out.decode_context_tokens) if out.num_prefill_tokens
            else self.decode_attention_s(out.decode_context_tokens))
        if out.num_prefill_tokens and (self.eff.split_launch_s or self._program_flops_s):
            max_query, max_seq = step_extents(out)
            splits = self.num_splits(num_tokens, len(out.scheduled), max_query, max_seq)
            if splits > 1:
                launch += self.eff.split_launch_s
            # the launch lasts at least its longest program (Efficiency.attention_program)
            attention = float(self.launch_attention_s(
                attention, self.longest_program_s(max_seq, splits)))
        return StepCost(
            linear_s=self.linear_s(rows), attention_s=attention,
            allreduce_s=self.allreduce_s(rows), logits_s=self.logits_s(sampled),
            overhead_s=self.eff.step_overhead_s + self.eff.per_seq_overhead_s * len(out.scheduled),
            launch_s=launch, launch_serial_fraction=self.eff.launch_serial_fraction,
        )

    def num_splits(self, num_tokens: int, num_seqs: int, max_query_len: int,
                   max_seq_len: int) -> int:
        """`attention_num_splits` for this model (KV heads per GPU) on this GPU."""
        return attention_num_splits(num_tokens, num_seqs, max_query_len, max_seq_len,
                                    self._kv_heads, self._group, self.gpu.num_sms)

    def num_splits_array(self, num_tokens: np.ndarray, num_seqs: np.ndarray,
                         max_query_len: np.ndarray, max_seq_len: np.ndarray) -> np.ndarray:
        """`num_splits` of many steps at once (int64 array)."""
        return attention_num_splits_array(num_tokens, num_seqs, max_query_len, max_seq_len,
                                          self._kv_heads, self._group, self.gpu.num_sms)

    def splits(self, num_tokens: int, num_seqs: int, max_query_len: int,
               max_seq_len: int) -> bool:
        """Does such a step's attention split its keys (`num_splits` > 1)?"""
        return self.num_splits(num_tokens, num_seqs, max_query_len, max_seq_len) > 1

    def decode_run_s(self, batch_size: int, context_tokens: int, num_steps: int) -> np.ndarray:
        """Durations of `num_steps` consecutive decode-only steps of `batch_size` sequences
        whose contexts sum to `context_tokens` at the first step and grow by one each step."""
        rows, eager = self.decode_rows(batch_size)
        launch, sampled = 0.0, rows
        if eager:  # beyond every decode graph: as CostModel.step prices it
            rows, launch = self.eager_step(batch_size)
            sampled = batch_size
        fixed_s = self.linear_s(rows) + self.allreduce_s(rows) + self.logits_s(sampled)
        contexts = context_tokens + batch_size * np.arange(num_steps, dtype=np.float64)
        attention = contexts * (self._kv_bytes_per_token / self._kv_bytes_s)
        overhead = self.eff.step_overhead_s + self.eff.per_seq_overhead_s * batch_size
        device = fixed_s + attention
        return (np.maximum(device, launch) + self.eff.launch_serial_fraction
                * np.minimum(device, launch) + overhead)

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
    ("piecewise_launch_s", (0.0, 0.2), 1e-3),
    ("linear_serial_fraction", (0.0, 1.0), 1.0),
    ("split_launch_s", (0.0, 0.05), 1e-3),
    ("launch_serial_fraction", (0.0, 1.0), 1.0),
    ("attention_program", (0.02, 1.0), 1.0),
    ("attention_program_serial", (0.0, 1.0), 1.0),
)


def slower(eff: Efficiency, factor: float) -> Efficiency:
    """`eff` with every step `factor` (>= 1) times as long: each rate's efficiency divided by
    it, each fixed time multiplied (what-if and sensitivity runs)."""
    if factor < 1:
        raise ValueError(f"slower() needs a factor >= 1 (efficiencies stay <= 1), got {factor}")
    return replace(eff, **{name: getattr(eff, name) / factor for name in (
        "linear_compute", "memory", "kv_memory", "attention_compute", "interconnect",
        "attention_program") if getattr(eff, name) is not None},
        **_times(eff, ("allreduce_latency_s", "step_overhead_s", "per_seq_overhead_s",
                       "eager_launch_s", "piecewise_launch_s", "split_launch_s"), factor))


def _times(eff: Efficiency, names: Sequence[str], factor: float) -> dict[str, float]:
    """The fixed times `names` of `eff` multiplied by `factor` (an unset one left unset)."""
    return {name: getattr(eff, name) * factor for name in names
            if getattr(eff, name) is not None}


HOST_TERMS = ("step_overhead_s", "per_seq_overhead_s", "eager_launch_s", "piecewise_launch_s",
              "split_launch_s")


def host_slower(eff: Efficiency, factor: float) -> Efficiency:
    """`eff` on a host `factor` times slower: the per-step terms a calibration fits multiplied,
    the device's rates kept. One H200 host ran a fixed Python loop in 7 to 14 ms at different
    times, and eager steps' launch time moved with it (benchmarks/host_noise.py).
    The eager launch term is host time; the step overhead also holds per-step device time (the
    Llama-3.1-8B profile fits 1.68 ms, of which a small decode graph step's host build and
    enqueue are 0.3-0.5 ms), so for graph steps this is an upper bound."""
    if factor <= 0:
        raise ValueError(f"host_slower() needs a positive factor, got {factor}")
    return replace(eff, **_times(eff, HOST_TERMS, factor))


def efficiency_dict(eff: Efficiency) -> dict[str, float]:
    return asdict(eff)
