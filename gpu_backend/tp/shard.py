"""The per-rank model: a Megatron-style shard of the same full random model.

    qkv_proj      column parallel: this rank's heads/tp query heads and kv_heads/tp KV heads
                  (one replicated KV head per rank when tp > kv_heads, as vLLM does)
    o_proj        row parallel over the same query heads, then all-reduce (sum)
    gate_up_proj  column parallel: intermediate/tp gate rows and the matching up rows
    down_proj     row parallel over those rows, then all-reduce
    embed_tokens  vocab parallel: rows [rank x V/tp, (rank+1) x V/tp); ids outside the shard
                  give zeros and an all-reduce sums the one non-zero row (vLLM's
                  VocabParallelEmbedding), so a tied lm_head is the same shard
    lm_head       vocab parallel; the [R, V/tp] logits are all-gathered to [R, V] and every
                  rank takes the same argmax (the simulator's sampler peak models that gather)
    norms         replicated

Weights: the full model's parameters are drawn in the order and with the generator of
`Model.init_weights` (one full tensor at a time, on the device), and each rank keeps its
slice, so TP=N computes the TP=1 model exactly (up to the summation order of all-reduces).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from gpu_backend.model import INIT_STD, Model, set_fused
from gpu_backend.tp.group import TpGroup
from sim.core.catalog import ModelSpec


def shard_spec(spec: ModelSpec, tp: int) -> ModelSpec:
    """The shapes one rank holds (heads, KV heads, intermediate and vocabulary split)."""
    for label, size in (("num_attention_heads", spec.num_attention_heads),
                        ("intermediate_size", spec.intermediate_size),
                        ("vocab_size", spec.vocab_size)):
        if size % tp:
            raise ValueError(f"{spec.name}: {label} {size} is not divisible by "
                             f"--tensor-parallel-size {tp}; use a TP degree that divides it")
    kv = spec.num_kv_heads
    if kv % tp and tp % kv:
        raise ValueError(f"{spec.name}: {kv} KV heads cannot be split or replicated over "
                         f"{tp} ranks; use a TP degree that divides or is a multiple of {kv}")
    return replace(spec, name=f"{spec.name}/tp{tp}",
                   num_attention_heads=spec.num_attention_heads // tp,
                   num_kv_heads=spec.kv_heads_per_gpu(tp),
                   intermediate_size=spec.intermediate_size // tp,
                   vocab_size=spec.vocab_size // tp)


def kv_head_range(num_kv_heads: int, tp: int, rank: int) -> tuple[int, int]:
    """[first, last) KV heads of `rank`: split when tp <= kv heads, else one replicated head
    (the head this rank's query heads attend to)."""
    if tp <= num_kv_heads:
        per = num_kv_heads // tp
        return rank * per, (rank + 1) * per
    head = rank // (tp // num_kv_heads)
    return head, head + 1


def take_shard(name: str, full: Tensor, spec: ModelSpec, tp: int, rank: int) -> Tensor:
    """This rank's slice of the full parameter `name` (shapes as in gpu_backend/model.py)."""
    d = spec.head_dim
    q_per = spec.num_attention_heads // tp * d
    q_rows = slice(rank * q_per, (rank + 1) * q_per)
    if name.endswith(("qkv_proj.weight", "qkv_proj.bias")):
        q_size, kv_size = spec.num_attention_heads * d, spec.num_kv_heads * d
        q, k, v = full.split([q_size, kv_size, kv_size], dim=0)
        first, last = kv_head_range(spec.num_kv_heads, tp, rank)
        kv_rows = slice(first * d, last * d)
        return torch.cat([q[q_rows], k[kv_rows], v[kv_rows]], dim=0)
    if name.endswith("o_proj.weight"):
        return full[:, q_rows]
    inter = spec.intermediate_size // tp
    if name.endswith("gate_up_proj.weight"):
        gate, up = full.chunk(2, dim=0)
        rows = slice(rank * inter, (rank + 1) * inter)
        return torch.cat([gate[rows], up[rows]], dim=0)
    if name.endswith("down_proj.weight"):
        return full[:, rank * inter:(rank + 1) * inter]
    if name in ("embed_tokens.weight", "lm_head.weight"):
        per = spec.vocab_size // tp
        return full[rank * per:(rank + 1) * per]
    return full  # norms: replicated


class TpModel(Model):
    """`Model` over this rank's shard shapes, with the TP collectives hooked in."""

    def __init__(self, spec: ModelSpec, group: TpGroup, **kwargs) -> None:
        super().__init__(shard_spec(spec, group.world_size), **kwargs)
        self.full_spec, self.group = spec, group
        self.vocab_per_rank = spec.vocab_size // group.world_size
        self.vocab_start = group.rank * self.vocab_per_rank
        for layer in self.layers:
            layer.all_reduce = group.all_reduce_

    def embed(self, input_ids: Tensor) -> Tensor:
        local = input_ids - self.vocab_start  # [T]
        outside = (local < 0) | (local >= self.vocab_per_rank)
        hidden = self.embed_tokens(local.clamp(0, self.vocab_per_rank - 1))  # [T, hidden]
        hidden = hidden.masked_fill(outside[:, None], 0)
        return self.group.all_reduce_(hidden)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.group.all_gather_last(super().logits(hidden))  # [R, vocab]

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Draw each full parameter as `Model.init_weights` does and keep this rank's slice."""
        self._full = _full_shapes(self)
        try:
            super().init_weights(seed)
        finally:
            del self._full

    def _draw_weight(self, name: str, param: Tensor, gen: torch.Generator) -> None:
        full = torch.empty(self._full[name], dtype=param.dtype, device=param.device)
        full.normal_(0.0, INIT_STD, generator=gen)
        param.copy_(take_shard(name, full, self.full_spec, self.group.world_size,
                               self.group.rank))


def _full_shapes(model: TpModel) -> dict[str, torch.Size]:
    """Parameter shapes of the unsharded model (built on the meta device: no memory)."""
    layer = model.layers[0]
    with torch.device("meta"):
        full = Model(model.full_spec, qkv_bias=layer.qkv_proj.bias is not None,
                     dtype=layer.qkv_proj.weight.dtype, attention_backend=layer.attn.backend,
                     max_position=2)
    return {name: p.shape for name, p in full.named_parameters()}


def build_tp_model(spec: ModelSpec, group: TpGroup, device: torch.device | str,
                   dtype: torch.dtype = torch.bfloat16, qkv_bias: bool = False,
                   rope_theta: float = 500000.0, seed: int = 0,
                   attention_backend: str = "triton", max_position: int = 131072,
                   fused: bool = True) -> TpModel:
    """This rank's shard of `build_model(spec, ..., seed=seed)`."""
    with torch.device("meta"):
        model = TpModel(spec, group, qkv_bias=qkv_bias, rope_theta=rope_theta, dtype=dtype,
                        attention_backend=attention_backend, max_position=max_position)
    model.to_empty(device=device)
    model.init_weights(seed)
    set_fused(model, fused)
    return model.requires_grad_(False).eval()
