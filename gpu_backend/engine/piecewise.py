"""Piecewise CUDA graphs for steps with prefill tokens (`--piecewise-graphs`).

A step with a prefill runs eagerly by default: the host launches every kernel of every layer
(about ten per layer), and on a small model that launch time, not the device, sets the step
time (Qwen2.5-0.5B on the H200: 13-22 ms per step whatever the chunk, with the host's speed
swinging it). As vLLM's piecewise graphs do, this module captures everything between two
attentions (the previous layer's output projection, norm and MLP, the next layer's norm, QKV,
rotary and K/V store) as one graph per layer boundary, for each of a list of token counts;
attention, whose launch depends on the step's sequences, runs eagerly between them.

A step of T tokens replays the graphs of the smallest captured size n >= T: the linear layers
compute n rows, of which the last n - T are padding (slot -1, so they write no K/V; their
rows are never read: attention and sampling see the first T rows only). Attention reads the
step's K/V from the cache only (the graphs wrote them there), as every backend's `attend`
does, so the split backend runs here as in an eager step. The sizes come from
`sim.core.cost_model.piecewise_capture_sizes`, the rule the simulator prices.

Inputs and the layer-boundary tensors live in static buffers of the largest size; the graphs
read and write their first n rows. Without CUDA (tests) the pieces run eagerly over the same
buffers, so the bookkeeping is checked on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from gpu_backend.batch import ForwardBatch
from gpu_backend.model import KVCaches, Model
from sim.core.cost_model import padded_batch, piecewise_capture_sizes

Piece = Callable[[], None]


class PiecewiseGraphs:
    """Per captured size, one graph per layer boundary (num_layers + 1), sharing one pool."""

    def __init__(self, model: Model, kv_caches: KVCaches, max_tokens: int,
                 device: torch.device, sizes: Sequence[int] | None = None) -> None:
        if len(kv_caches) != len(model.layers):
            raise ValueError(f"got {len(kv_caches)} KV caches for {len(model.layers)} layers")
        if any(layer.all_reduce is not None for layer in model.layers):
            raise ValueError("piecewise graphs run one GPU only (no tensor parallelism)")
        self.model, self.kv_caches, self.device = model, kv_caches, device
        self.sizes = tuple(sorted(sizes)) if sizes else piecewise_capture_sizes(max_tokens)
        n = self.sizes[-1]
        spec, dtype = model.spec, model.embed_tokens.weight.dtype
        heads, head_dim = spec.num_attention_heads, spec.head_dim

        def zeros(*shape: int, dtype: torch.dtype = dtype) -> Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.input_ids = zeros(n, dtype=torch.int64)
        self.positions = zeros(n, dtype=torch.int64)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.q = zeros(n, heads, head_dim)  # rotated q of the layer about to attend
        self.attn = zeros(n, heads, head_dim)  # its attention output
        self.residual = zeros(n, spec.hidden_size)
        self.final = zeros(n, spec.hidden_size)  # last layer's output + residual
        self.cuda = device.type == "cuda"
        self.graphs: dict[int, list[torch.cuda.CUDAGraph | Piece]] = {}
        self.pool = None
        self.capture_s = 0.0

    # ------------------------------------------------------------------ pieces
    def _piece(self, index: int, n: int) -> Piece:
        """Layer boundary `index` at n rows: the output half of layer index - 1 (none for 0:
        the embedding) and the input half of layer `index` (none for the last: the sum the
        sampler reads)."""
        layers = self.model.layers

        def run() -> None:
            if index == 0:
                hidden, residual = self.model.embed(self.input_ids[:n]), None
            else:
                hidden, residual = layers[index - 1].post(self.attn[:n], self.residual[:n])
            if index == len(layers):
                self.final[:n].copy_(hidden + residual)
                return
            k_cache, v_cache = self.kv_caches[index]
            q, residual = layers[index].pre(hidden, residual, self.positions[:n],
                                            self.slot_mapping[:n], k_cache, v_cache)
            self.q[:n].copy_(q)
            self.residual[:n].copy_(residual)

        return run

    def capture(self) -> None:
        """Capture every size, largest first (smaller graphs reuse the pool); each piece runs
        once eagerly before its capture so its kernels compile outside it."""
        start = time.perf_counter()
        with torch.no_grad():
            for n in reversed(self.sizes):
                pieces = [self._piece(i, n) for i in range(len(self.model.layers) + 1)]
                for piece in pieces:  # warm-up (padding rows only: slot -1, no K/V written)
                    piece()
                if not self.cuda:
                    self.graphs[n] = list(pieces)
                    continue
                torch.cuda.synchronize(self.device)
                self.graphs[n] = [self._capture_one(piece) for piece in pieces]
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - start

    def _capture_one(self, piece: Piece) -> torch.cuda.CUDAGraph:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            piece()
        return graph

    # ------------------------------------------------------------------- steps
    def bucket(self, num_tokens: int) -> int | None:
        """The captured size a step of `num_tokens` runs at (None: larger than all: eager)."""
        return padded_batch(num_tokens, self.sizes) if self.graphs else None

    def run(self, batch: ForwardBatch, size: int) -> Tensor:
        """Greedy ids [R] of batch.logits_indices (as `Model.forward`)."""
        return self.compute_logits(batch, size).argmax(dim=-1)

    @torch.no_grad()
    def compute_logits(self, batch: ForwardBatch, size: int) -> Tensor:
        """Logits [R, vocab] of batch.logits_indices (as `Model.compute_logits`), the layers
        through the graphs of `size` (>= the batch's tokens)."""
        num_tokens = batch.input_ids.shape[0]
        if not 0 < num_tokens <= size or size not in self.graphs:
            raise ValueError(f"a step of {num_tokens} tokens cannot run the graphs of size "
                             f"{size} (captured: {sorted(self.graphs)})")
        self.input_ids[:num_tokens].copy_(batch.input_ids, non_blocking=True)
        self.positions[:num_tokens].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:num_tokens].copy_(batch.slot_mapping, non_blocking=True)
        self.slot_mapping[num_tokens:size].fill_(-1)  # padding rows store nothing
        layers = self.model.layers
        batch = layers[0].attn.prepare(batch, self.kv_caches[0][0])  # shared by every layer
        q, attn = self.q[:num_tokens], self.attn[:num_tokens]
        for index, piece in enumerate(self.graphs[size]):
            piece.replay() if isinstance(piece, torch.cuda.CUDAGraph) else piece()
            if index < len(layers):
                k_cache, v_cache = self.kv_caches[index]
                layers[index].attn.attend(q, k_cache, v_cache, batch, out=attn)
        hidden, _ = self.model.norm(self.final[:num_tokens][batch.logits_indices])
        return self.model.logits(hidden)

    def release(self) -> None:
        self.graphs.clear()
        self.pool = None
