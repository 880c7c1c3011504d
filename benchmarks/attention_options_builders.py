"""attention_options' ways to run a chunk's attention: the Option record, builders for our
paged kernel, torch SDPA, FA2 varlen and FlexAttention (over the pool, over keys gathered
from it, or over the pool re-paged), and the mixed steps that run decode rows beside a chunk."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
from attention_options_cases import Chunk, Decodes, Prompt
from torch import Tensor

from gpu_backend.engine.attention_profile import PagedLayer
from gpu_backend.kernels import paged_attention
from gpu_backend.kernels.attention import TileConfig

ChunkFn = Callable[[], Tensor]  # one chunk's attention -> out [c, H, D] (any strides)
Builder = Callable[[Chunk], ChunkFn]  # set-up (compiles, buffers, graphs) is not timed


@dataclass(frozen=True)
class Option:
    """A way to run the attention. build: a Builder, or for mixed steps (chunk, decodes) ->
    MixedFn; needs_frontend: the cuDNN frontend (its probe passed); flashinfer: the
    FlashInfer backend it runs (its probe built and checked that backend's kernels);
    block_size: the pool re-paged at this block size (None: the engine's own)."""
    name: str
    build: Callable
    needs_cuda: bool = True
    needs_frontend: bool = False
    note: str = ""
    block_size: int | None = None
    flashinfer: str | None = None


def bhsd(x: Tensor) -> Tensor:
    """[T, H, D] token-major -> [1, H, T, D] view: SDPA's layout with BSHD strides."""
    return x.transpose(0, 1).unsqueeze(0)


def tokens(x: Tensor) -> Tensor:
    """[1, H, T, D] -> [T, H, D] view."""
    return x[0].transpose(0, 1)


def expand_heads(x: Tensor, group: int) -> Tensor:
    """[T, KVH, D] -> [T, KVH * group, D]: each KV head repeated for its query heads."""
    return x.repeat_interleave(group, dim=1)


def scale_of(chunk: Chunk) -> float:
    return chunk.q.shape[-1] ** -0.5


def require_no_prefix(chunk: Chunk, why: str) -> None:
    if chunk.prefix:
        raise ValueError(f"one pass only: {why}")


def ours(tile: TileConfig | None = None) -> Builder:
    """The engine's paged kernel on one sequence (tile None: prefill_config)."""
    def build(chunk: Chunk) -> ChunkFn:
        dev = chunk.q.device
        seq_lens = torch.tensor([chunk.seq_len], dtype=torch.int32, device=dev)
        qsl = torch.tensor([0, chunk.length], dtype=torch.int32, device=dev)
        layer = chunk.prompt.layer
        return lambda: paged_attention(
            chunk.q, layer.k, layer.v, chunk.table, seq_lens, qsl, scale_of(chunk),
            max_query_len=chunk.length, max_seq_len=chunk.seq_len, tile_config=tile)
    return build


def sdpa(backend_name: str, gqa: bool) -> Builder:
    """torch SDPA with one backend forced; gqa False: K/V heads expanded beforehand."""
    def build(chunk: Chunk) -> ChunkFn:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        require_no_prefix(chunk, "SDPA's is_causal mask is top-left aligned")
        backend = getattr(SDPBackend, backend_name)
        k, v = chunk.keys, chunk.values
        if not gqa:
            group = chunk.q.shape[1] // k.shape[1]
            k, v = expand_heads(k, group), expand_heads(v, group)
        q4, k4, v4 = bhsd(chunk.q), bhsd(k), bhsd(v)

        def run() -> Tensor:
            with sdpa_kernel([backend]):
                return tokens(torch.nn.functional.scaled_dot_product_attention(
                    q4, k4, v4, is_causal=True, scale=scale_of(chunk), enable_gqa=gqa))
        return run
    return build


class Gather:
    """A sequence's first `length` paged keys and values copied into contiguous
    [length, KVH, D] buffers, one index_select each: token-major, which SDPA ops read as
    BSHD and FA2 varlen as its packed layout. `padded_to` keys of buffer (zeros past
    `length`) give every chunk of a size one shape."""

    def __init__(self, layer: PagedLayer, table_row: Tensor, length: int,
                 padded_to: int | None = None) -> None:
        block_size, num_kv, head_dim = layer.k.shape[1:]
        num_blocks = triton.cdiv(length, block_size)
        total = triton.cdiv(max(length, padded_to or 0), block_size)
        self.index = table_row[:num_blocks]
        self.k = torch.zeros(total, block_size, num_kv, head_dim, dtype=layer.k.dtype,
                             device=layer.k.device)
        self.v = torch.zeros_like(self.k)
        self.layer, self.num_blocks = layer, num_blocks
        self.length = padded_to or length

    def __call__(self) -> tuple[Tensor, Tensor]:
        torch.index_select(self.layer.k, 0, self.index, out=self.k[:self.num_blocks])
        torch.index_select(self.layer.v, 0, self.index, out=self.v[:self.num_blocks])
        shape = (-1, *self.k.shape[2:])
        return self.k.view(shape)[:self.length], self.v.view(shape)[:self.length]


def fa2_varlen(gather: bool) -> Builder:
    """aten._flash_attention_forward, varlen (cu_seqlens), causal bottom-right; gather:
    prefix + chunk keys gathered from the pool (timed), else the chunk's own keys."""
    def build(chunk: Chunk) -> ChunkFn:
        if not gather:
            require_no_prefix(chunk, "without the gather it sees only the chunk's keys")
        dev = chunk.q.device
        cu_q = torch.tensor([0, chunk.length], dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0, chunk.seq_len], dtype=torch.int32, device=dev)
        fetch = Gather(chunk.prompt.layer, chunk.table[0], chunk.seq_len) if gather else None

        def run() -> Tensor:
            k, v = fetch() if fetch is not None else (chunk.keys, chunk.values)
            return torch.ops.aten._flash_attention_forward(
                chunk.q, k, v, cu_q, cu_k, chunk.length, chunk.seq_len, 0.0, True, False,
                scale=scale_of(chunk))[0]
        return run
    return build


def reblocked(prompt: Prompt, block_size: int) -> Prompt:
    """The same one-sequence prompt in a pool of `block_size`-token blocks (shuffled)."""
    tokens_, num_kv, head_dim = prompt.keys.shape
    layer = PagedLayer([tokens_], num_kv, head_dim, prompt.keys.dtype, block_size,
                       str(prompt.keys.device))
    blocks = triton.cdiv(tokens_, block_size)
    index = layer.tables[0, :blocks].long()
    for cache, data in ((layer.k, prompt.keys), (layer.v, prompt.values)):
        padded = torch.zeros(blocks * block_size, num_kv, head_dim, dtype=data.dtype,
                             device=data.device)
        padded[:tokens_] = data
        cache[index] = padded.view(blocks, block_size, num_kv, head_dim)
    return Prompt(prompt.q, prompt.keys, prompt.values, layer, 0)


def on_blocks(build: Builder, block_size: int) -> Builder:
    """`build` over the prompt re-paged in `block_size`-token blocks (made once per
    prompt, untimed)."""
    made: list[tuple[Prompt, Prompt]] = []

    def wrapped(chunk: Chunk) -> ChunkFn:
        if not made or made[0][0] is not chunk.prompt:
            made[:] = [(chunk.prompt, reblocked(chunk.prompt, block_size))]
        return build(Chunk(made[0][1], chunk.prefix, chunk.length))
    return wrapped


@functools.cache
def compiled_flex() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def flex_causal(device: str) -> tuple[Callable, Tensor]:
    """One bottom-right causal mask_mod per device and the prefix it reads: the same function
    and tensor for every chunk, so the compiled kernel is reused (the prefix is set before
    each call)."""
    offset = torch.zeros((), dtype=torch.int32, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset
    return mask_mod, offset


def flex(padded_to: int | None) -> Builder:
    """Compiled FlexAttention with a block mask. padded_to None: one pass over the prompt's
    own keys; else the prefix + chunk keys gathered from the pool (timed) into a buffer of
    `padded_to` keys, so each chunk size compiles once."""
    def build(chunk: Chunk) -> ChunkFn:
        from torch.nn.attention.flex_attention import create_block_mask

        if padded_to is None:
            require_no_prefix(chunk, "use the gathered variant over a prefix")
        mask_mod, offset = flex_causal(str(chunk.q.device))
        fetch = (Gather(chunk.prompt.layer, chunk.table[0], chunk.seq_len, padded_to)
                 if padded_to else None)
        kv_len = padded_to or chunk.length
        offset.fill_(chunk.prefix)
        mask = create_block_mask(mask_mod, None, None, chunk.length, kv_len,
                                 device=str(chunk.q.device))
        q4, attend = bhsd(chunk.q), compiled_flex()

        def run() -> Tensor:
            offset.fill_(chunk.prefix)
            k, v = fetch() if fetch is not None else (chunk.keys, chunk.values)
            return tokens(attend(q4, bhsd(k), bhsd(v), block_mask=mask, scale=scale_of(chunk),
                                 enable_gqa=True))
        return run
    return build


# ----------------------------------------------------------------------------- mixed steps

MixedFn = Callable[[], tuple[Tensor, Tensor]]  # -> (decode rows' out, chunk's out)


def decode_path(chunk: Chunk, decodes: Decodes) -> ChunkFn:
    """Our decode launch over the decode rows, with the step's split plan."""
    layer = chunk.prompt.layer
    return lambda: paged_attention(decodes.q, layer.k, layer.v, decodes.tables,
                                   decodes.seq_lens, decodes.query_start_loc, scale_of(chunk),
                                   max_query_len=1, plan=decodes.plan)


def mixed_one_launch(tile: TileConfig | None = None) -> Callable[[Chunk, Decodes], MixedFn]:
    """Ours as the engine runs a mixed step: decode rows first, then the chunk, one launch
    (tile None: prefill_config; the decode rows run in the same tiles)."""
    def make(chunk: Chunk, decodes: Decodes) -> MixedFn:
        return _one_launch(chunk, decodes, tile)
    return make


def _one_launch(chunk: Chunk, decodes: Decodes, tile: TileConfig | None) -> MixedFn:
    layer, n = chunk.prompt.layer, decodes.q.shape[0]
    q = torch.cat([decodes.q, chunk.q])
    dev = q.device
    seq_lens = torch.cat([decodes.seq_lens, torch.tensor([chunk.seq_len], dtype=torch.int32,
                                                         device=dev)])
    qsl = torch.cat([decodes.query_start_loc,
                     torch.tensor([n + chunk.length], dtype=torch.int32, device=dev)])
    tables = layer.tables[:n + 1]
    max_seq = max(decodes.context, chunk.seq_len)

    def run() -> tuple[Tensor, Tensor]:
        out = paged_attention(q, layer.k, layer.v, tables, seq_lens, qsl, scale_of(chunk),
                              max_query_len=chunk.length, max_seq_len=max_seq,
                              tile_config=tile)
        return out[:n], out[n:]
    return run


def mixed_beside_decodes(build: Builder) -> Callable[[Chunk, Decodes], MixedFn]:
    """The decode rows through our decode path, then the chunk through `build`."""
    def make(chunk: Chunk, decodes: Decodes) -> MixedFn:
        rows, attend = decode_path(chunk, decodes), build(chunk)
        return lambda: (rows(), attend())
    return make


def decode_rows_alone(chunk: Chunk, decodes: Decodes) -> Callable[[], tuple[Tensor, None]]:
    """The step's decode rows only: the floor a chunk beside them adds to."""
    rows = decode_path(chunk, decodes)
    return lambda: (rows(), None)
