"""attention_options' shapes and cases: the heads and sizes it runs, the prompts, chunks and
decode rows it builds, the float32 reference every option is checked against, and the
arithmetic over its rows (pairs, FLOPs, chunk penalties, a launch's fixed cost, ranking)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gpu_backend.engine.attention_profile import PagedLayer
from gpu_backend.kernels.attention import DecodePlan, TileConfig, plan_decode_splits
from gpu_backend.kernels.reference import gather_kv

TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 4e-3, torch.float32: 1e-3}


# ----------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class Heads:
    """The attention's shapes: a model's heads and the pool's layout."""
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    device: str

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5


@dataclass(frozen=True)
class Sizes:
    """What the run measures (token counts)."""
    prompts: tuple[int, ...]  # one-pass prompts; the last is the chunked prompt
    chunks: tuple[int, ...]  # chunk sizes of the chunked prompt (the first also sweeps tiles)
    mixed_chunk: int
    mixed_prefixes: tuple[int, ...]
    num_decodes: int
    decode_context: int
    tiles: tuple[TileConfig, ...]  # our kernel's tiles swept beside prefill_config
    check_rows: int  # query rows checked per chunk against the reference
    other_block_size: int  # the pool re-paged at this block size for ours and cuDNN paged
    budget_s: float  # no new option starts past this


LLAMA_8B = Heads(32, 8, 128, 16, torch.bfloat16, "cuda")
TINY = Heads(4, 2, 32, 16, torch.float32, "cpu")  # fp32: the interpreter's bf16 dot is wrong
TILES = (TileConfig(128, 128, 8, 2), TileConfig(128, 128, 8, 4), TileConfig(128, 64, 8, 3),
         TileConfig(128, 64, 4, 3), TileConfig(64, 64, 4, 3), TileConfig(256, 64, 8, 2),
         TileConfig(256, 64, 8, 3), TileConfig(256, 64, 8, 4), TileConfig(256, 128, 8, 2),
         TileConfig(128, 128, 8, 3, longest_first=True),
         TileConfig(256, 64, 8, 3, longest_first=True),
         TileConfig(256, 128, 8, 2, longest_first=True))
FULL = Sizes(prompts=(4096, 8192, 16384), chunks=(2048, 8192), mixed_chunk=2048,
             mixed_prefixes=(0, 8192), num_decodes=64, decode_context=1024, tiles=TILES,
             check_rows=256, other_block_size=64, budget_s=215.0)
SMOKE = Sizes(prompts=(48, 96), chunks=(32, 64), mixed_chunk=32, mixed_prefixes=(0, 32),
              num_decodes=3, decode_context=40,
              tiles=(TileConfig(64, 32, 4, 2), TileConfig(64, 32, 4, 2, longest_first=True)),
              check_rows=1 << 30, other_block_size=32, budget_s=600.0)


def tile_name(tile: TileConfig) -> str:
    order = ", longest first" if tile.longest_first else ""
    return f"{tile.block_m}x{tile.block_n} w{tile.num_warps} s{tile.num_stages}{order}"


# ----------------------------------------------------------------------------- pure helpers

def causal_pairs(new_tokens: int, prefix: int) -> float:
    """(query, key) pairs of a causal chunk over a cached prefix, per head."""
    return new_tokens * (prefix + (new_tokens + 1) / 2.0)


def attention_flops(new_tokens: int, prefix: int, heads: Heads) -> float:
    """Multiply-adds x 2 of QK^T and PV over the keys a causal chunk sees."""
    return 4.0 * heads.head_dim * heads.num_heads * causal_pairs(new_tokens, prefix)


def check_rows(num_rows: int, count: int) -> list[int]:
    """Query rows checked against the reference: all of a short chunk; else the first and
    last quarter of `count` (the diagonal's edges) and the rest spread evenly between."""
    if num_rows <= count:
        return list(range(num_rows))
    edge = count // 4
    middle = count - 2 * edge
    step = (num_rows - 2 * edge) / (middle + 1)
    picked = set(range(edge)) | set(range(num_rows - edge, num_rows))
    picked |= {edge + int(step * (i + 1)) for i in range(middle)}
    return sorted(picked)


