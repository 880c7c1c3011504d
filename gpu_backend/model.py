"""A Llama-family decoder (Llama-3.x, Qwen2.5, Mistral) over a paged KV cache.

Random bf16 weights: step time and memory do not depend on weight values, so nothing is
downloaded. The shape spec is any object with the attributes of
`sim.core.catalog.ModelSpec` (num_layers, hidden_size, intermediate_size,
num_attention_heads, num_kv_heads, head_dim, vocab_size, tie_word_embeddings).

`forward` takes plain tensors (`ForwardBatch`) and the per-layer caches, syncs nothing
with the host and branches only on Python ints, so the engine can capture decode steps
in CUDA graphs around it. (The split and auto attention backends launch a step's prefill
rows per sequence, from host lengths the batch carries; a batch without them costs one sync.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpu_backend.batch import ForwardBatch
from gpu_backend.kernels import add_rms_norm, rotary_store_kv
from gpu_backend.kernels import silu_and_mul as fused_silu_and_mul
from gpu_backend.layers import (
    FUSED_BACKENDS,
    AttentionBackend,
    PagedAttention,
    RMSNorm,
    RotaryEmbedding,
    silu_and_mul,
)

KVCaches = list[tuple[Tensor, Tensor]]  # per layer (k_cache, v_cache)
INIT_STD = 0.02


class ModelShape(Protocol):
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelShape, qkv_bias: bool, rotary: RotaryEmbedding,
                 backend: AttentionBackend, dtype: torch.dtype, rms_eps: float):
        super().__init__()
        heads, kv_heads, head_dim = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
        self.q_size, self.kv_size = heads * head_dim, kv_heads * head_dim
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        hidden, inter = spec.hidden_size, spec.intermediate_size
        self.input_layernorm = RMSNorm(hidden, rms_eps, dtype)
        self.qkv_proj = nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=qkv_bias,
                                  dtype=dtype)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=False, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(hidden, rms_eps, dtype)
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(inter, hidden, bias=False, dtype=dtype)
        self.rotary = rotary  # shared by all layers
        self.attn = PagedAttention(heads, kv_heads, head_dim, backend)
        # fused Triton norm / rotary+store / activation
        self.fused = backend in FUSED_BACKENDS
        # Tensor parallelism (gpu_backend/tp): sums the row-parallel o_proj / down_proj
        # partial outputs over the TP group. None (one GPU) adds nothing.
        self.all_reduce: Callable[[Tensor], Tensor] | None = None

    def forward(self, batch: ForwardBatch, hidden: Tensor, residual: Tensor | None,
                k_cache: Tensor, v_cache: Tensor) -> tuple[Tensor, Tensor]:
        """hidden, residual: [T, hidden] -> (layer output, residual stream)."""
        q, residual = self.pre(hidden, residual, batch.positions, batch.slot_mapping,
                               k_cache, v_cache)
        return self.post(self.attn.attend(q, k_cache, v_cache, batch), residual)

    def pre(self, hidden: Tensor, residual: Tensor | None, positions: Tensor,
            slot_mapping: Tensor, k_cache: Tensor, v_cache: Tensor) -> tuple[Tensor, Tensor]:
        """Everything before attention: norm, QKV, rotary, this step's K/V into the cache.

        Returns (rotated q [T, H, D], residual stream). No host sync and no data-dependent
        shape, so the piecewise graphs (engine/piecewise.py) capture it."""
        hidden, residual = self._norm(self.input_layernorm, hidden, residual)
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [T, (H + 2 KVH) * D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.heads, self.head_dim)  # [T, H, D]
        k = k.view(num_tokens, self.kv_heads, self.head_dim)  # [T, KVH, D]
        v = v.view(num_tokens, self.kv_heads, self.head_dim)  # strided view of qkv
        if self.fused:  # rotary on q and k, k and v into the cache: one launch
            q = rotary_store_kv(q, k, v, positions, self.rotary.cos_sin, k_cache, v_cache,
                                slot_mapping)
        else:
            q, k = self.rotary(positions, q, k)
            self.attn.store(k, v, k_cache, v_cache, slot_mapping)
        return q, residual

    def post(self, attn: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """Everything after attention: output projection, norm, MLP. attn: [T, H, D]."""
        hidden = self.o_proj(attn.reshape(attn.shape[0], self.q_size))
        if self.all_reduce is not None:
            hidden = self.all_reduce(hidden)
        hidden, residual = self._norm(self.post_attention_layernorm, hidden, residual)
        gate_up = self.gate_up_proj(hidden)
        act = fused_silu_and_mul(gate_up) if self.fused else silu_and_mul(gate_up)
        hidden = self.down_proj(act)  # [T, hidden]
        if self.all_reduce is not None:
            hidden = self.all_reduce(hidden)
        return hidden, residual

    def _norm(self, norm: RMSNorm, hidden: Tensor,
              residual: Tensor | None) -> tuple[Tensor, Tensor]:
        if self.fused:
            return add_rms_norm(hidden, norm.weight, norm.eps, residual)
        return norm(hidden, residual)


class Model(nn.Module):
    def __init__(self, spec: ModelShape, qkv_bias: bool = False, rope_theta: float = 500000.0,
                 dtype: torch.dtype = torch.bfloat16, attention_backend: AttentionBackend = "triton",
                 max_position: int = 131072, rms_eps: float = 1e-5):
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size, dtype=dtype)
        self.rotary = RotaryEmbedding(spec.head_dim, max_position, rope_theta)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, qkv_bias, self.rotary, attention_backend, dtype, rms_eps)
            for _ in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, rms_eps, dtype)
        self.lm_head = (None if spec.tie_word_embeddings else
                        nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, dtype=dtype))

    def num_params(self) -> int:
        """Distinct parameters (a tied lm_head counts once)."""
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Small random normal weights (finite activations), unit norms, zero biases."""
        device = next(self.parameters()).device
        gen = torch.Generator(device=device).manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                self._draw_weight(name, param, gen)
        self.rotary.reset_table()

    def _draw_weight(self, name: str, param: Tensor, gen: torch.Generator) -> None:
        """Fill one weight matrix from `gen` (the TP model draws the full one and slices it)."""
        param.normal_(0.0, INIT_STD, generator=gen)

    @torch.no_grad()
    def compute_logits(self, batch: ForwardBatch, kv_caches: KVCaches) -> Tensor:
        """Logits [R, vocab] of the rows in batch.logits_indices."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"got {len(kv_caches)} KV caches for {len(self.layers)} layers")
        # what every layer shares: the decode rows' plan, the split backend's plan
        batch = self.layers[0].attn.prepare(batch, kv_caches[0][0])
        hidden = self.embed(batch.input_ids)  # [T, hidden]
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(batch, hidden, residual, k_cache, v_cache)
        hidden = (hidden + residual)[batch.logits_indices]  # [R, hidden]: only sampling rows
        hidden, _ = self.norm(hidden)
        return self.logits(hidden)  # [R, vocab]

    def embed(self, input_ids: Tensor) -> Tensor:
        """input_ids: [T] -> [T, hidden] (vocab-parallel under TP: see gpu_backend/tp)."""
        return self.embed_tokens(input_ids)

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden: [R, hidden] -> logits [R, vocab] (gathered over the TP group under TP)."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight)

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, kv_caches: KVCaches) -> Tensor:
        """Greedy next-token ids [R] for the rows in batch.logits_indices."""
        return self.compute_logits(batch, kv_caches).argmax(dim=-1)


def build_model(spec: ModelShape, device: torch.device | str = "cuda",
                dtype: torch.dtype = torch.bfloat16, qkv_bias: bool = False,
                rope_theta: float = 500000.0, seed: int = 0,
                attention_backend: AttentionBackend = "triton",
                max_position: int = 131072, fused: bool = True) -> Model:
    """Build on the meta device, then allocate once on `device` and fill randomly
    (no full-precision host copy of an 8B model). `fused=False` keeps the torch norm,
    rotary and activation on the Triton backend (the engine before fusion, for A/B runs)."""
    with torch.device("meta"):
        model = Model(spec, qkv_bias=qkv_bias, rope_theta=rope_theta, dtype=dtype,
                      attention_backend=attention_backend, max_position=max_position)
    model.to_empty(device=device)
    model.init_weights(seed)
    set_fused(model, fused)
    return model.requires_grad_(False).eval()


def set_fused(model: Model, fused: bool) -> None:
    """Switch the fused Triton layer kernels on or off (only where attention runs Triton)."""
    for layer in model.layers:
        layer.fused = fused and layer.attn.backend in FUSED_BACKENDS


def set_mixed_split(model: Model, min_keys: int) -> None:
    """Run a mixed step's decode rows apart from `min_keys` keys on (0: never; see
    PagedAttention.runs_apart), on every layer."""
    if min_keys < 0:
        raise ValueError(f"mixed split from {min_keys} keys: give 0 (never) or more")
    for layer in model.layers:
        layer.attn.mixed_split_min_keys = min_keys


def set_attention_backend(model: Model, backend: AttentionBackend) -> None:
    """Run attention on `backend` from the next step on (A/B runs over one set of weights):
    between the backends whose layers run the fused Triton kernels (FUSED_BACKENDS), so
    only attention changes."""
    current = {layer.attn.backend for layer in model.layers}
    if backend not in FUSED_BACKENDS or not current <= set(FUSED_BACKENDS):
        raise ValueError(f"attention backend {backend!r} for a model on {sorted(current)}: "
                         f"switch among {FUSED_BACKENDS} only (build another model for others)")
    for layer in model.layers:
        layer.attn.backend = backend
