"""The operators of one engine step, each priced alone on one GPU of a TP group.

`OperatorCosts` turns the model's shape, the GPU's peak rates and the fitted `Efficiency` into
the rates each operator achieves, once per model, and prices the linear layers, the attention
of prefill chunks and of decode rows (read, or computed beside a chunk), a launch's longest
attention program, SPLIT's padded SDPA calls (the split and auto attention backends), the TP
all-reduces, the logits and a KV migration. `CostModel`
(sim.core.cost_model) builds on it to price whole steps as the engine runs them: CUDA graph
padding, launch time and overlap, per-step overhead.
"""

from __future__ import annotations

import numpy as np

from sim.core.catalog import GpuSpec, ModelSpec
from sim.core.efficiency import Efficiency
from sim.core.launch_shapes import (
    ATTENTION_TILE_ROWS,
    attention_num_splits,
    attention_num_splits_array,
)
from sim.core.split_shapes import (
    ATTENTION_BACKENDS,
    FLASHINFER_ATTENTION,
    SPLIT_MIN_QUERY,
    SplitShapes,
)

Chunks = tuple[tuple[int, int], ...]  # (new tokens, cached prefix tokens) per prefill sequence


class OperatorCosts:
    """Seconds per operator from the model's shape, the GPU's peak rates and the efficiencies
    (the module docstring of sim.core.cost_model gives each operator's roofline).

    `attention_backend` (EngineConfig.attention_backend): which prefill sequences run SPLIT,
    `split_chunks`. Such a step's decode rows run the Triton decode path (KV reads) and its
    other prefill sequences the Triton prefill path."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int = 1,
                 efficiency: Efficiency | None = None, attention_backend: str = "triton") -> None:
        if attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention backend {attention_backend!r}: choose from "
                             f"{', '.join(ATTENTION_BACKENDS)}")
        self.model, self.gpu, self.tp = model, gpu, tp
        self.eff = efficiency or Efficiency()
        self.attention_backend = attention_backend
        # SPLIT runs prefill sequences of at least this many new tokens (0: none does)
        self._split_min_query = {"triton": 0, "split": 1, "auto": SPLIT_MIN_QUERY,
                                 FLASHINFER_ATTENTION: 0}[attention_backend]
        self._split_shapes = SplitShapes()
        h, vocab = model.hidden_size, model.padded_vocab_size(tp)
        self._lm_head_flops_per_row = 2.0 * h * vocab
        self._layer_flops_per_token = model.linear_flops_per_token(tp) - 2.0 * h * model.vocab_size / tp
        # decoder weights a one-token step reads (every dense weight; an MoE model's active
        # experts); linear_s asks the model for a larger MoE step's expected experts
        self._layer_weight_bytes = model.layer_weight_bytes_read(1, tp)
        self._lm_head_bytes = float(h * vocab * model.dtype_bytes)
        self._flops_s = gpu.peak_bf16_flops * self.eff.linear_compute
        self._attn_flops_s = gpu.peak_bf16_flops * self.eff.attention_compute
        self._split_flops_s = gpu.peak_bf16_flops * self.eff.split_attention_compute
        self._bytes_s = gpu.memory_bandwidth_bytes_s * self.eff.memory
        self._kv_bytes_s = gpu.memory_bandwidth_bytes_s * self.eff.kv_memory
        heads = model.num_attention_heads // tp
        self._kv_heads = max(1, model.num_kv_heads // tp)  # per GPU (replicated below tp)
        self._group = max(1, model.num_attention_heads // model.num_kv_heads)
        self._attn_flops_per_pair = 4.0 * heads * model.head_dim * model.num_layers
        # a query token's fixed share, over its KV heads on this GPU and every layer
        self._query_s = self.eff.attention_query_s * self._kv_heads * model.num_layers
        self._mixed_flops_s = (gpu.peak_bf16_flops * self.eff.mixed_decode_compute
                               if self.eff.mixed_decode_compute else self._attn_flops_s)
        # one program: a 128-row tile's QK^T and PV products per key, over every layer
        self._program_flops_per_key = 4.0 * ATTENTION_TILE_ROWS * model.head_dim * model.num_layers
        self._program_flops_s = (gpu.peak_bf16_flops / gpu.num_sms * self.eff.attention_program
                                 if self.eff.attention_program and gpu.num_sms else 0.0)
        self._kv_bytes_per_token = float(model.kv_bytes_per_token(tp))
        self._allreduce_bytes_per_token = float(h * model.dtype_bytes)

    def linear_s(self, num_tokens: int) -> float:
        compute = num_tokens * self._layer_flops_per_token / self._flops_s
        weight_bytes = (self._layer_weight_bytes if self.model.moe is None
                        else self.model.layer_weight_bytes_read(num_tokens, self.tp))
        weights = weight_bytes / self._bytes_s
        # the serial share fades as one side dominates: a GEMM far from its ridge point hides
        # the other side whole
        longer, shorter = max(compute, weights), min(compute, weights)
        return longer + self.eff.linear_serial_fraction * shorter * shorter / longer

    @property
    def attention_pair_s(self) -> float:
        """The Triton prefill path's seconds per (query, key) pair, over every layer."""
        return self._attn_flops_per_pair / self._attn_flops_s

    @property
    def attention_query_token_s(self) -> float:
        """Its fixed seconds per query (new) token, over every layer (attention_query_s)."""
        return self._query_s

    def prefill_attention_s(self, chunks: tuple[tuple[int, int], ...]) -> float:
        """The Triton prefill path on `chunks`: every (query, key) pair a causal chunk sees at
        `attention_compute`, and every query token's fixed share (`attention_query_s`)."""
        pairs = sum(c * (p + c / 2.0) for c, p in chunks)
        return pairs * self.attention_pair_s + sum(c for c, _ in chunks) * self._query_s

    @property
    def runs_split(self) -> bool:
        """Whether any step runs SPLIT on this backend (split, auto)."""
        return bool(self._split_min_query)

    def split_chunks(self, chunks: Chunks) -> tuple[Chunks, Chunks] | None:
        """(sequences SPLIT runs, the rest) of a step's prefill chunks, or None where the
        step runs no SPLIT (the Triton kernel takes the whole batch). On auto a step runs
        SPLIT where one sequence has SPLIT_MIN_QUERY new tokens or more."""
        least = self._split_min_query
        if not least or not chunks or max(c for c, _ in chunks) < least:
            return None
        return (tuple(ch for ch in chunks if ch[0] >= least),
                tuple(ch for ch in chunks if ch[0] < least))

    def split_attention_s(self, chunks: Chunks) -> float:
        """SPLIT's attention of prefill sequences `chunks`: each one's padded products
        (SplitShapes.work) at `split_attention_compute`, a `split_call_s` per SDPA call and
        layer, and its keys gathered out of the paged pool (read and written once)."""
        pairs, calls, keys = 0.0, 0, 0
        for query_len, prefix_len in chunks:
            work = self._split_shapes.work(query_len, prefix_len)
            pairs += work.pairs
            calls += work.calls
            keys += query_len + prefix_len
        return (pairs * self._attn_flops_per_pair / self._split_flops_s
                + calls * self.model.num_layers * self.eff.split_call_s
                + 2.0 * keys * self._kv_bytes_per_token / self._bytes_s)

    def split_step_attention_s(self, parts: tuple[Chunks, Chunks],
                               decode_context_tokens: int) -> float:
        """The attention of a step that runs SPLIT (`parts`: `split_chunks` of its prefill
        chunks): SPLIT's sequences, the rest on the Triton prefill path, the decode rows as
        reads."""
        return (self.split_attention_s(parts[0]) + self.prefill_attention_s(parts[1])
                + self.decode_attention_s(decode_context_tokens))

    def decode_attention_s(self, context_tokens: int) -> float:
        return context_tokens * self._kv_bytes_per_token / self._kv_bytes_s

    def mixed_decode_attention_s(self, context_tokens: int) -> float:
        """The decode rows of a step with prefill tokens: one launch of 128-row tiles runs
        the whole step, a decode row's tile too (one query, its GQA group of rows used), so
        every key of those rows costs a tile's FLOPs per KV head at `mixed_decode_compute`
        (`attention_compute` where unset), not a read at `kv_memory`. Measured on the H200
        (benchmarks/replay_attention.py, the Mooncake replays' own chunk-2,048 steps alone):
        18 decode rows of 218k keys beside a 2,030-token chunk took 1.37 ms per layer, priced
        0.79 as reads (the longest program)."""
        return (context_tokens * self._kv_heads * self._program_flops_per_key
                / self._mixed_flops_s)

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

    # ------------------------------------------------------ attention launch shape
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

    def migration_s(self, num_bytes: int) -> float:
        """Device-to-device copy of migrated KV blocks: read and write each byte once."""
        return 2.0 * num_bytes / self._bytes_s