def chunk_starts(prompt: int, chunk: int) -> list[tuple[int, int]]:
    """(prefix, new tokens) of each chunk of a prompt."""
    return [(p, min(chunk, prompt - p)) for p in range(0, prompt, chunk)]


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".strip()


def chunk_penalties(rows: Sequence[dict], prompt: int, sdpa_ms: float | None) -> list[dict]:
    """Per option of the chunked rows: sum over chunks / its own one pass (the prompt as
    one chunk) and / SDPA cuDNN's one pass; and where it timed three chunks or more, each
    chunk's time as a fixed cost per launch plus a time per (query, key) pair
    (`launch_split`), beside the one pass's pairs per ms."""
    timed = [r for r in rows if r["section"] == "chunked" and r.get("ms") is not None
             and r.get("correct")]
    out = []
    for name in dict.fromkeys(r["option"] for r in timed):
        mine = {r["chunk"]: r for r in timed if r["option"] == name}
        one = mine[prompt]["ms"] if prompt in mine else None
        for chunk, row in sorted(mine.items()):
            if chunk == prompt:
                continue
            ms = row["ms"]
            out.append({"option": name, "chunk": chunk, "sum_ms": ms,
                        "vs_own_one_pass": ms / one if one else None,
                        "vs_sdpa_cudnn_one_pass": ms / sdpa_ms if sdpa_ms else None,
                        **launch_split(prompt, chunk, row.get("chunk_ms"), one)})
    return out


def launch_split(prompt: int, chunk: int, chunk_ms: Sequence[float] | None,
                 one_ms: float | None) -> dict:
    """A least-squares line through each chunk's time against its pairs: the fixed ms a
    launch costs (`launch_fixed_ms`) and the pairs per ms past it (`pairs_per_ms`), beside
    the one pass's pairs per ms (`one_pass_pairs_per_ms`). Empty under three chunks."""
    starts = chunk_starts(prompt, chunk)
    if not chunk_ms or len(chunk_ms) != len(starts) or len(starts) < 3:
        return {}
    pairs = np.array([causal_pairs(length, start) for start, length in starts])
    slope, fixed = np.polyfit(pairs, np.asarray(chunk_ms, dtype=np.float64), 1)
    return {"launch_fixed_ms": float(fixed), "pairs_per_ms": float(1.0 / slope),
            "one_pass_pairs_per_ms": causal_pairs(prompt, 0) / one_ms if one_ms else None}


def best_options(rows: Sequence[dict], chunk: int, count: int, exclude: str,
                 block_size: int, among: tuple[str, ...] | None = None) -> list[str]:
    """The `count` fastest correct chunked options at `chunk` over the pool's own
    `block_size`, their names not starting with `exclude` (and in `among`, if given)."""
    timed = [r for r in rows if r["section"] == "chunked" and r["chunk"] == chunk
             and r.get("correct") and r.get("ms") is not None
             and r.get("block_size") == block_size and not r["option"].startswith(exclude)
             and (among is None or r["option"] in among)]
    return [r["option"] for r in sorted(timed, key=lambda r: r["ms"])[:count]]


# ----------------------------------------------------------------------------- data

@dataclass
class Prompt:
    """One prompt's queries and keys/values: contiguous, as fresh from the QKV projection,
    and the same values in a paged layer with its blocks shuffled over the pool."""
    q: Tensor  # [T, H, D]
    keys: Tensor  # [T, KVH, D]
    values: Tensor  # [T, KVH, D]
    layer: PagedLayer  # k, v: [num_blocks, block_size, KVH, D]; tables [S, max_blocks]
    row: int  # the prompt's row in layer.tables


@dataclass(frozen=True)
class Chunk:
    """`length` new tokens of a prompt over its first `prefix` tokens (already cached)."""
    prompt: Prompt
    prefix: int
    length: int

    @property
    def q(self) -> Tensor:
        return self.prompt.q[self.prefix:self.prefix + self.length]

    @property
    def keys(self) -> Tensor:  # the chunk's own keys [c, KVH, D]
        return self.prompt.keys[self.prefix:self.prefix + self.length]

    @property
    def values(self) -> Tensor:
        return self.prompt.values[self.prefix:self.prefix + self.length]

    @property
    def seq_len(self) -> int:
        return self.prefix + self.length

    @property
    def table(self) -> Tensor:  # [1, max_blocks] int32
        return self.prompt.layer.tables[self.prompt.row:self.prompt.row + 1]


