"""Building blocks of a Llama-family decoder: norm, rotary, MLP activation, paged attention.

The modules here are plain torch (the reference the tests compare against). Attention
backends (`ATTENTION_BACKENDS`):

    triton  the Triton paged-attention kernel for every step
    split   decode-only steps as triton; steps with prefill rows run the decode rows through
            the Triton decode path and each prefill sequence through SPLIT (cuDNN's SDPA
            over its own keys and over its gathered prefix, merged by log-sum-exp, in
            shapes from a fixed set: see gpu_backend.kernels.split_attention)
    auto    as split for prefill sequences of at least SPLIT_MIN_QUERY new tokens (2,048),
            the smaller ones of the same step through the Triton paged kernel's prefill
            path (below that SPLIT ran slower than it beside decodes on an H200); steps
            without such a sequence as triton
    flashinfer  decode-only steps as triton; steps with prefill rows run every prefill row
            through FlashInfer's paged prefill over the cache in place, planned once per
            step (gpu_backend.kernels.flashinfer_attention), and a mixed step's decode rows
            apart through the Triton decode path
    torch   the float32 torch references (CPU tests)

`DecoderLayer` on the Triton-based backends replaces the torch norm, rotary and activation
by the fused kernels of `gpu_backend.kernels.fused` (one launch per group). Nothing here
syncs with the host on a decode step, so one built from these layers can be captured in a
CUDA graph; SPLIT launches per sequence from host lengths (`ForwardBatch.host_lens`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpu_backend.batch import ForwardBatch, HostLens
from gpu_backend.kernels import (
    paged_attention,
    paged_attention_ref,
    store_kvcache,
    store_kvcache_ref,
)
from gpu_backend.kernels.attention import (
    DecodePlan,
    decode_config,
    plan_decode_splits,
    uses_split_plan,
)
from gpu_backend.kernels.flashinfer_attention import flashinfer_prefill, page_lists
from gpu_backend.kernels.split_attention import prepare_plan, split_attention
from gpu_backend.kernels.split_plan import plan_split
from sim.core.split_shapes import SPLIT_MIN_QUERY, SplitShapes

AttentionBackend = Literal["triton", "split", "auto", "flashinfer", "torch"]
ATTENTION_BACKENDS = ("triton", "split", "auto", "flashinfer", "torch")
SPLIT_BACKENDS = ("split", "auto")  # backends that run SPLIT (and build its cuDNN plans)
# backends whose layers run the fused kernels
FUSED_BACKENDS = ("triton", "split", "auto", "flashinfer")
# GPU_BACKEND_DECODE_STREAM=1 runs a mixed step's decode rows, where they run apart from its
# prefill rows, on a second CUDA stream beside the prefill launch (off: one after the other,
# the engine every calibration was profiled on)
DECODE_STREAM = os.environ.get("GPU_BACKEND_DECODE_STREAM", "0") == "1"
_side_streams: dict[torch.device, torch.cuda.Stream] = {}


class RMSNorm(nn.Module):
    """RMSNorm with an optional fused residual add (returns the new residual too)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))

    def _norm(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.to(x.dtype) * self.weight

    def forward(self, x: Tensor, residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x, residual: [T, hidden] -> (normed, x + residual)."""
        if residual is not None:
            x = x + residual
        return self._norm(x), x


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding with a precomputed cos/sin table gathered by position."""

    def __init__(self, head_dim: int, max_position: int, theta: float):
        super().__init__()
        self.head_dim, self.max_position, self.theta = head_dim, max_position, theta
        self.register_buffer("cos_sin", self._table(torch.device("cpu")), persistent=False)

    def _table(self, device: torch.device) -> Tensor:
        half = self.head_dim // 2
        inv_freq = 1.0 / self.theta ** (torch.arange(half, device=device).float() / half)
        angles = torch.outer(torch.arange(self.max_position, device=device).float(), inv_freq)
        return torch.cat([angles.cos(), angles.sin()], dim=-1)  # [max_position, head_dim]

    def reset_table(self) -> None:
        """Recompute the table in place (after the module was moved off the meta device)."""
        self.cos_sin = self._table(self.cos_sin.device)

    def forward(self, positions: Tensor, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """positions: [T]; q: [T, H, D]; k: [T, KVH, D] -> rotated (q, k)."""
        cos, sin = self.cos_sin[positions].to(q.dtype).chunk(2, dim=-1)  # [T, D/2] each
        cos, sin = cos[:, None, :], sin[:, None, :]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)  # [T, n, D/2] each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def silu_and_mul(gate_up: Tensor) -> Tensor:
    """gate_up: [T, 2 * I] -> silu(gate) * up: [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class PagedAttention(nn.Module):
    """Stores the step's K/V into the paged cache, then attends over it (no weights)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int,
                 backend: AttentionBackend = "triton"):
        super().__init__()
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention backend {backend!r}: use one of {ATTENTION_BACKENDS}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.backend = backend
        self.split_shapes = SplitShapes()  # SPLIT's padded SDPA shapes
        self.split_min_query = SPLIT_MIN_QUERY  # auto: fewer new tokens run the Triton kernel
        # a mixed step on the Triton kernel runs its decode rows apart from this many keys on
        # (sim.core.launch_shapes.mixed_split_min_keys of EngineConfig.mixed_split_bytes; 0:
        # never, one launch); set_mixed_split sets it on every layer
        self.mixed_split_min_keys = 0

    def forward(self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                batch: ForwardBatch) -> Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D]; caches: [num_blocks, block_size, KVH, D].
        Returns [T, H, D]."""
        self.store(k, v, k_cache, v_cache, batch.slot_mapping)
        return self.attend(q, k_cache, v_cache, batch)

    def store(self, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
              slot_mapping: Tensor) -> None:
        """This step's K/V into the paged cache (slot -1: skipped)."""
        store = store_kvcache_ref if self.backend == "torch" else store_kvcache
        store(k, v, k_cache, v_cache, slot_mapping)

    def prepare(self, batch: ForwardBatch, k_cache: Tensor | None = None) -> ForwardBatch:
        """The batch with what every layer of the step shares, made once per step (same
        sequence lengths and head counts in every layer): the decode rows' split plan
        (Triton decode path), and on the split backend with prefill rows the SPLIT plan
        (its segment buffers shaped like `k_cache`, a layer's K cache, when given).

        A decode step's plan covers the batch. A mixed step whose leading decode rows hold
        `mixed_split_min_keys` keys or more (`runs_apart`) gets a plan for those and the
        prefill rows' own offsets: `attend` runs the decode rows with the decode tiles and the
        rest with the prefill tiles, as two launches. One launch of prefill tiles gives each
        decode row a 128-row tile per KV head (a 512-token chunk beside 32 decodes of 2k keys:
        29.1 ms one launch, 19.7 ms apart), but the extra launches cost host time on these
        eager steps (Azure-conv's small mixed steps, ~25 decodes of ~1k keys: 18.8 -> 31.3 ms
        apart, synchronous)."""
        if self.runs_split(batch):
            return self._prepare_split(batch, k_cache)
        if self.runs_flashinfer(batch):
            return self._prepare_flashinfer(batch, k_cache)
        if self.backend == "torch" or not uses_split_plan(1):
            return batch
        num_seqs = batch.seq_lens.shape[0]
        decodes = (num_seqs if batch.max_query_len <= 1
                   else batch.num_decodes if self.runs_apart(batch) else 0)
        if decodes == 0:
            return batch
        plan = self._decode_plan(batch, decodes)
        if decodes == num_seqs:
            return replace(batch, decode_plan=plan)
        return replace(batch, decode_plan=plan,
                       prefill_query_start_loc=batch.query_start_loc[decodes:] - decodes)

    def runs_apart(self, batch: ForwardBatch) -> bool:
        """Whether a mixed step on the Triton kernel runs its decode rows apart: they hold
        `mixed_split_min_keys` keys or more (counted from the host lengths; a batch without
        them runs one launch)."""
        if not self.mixed_split_min_keys or not batch.num_decodes or batch.host_lens is None:
            return False
        keys = int(batch.host_lens.seq_lens[:batch.num_decodes].sum())
        return keys >= self.mixed_split_min_keys

    def runs_split(self, batch: ForwardBatch) -> bool:
        """Whether this step's attention runs SPLIT: on split any step with prefill rows, on
        auto one with a prefill sequence of at least split_min_query new tokens."""
        if self.backend == "split":
            return batch.max_query_len > 1
        return self.backend == "auto" and batch.max_query_len >= self.split_min_query

    def runs_flashinfer(self, batch: ForwardBatch) -> bool:
        """Whether this step's prefill rows run FlashInfer: any step with prefill rows on the
        flashinfer backend."""
        return self.backend == "flashinfer" and batch.max_query_len > 1

    def _prepare_flashinfer(self, batch: ForwardBatch, k_cache: Tensor | None) -> ForwardBatch:
        """A step whose prefill rows run FlashInfer: their plan from the host lengths and
        block tables (copied from the device, one sync, when the batch came without them),
        made once for every layer on `k_cache`'s device, and the decode rows' split plan.
        Without `k_cache` the batch stays unplanned and `attend` plans for its own call."""
        if k_cache is None:
            return batch
        host = batch.host_lens
        if host is None or host.block_tables is None:
            host = host_lens_from_device(batch, with_tables=True)
        lists = page_lists(host.query_start_loc, host.seq_lens, host.block_tables,
                           batch.num_decodes, k_cache.shape[1])
        plan = flashinfer_prefill(k_cache.device).plan(
            lists, self.num_heads, self.num_kv_heads, self.head_dim, k_cache.shape[1],
            self.scale, k_cache.dtype)
        return replace(batch, host_lens=host, prefill_plan=plan,
                       decode_plan=self._leading_decode_plan(batch))

    def _leading_decode_plan(self, batch: ForwardBatch) -> DecodePlan | None:
        """The split plan of a step's leading decode rows, where it has any and the decode
        path uses one."""
        d = batch.num_decodes
        return self._decode_plan(batch, d) if d and uses_split_plan(1) else None

    def _decode_plan(self, batch: ForwardBatch, decodes: int) -> DecodePlan:
        block_n = decode_config(self.num_heads // self.num_kv_heads).block_n
        return plan_decode_splits(batch.seq_lens[:decodes], self.num_kv_heads, block_n)

    def _prepare_split(self, batch: ForwardBatch, k_cache: Tensor | None) -> ForwardBatch:
        """A step that runs SPLIT: its plan from the host lengths (copied from the device, one
        sync, when the batch came without them; on auto the sequences under split_min_query
        new tokens go to the Triton kernel) and the decode rows' split plan."""
        host = batch.host_lens if batch.host_lens is not None else host_lens_from_device(batch)
        d = batch.num_decodes
        min_query = self.split_min_query if self.backend == "auto" else 1
        plan = plan_split(host.query_start_loc, host.seq_lens, d, self.split_shapes, min_query)
        if k_cache is not None:
            plan = prepare_plan(plan, k_cache, self.num_heads)
        return replace(batch, host_lens=host, split_plan=plan,
                       decode_plan=self._leading_decode_plan(batch))

    def attend(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, batch: ForwardBatch,
               out: Tensor | None = None) -> Tensor:
        """Attention over a cache that already holds this step's K/V: [T, H, D] (into `out`,
        a contiguous [T, H, D], when given)."""
        if self.backend == "torch":
            result = paged_attention_ref(q, k_cache, v_cache, batch.block_tables,
                                         batch.seq_lens, batch.query_start_loc, self.scale)
            return result if out is None else out.copy_(result)
        if self.runs_split(batch):
            if batch.split_plan is None:
                batch = self.prepare(batch, k_cache)
            assert batch.split_plan is not None
            return split_attention(q, k_cache, v_cache, batch.block_tables, batch.seq_lens,
                                   batch.query_start_loc, self.scale, batch.split_plan,
                                   decode_plan=batch.decode_plan, out=out)
        if self.runs_flashinfer(batch):
            if batch.prefill_plan is None:
                batch = self.prepare(batch, k_cache)
            plan = batch.prefill_plan
            assert plan is not None
            d = batch.num_decodes
            return self._attend_mixed(q, k_cache, v_cache, batch, out,
                                      lambda o: plan.run(q[d:], k_cache, v_cache, o[d:]))
        if batch.prefill_query_start_loc is None:
            return paged_attention(q, k_cache, v_cache, batch.block_tables, batch.seq_lens,
                                   batch.query_start_loc, self.scale,
                                   max_query_len=batch.max_query_len,
                                   max_seq_len=batch.max_seq_len, plan=batch.decode_plan,
                                   out=out)
        d = batch.num_decodes  # a mixed step: decode rows, then prefill rows (see prepare)
        return self._attend_mixed(q, k_cache, v_cache, batch, out, lambda o: paged_attention(
            q[d:], k_cache, v_cache, batch.block_tables[d:], batch.seq_lens[d:],
            batch.prefill_query_start_loc, self.scale, max_query_len=batch.max_query_len,
            max_seq_len=batch.max_seq_len, out=o[d:]))

    def _attend_mixed(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, batch: ForwardBatch,
                      out: Tensor | None, prefill: Callable[[Tensor], object]) -> Tensor:
        """A mixed step whose decode rows run apart: its leading decode rows (if any) through
        the Triton decode path with the step's split plan, and its prefill rows by
        `prefill(out)`, into `out` (made contiguous [T, H, D] when None): returned. With
        DECODE_STREAM the decode rows run on a second stream, launched after the prefill
        rows and joined before the step's next kernel: their memory-bound programs take the
        SMs the prefill launch's last wave leaves idle."""
        if out is None:
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
        d = batch.num_decodes
        if not d:
            prefill(out)
            return out

        def decode_rows() -> None:
            paged_attention(q[:d], k_cache, v_cache, batch.block_tables[:d], batch.seq_lens[:d],
                            batch.query_start_loc[:d + 1], self.scale, max_query_len=1,
                            plan=batch.decode_plan, out=out[:d])
        if not (DECODE_STREAM and q.is_cuda):
            decode_rows()
            prefill(out)
            return out
        main = torch.cuda.current_stream(q.device)
        side = _side_streams.get(q.device)
        if side is None:
            side = _side_streams[q.device] = torch.cuda.Stream(q.device)
        side.wait_stream(main)  # this step's q and K/V are written; the prefill not yet
        prefill(out)
        with torch.cuda.stream(side):
            decode_rows()
        main.wait_stream(side)
        return out


def host_lens_from_device(batch: ForwardBatch, with_tables: bool = False) -> HostLens:
    """The step's lengths (and `with_tables`, its block tables) copied back from its device
    tensors in one transfer (one host sync), for batches built without them."""
    num_seqs = batch.seq_lens.shape[0]
    parts = [batch.query_start_loc.long(), batch.seq_lens.long()]
    if with_tables:
        parts.append(batch.block_tables.long().flatten())
    copied = torch.cat(parts).cpu().numpy()
    lens_end = 2 * num_seqs + 1
    tables = (copied[lens_end:].reshape(batch.block_tables.shape).astype(np.int32)
              if with_tables else None)
    return HostLens(query_start_loc=copied[:num_seqs + 1],
                    seq_lens=copied[num_seqs + 1:lens_end], block_tables=tables)