@dataclass
class Decodes:
    """Decode rows (one query token each) in the same layer, table rows 0..n-1."""
    q: Tensor  # [n, H, D]
    seq_lens: Tensor  # [n] int32
    query_start_loc: Tensor  # [n + 1] int32
    tables: Tensor  # [n, max_blocks]
    plan: DecodePlan | None  # made once per step for every layer, as the engine does
    context: int


def make_prompt(heads: Heads, tokens: int, decode_contexts: Sequence[int] = ()) -> Prompt:
    """A layer holding decode sequences (first) and the prompt; values random."""
    layer = PagedLayer(list(decode_contexts) + [tokens], heads.num_kv_heads, heads.head_dim,
                       heads.dtype, heads.block_size, heads.device)
    row = len(decode_contexts)
    keys = gather_kv(layer.k, layer.tables[row], tokens).contiguous()
    values = gather_kv(layer.v, layer.tables[row], tokens).contiguous()
    q = torch.randn(tokens, heads.num_heads, heads.head_dim, device=heads.device,
                    dtype=heads.dtype)
    return Prompt(q, keys, values, layer, row)


def make_decodes(heads: Heads, prompt: Prompt, count: int, context: int) -> Decodes:
    dev = heads.device
    seq_lens = torch.full((count,), context, dtype=torch.int32, device=dev)
    qsl = torch.arange(count + 1, dtype=torch.int32, device=dev)
    q = torch.randn(count, heads.num_heads, heads.head_dim, device=dev, dtype=heads.dtype)
    tables = prompt.layer.tables[:count]
    plan = plan_decode_splits(seq_lens, heads.num_kv_heads)
    return Decodes(q, seq_lens, qsl, tables, plan, context)


# ----------------------------------------------------------------------------- reference

def reference_rows(q: Tensor, keys: Tensor, values: Tensor, visible: Tensor,
                   scale: float) -> Tensor:
    """float32 attention of query rows q [R, H, D] over keys/values [L, KVH, D]; row r sees
    keys [0, visible[r]). Query head h reads KV head h // (H // KVH), as the kernels do."""
    rows, num_heads, head_dim = q.shape
    num_kv = keys.shape[1]
    qg = q.float().view(rows, num_kv, num_heads // num_kv, head_dim)
    scores = torch.einsum("rkgd,lkd->kgrl", qg, keys.float()) * scale
    seen = torch.arange(keys.shape[0], device=q.device)[None, :] < visible[:, None]  # [R, L]
    probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
    return torch.einsum("kgrl,lkd->rkgd", probs, values.float()).reshape(rows, num_heads,
                                                                          head_dim)


def chunk_error(chunk: Chunk, out: Tensor, count: int, scale: float) -> float:
    """Max abs error of a chunk's output [c, H, D] on its checked rows."""
    rows = check_rows(chunk.length, count)
    idx = torch.tensor(rows, device=out.device)
    keys = chunk.prompt.keys[:chunk.seq_len]
    values = chunk.prompt.values[:chunk.seq_len]
    err = 0.0
    for part in idx.split(64):
        ref = reference_rows(chunk.q[part], keys, values, chunk.prefix + part + 1, scale)
        err = max(err, (out[part].float() - ref).abs().max().item())
    return err


def decode_error(decodes: Decodes, layer: PagedLayer, out: Tensor, scale: float) -> float:
    """Max abs error of the decode rows' outputs [n, H, D] (each sees its whole context)."""
    visible = torch.tensor([decodes.context], device=out.device)
    err = 0.0
    for i in range(decodes.q.shape[0]):
        keys = gather_kv(layer.k, decodes.tables[i], decodes.context)
        values = gather_kv(layer.v, decodes.tables[i], decodes.context)
        ref = reference_rows(decodes.q[i:i + 1], keys, values, visible, scale)
        err = max(err, (out[i:i + 1].float() - ref).abs().max().item())
    return err
