"""Prefill and mixed-step attention: the candidate kernels side by side on one GPU.

The engine's attention runs our Triton paged kernel (gpu_backend/kernels). This times each
way the engine could run a prefill or mixed step's attention, per layer, on the device alone
(CUDA events, median; Llama-3.1-8B heads: 32 query, 8 KV, head_dim 128, bf16; a pool of
16-token blocks in shuffled order):

1. one pass, prompts of 4,096 / 8,192 / 16,384 tokens: our kernel (its prefill tile, and a
   short sweep of tiles at 16,384); torch SDPA with each backend forced, with GQA and with
   K/V heads expanded beforehand (the copy not timed); the aten cuDNN and flash ops that also
   return the log-sum-exp; FA2 varlen; compiled FlexAttention with a causal block mask;
   cuDNN's own SDPA over the paged pool (cuDNN frontend, `cudnn` package); FlashInfer's
   batch prefill over the paged pool in place, its fa3 (Hopper) and fa2 kernels.
2. chunked: the 16,384-token prompt in chunks of 2,048 and 8,192 over its cached prefix, the
   sum over chunks (and the whole prompt as one chunk, the same code path): ours; SPLIT, the
   chunk's own keys (causal square) through an SDPA op with LSE plus the prefix keys either
   gathered from the pool then the same op, or our kernel over the paged prefix, merged by
   their LSEs (gather and merge timed; SPLIT's steps also timed one by one); FA2 varlen and
   cuDNN (dense K/V, bottom-right causal) on the gathered prefix + chunk; FlexAttention on
   gathered keys padded to the prompt (one compile per chunk size); cuDNN paged with a
   bottom-right causal mask; FlashInfer paged; ours, cuDNN paged and FlashInfer over the
   pool re-paged in 64-token blocks.
3. mixed: a 2,048-token chunk (prefix 0 and 8,192) beside 64 decodes of 1,024 keys: ours in
   one launch and in two (decode rows through the decode path, then the chunk), the two best
   other options of 2 on the pool's own blocks with the decode rows through our decode path,
   cuDNN paged and FlashInfer each in one ragged call, and the decode rows alone (the
   floor); device time and the host's time to launch the call while the GPU is busy; and
   FlashInfer's plan of the step (host time, once per step for every layer).

Every option is checked against a float32 reference on sampled query rows (every row of a
small shape); one over the tolerance is reported wrong and never ranked. One that fails
records the first line of its error and the run goes on; the cuDNN frontend and each
FlashInfer backend are first tried in a child process so that a fault there cannot take the
run's CUDA context with it (FlashInfer's child also builds its kernels: about 90 s for fa3 and
40 s for fa2 on 16 cores the first time, then loaded from its cache).

Targets: prefill attention within 1.2x of SDPA cuDNN's one pass on the same shape; the chunk
penalty (sum over chunks of 2,048 / one pass of 16,384) at most ~2% beyond the decode work.

Measured (H200, torch 2.11+cu130, triton 3.6, cuDNN 9.19, frontend 1.23; per layer, 16,384
tokens, two runs): SDPA cuDNN one pass 3.29-3.35 ms (GQA native, LSE free); ours 6.0 ms one
pass (5.2 with a 256x128 or 256x64 tile), 6.6-6.7 ms in chunks of 2,048; SPLIT (cuDNN square
+ gathered prefix + merge) 1.12-1.14x SDPA's one pass at chunk 2,048 (square 0.66, gather
0.16, prefix 2.85, merge 0.11 ms) and 1.03-1.04x at 8,192; cuDNN paged 1.19-1.21x one pass,
1.33-1.35x at 2,048 on 16-token blocks, 1.06-1.07x and 1.20-1.21x on 64-token blocks. Beside
64 decodes, a 2,048 chunk over 8,192 cached: ours 1.04 ms, SPLIT + our decode launch 0.60 ms
(the decode rows alone 0.08), but SPLIT's eager launches take the host ~1 ms.
FlashInfer 0.7.4 (H200, 2026-12-06): fa3 over the pool's 16-token blocks in place 3.64 ms one
pass (1.08x), 3.96 ms in chunks of 2,048 (1.18x; 1.085x its own one pass), the same on 64-token
blocks; fa2 6.24 ms one pass; beside 64 decodes, the 2,048 chunk over 8,192 cached through fa3
and our decode launch 0.63 ms, fa3 in one ragged call 0.87 ms; fa3's plan 0.7-1.0 ms of host.
Our tiles on an H100 80GB HBM3 (2026-12-06, `--only 'ours*,sdpa cudnn*'`): 5.91 ms one pass,
6.63 ms in chunks of 2,048 (SDPA cuDNN 3.33 ms); longest first 5.95 / 6.49 ms; 256x128 w8 s2
5.19 / 6.12 ms, 5.13 / 6.12 ms longest first.

Each chunked option's chunk times are also split into a fixed cost per launch and a rate over
the pairs (least squares over the chunks), beside its one pass's rate: on every kernel the
chunking cost is the fixed part (docs/engine.md, "The kernels' chunking cost is a fixed cost per
launch"); `--report RESULT` prints a saved result's report with it.

Usage:
    python benchmarks/attention_options.py [--out PATH]   # CUDA GPU, about 2 minutes
    python benchmarks/attention_options.py --smoke        # CPU: tiny shapes, Triton's
                                                          # interpreter, CUDA-only options skipped
    python benchmarks/attention_options.py --report RESULT  # a saved result's report, no GPU
The cuDNN frontend options need `pip install --no-deps nvidia-cudnn-frontend==1.23.0` (it
loads the libcudnn torch ships), the FlashInfer options `pip install 'elastic-kv[flashinfer]'`
and nvcc; without them they record the error. `--only` runs the options its patterns name.
"""

from __future__ import annotations

import os
import sys

if "--smoke" in sys.argv:  # the interpreter must be chosen before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import faulthandler  # noqa: E402
import fnmatch  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator, Sequence  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch import Tensor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_backend.engine.attention_profile import PagedLayer  # noqa: E402
from gpu_backend.engine.attention_profile import device_ms as profile_device_ms  # noqa: E402
from gpu_backend.env import device_environment, versions, write_result  # noqa: E402
from gpu_backend.kernels import paged_attention  # noqa: E402
from gpu_backend.kernels.attention import (  # noqa: E402
    DecodePlan,
    TileConfig,
    plan_decode_splits,
    prefill_config,
)
from gpu_backend.kernels.attention_kernel import LOG2E, _attend_tile  # noqa: E402
from gpu_backend.kernels.flashinfer_attention import FlashInferPrefill, page_lists  # noqa: E402
from gpu_backend.kernels.lse_merge import merge_partials  # noqa: E402
from gpu_backend.kernels.reference import gather_kv  # noqa: E402

OPTION_TIMEOUT_S = 75.0  # one option (compiles included) is abandoned past this
HARD_LIMIT_S = 330.0  # the process dumps its stacks and exits past this (results so far kept)
FLASHINFER_BUILD_S = 420.0  # FlashInfer's JIT may build this long per backend (not in the above)
BUSY_CYCLES = 20_000_000  # ~10 ms of GPU sleep queued while the host launch is timed
QUEUE_AHEAD_CYCLES = 10_000_000  # ~5 ms of GPU sleep queued before each device-timed call
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


# ----------------------------------------------------------------------------- Triton parts

@triton.jit
def prefix_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, out_ptr, lse_ptr,
    prefix_len, query_len, scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Every query row of a chunk over all `prefix_len` paged keys (no causal mask): the
    normalised output (float32) and the natural log-sum-exp of the scaled scores, for a
    merge with the chunk's own causal square. Tiles pack the GQA group as the engine's
    kernel does, and walk keys with its `_attend_tile`."""
    q0 = tl.program_id(0) * BLOCK_Q
    kv_head = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    q_pos = q0 + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_valid = (offs_m < BLOCK_Q * GROUP) & (q_pos < query_len)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_valid = offs_d < HEAD_DIM
    io_mask = row_valid[:, None] & d_valid[None, :]
    q_rows = q_pos.to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=io_mask, other=0.0)
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    whole = prefix_len // BLOCK_N * BLOCK_N
    # every row sees every key below prefix_len: pass prefix_len as the causal offset
    for start_n in range(0, whole, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start_n, block_table_ptr, k_base, v_base, q_pos, prefix_len,
            prefix_len, offs_d, d_valid, stride_kb, stride_ks, stride_vb, stride_vs,
            scale_log2, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N, False)
    for start_n in range(whole, prefix_len, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start_n, block_table_ptr, k_base, v_base, q_pos, prefix_len,
            prefix_len, offs_d, d_valid, stride_kb, stride_ks, stride_vb, stride_vs,
            scale_log2, HEAD_DIM, HEAD_DIM_PAD, BLOCK_SIZE, BLOCK_N, True)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o_rows = q_pos.to(tl.int64) * stride_ot + head * stride_oh
    tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], acc / l_safe[:, None], mask=io_mask)
    lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453  # log2 units -> natural log
    tl.store(lse_ptr + q_pos.to(tl.int64) * stride_lt + head * stride_lh, lse, mask=row_valid)


def prefix_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, table_row: Tensor,
                     prefix_len: int, scale: float, out: Tensor, lse: Tensor,
                     tile: TileConfig) -> None:
    """Launch prefix_attention_kernel: q [c, H, D]; out [c, H, D] float32; lse [c, H]."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv = k_cache.shape[2]
    group = num_heads // num_kv
    block_q = tile.block_m // group
    prefix_attention_kernel[(triton.cdiv(num_tokens, block_q), num_kv)](
        q, k_cache, v_cache, table_row, out, lse, prefix_len, num_tokens, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=k_cache.shape[1], GROUP=group, HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim), BLOCK_M=tile.block_m, BLOCK_Q=block_q,
        BLOCK_N=tile.block_n, num_warps=tile.num_warps, num_stages=tile.num_stages)


# ----------------------------------------------------------------------------- options

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


@dataclass(frozen=True)
class LseOp:
    """An aten SDPA op that also returns the log-sum-exp, which merging two partial
    attentions needs. kernel: "cudnn", "flash" (CUDA) or "cpu"; expand: K/V heads expanded
    to the query heads inside the call (timed)."""
    kernel: str
    expand: bool

    @property
    def name(self) -> str:
        return f"aten {self.kernel} +lse ({'kv expanded' if self.expand else 'gqa'})"

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, causal: bool,
                 scale: float) -> tuple[Tensor, Tensor]:
        """q [S, H, D], k, v [L, KVH, D] -> out [S, H, D], natural lse [S, H] (views).
        causal: top-left aligned, so only for the square (S == L)."""
        if self.expand:
            group = q.shape[1] // k.shape[1]
            k, v = expand_heads(k, group), expand_heads(v, group)
        q4, k4, v4 = bhsd(q), bhsd(k), bhsd(v)
        aten = torch.ops.aten
        if self.kernel == "cudnn":
            out, lse = aten._scaled_dot_product_cudnn_attention(
                q4, k4, v4, None, True, 0.0, causal, False, scale=scale)[:2]
        elif self.kernel == "flash":
            out, lse = aten._scaled_dot_product_flash_attention(
                q4, k4, v4, 0.0, causal, False, scale=scale)[:2]
        else:
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
                q4, k4, v4, 0.0, causal, scale=scale)
        if lse.dim() == 4:  # [B, H, S, 1] in some versions
            lse = lse[..., 0]
        return tokens(out), lse[0].transpose(0, 1)


def lse_one_pass(op: LseOp) -> Builder:
    def build(chunk: Chunk) -> ChunkFn:
        require_no_prefix(chunk, "the op's causal mask is top-left aligned")
        return lambda: op(chunk.q, chunk.keys, chunk.values, True, scale_of(chunk))[0]
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


def split(op: LseOp, prefix_by_ours: bool) -> Builder:
    """SPLIT: the chunk's own keys (causal square) through `op` with its LSE; the prefix
    keys (every row sees all) either gathered then `op`, or our paged prefix kernel; then
    the two merged by their LSEs. Gather, both parts and the merge are timed."""
    def build(chunk: Chunk) -> ChunkFn:
        scale = scale_of(chunk)

        def own() -> tuple[Tensor, Tensor]:
            return op(chunk.q, chunk.keys, chunk.values, True, scale)
        if chunk.prefix == 0:
            return lambda: own()[0]
        layer, out = chunk.prompt.layer, torch.empty_like(chunk.q)
        if prefix_by_ours:
            part = torch.empty(chunk.q.shape, dtype=torch.float32, device=out.device)
            part_lse = torch.empty(chunk.q.shape[:2], dtype=torch.float32, device=out.device)
            tile = prefill_config(chunk.q.shape[-1])

            def prefix() -> tuple[Tensor, Tensor]:
                prefix_attention(chunk.q, layer.k, layer.v, chunk.table[0], chunk.prefix,
                                 scale, part, part_lse, tile)
                return part, part_lse
        else:
            fetch = Gather(layer, chunk.table[0], chunk.prefix)

            def prefix() -> tuple[Tensor, Tensor]:
                k, v = fetch()
                return op(chunk.q, k, v, False, scale)

        def run() -> Tensor:
            a, lse_a = own()
            b, lse_b = prefix()
            return merge_partials(out, a, lse_a, b, lse_b)
        return run
    return build


def split_parts(op: LseOp, chunk: Chunk) -> dict[str, ChunkFn]:
    """SPLIT with the gathered prefix, step by step, each callable alone: where its time
    goes (the square; with a prefix also the gather, the prefix's attention, the merge)."""
    scale = scale_of(chunk)
    parts: dict[str, ChunkFn] = {
        "square": lambda: op(chunk.q, chunk.keys, chunk.values, True, scale)[0]}
    if chunk.prefix == 0:
        return parts
    fetch = Gather(chunk.prompt.layer, chunk.table[0], chunk.prefix)
    k, v = fetch()
    a, lse_a = op(chunk.q, chunk.keys, chunk.values, True, scale)
    b, lse_b = op(chunk.q, k, v, False, scale)
    out = torch.empty_like(chunk.q)
    parts.update({"gather": lambda: fetch()[0],
                  "prefix": lambda: op(chunk.q, k, v, False, scale)[0],
                  "merge": lambda: merge_partials(out, a, lse_a, b, lse_b)})
    return parts


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


# ----------------------------------------------------------------------------- cuDNN frontend

@functools.cache
def cudnn_frontend() -> tuple:
    """The cuDNN frontend module and a handle on torch's current stream. The frontend loads
    libcudnn by name; torch has already loaded its own copy into the process."""
    import cudnn

    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    return cudnn, handle


class CudnnSdpa:
    """cuDNN's SDPA through its frontend: packed (ragged) Q of `num_seqs` sequences of at
    most `max_q` tokens, causal aligned bottom-right, GQA by head counts. K/V are read
    through page tables from the pool (`dense_kv` None) or from dense token-major buffers
    of `dense_kv` keys per sequence. One graph serves every call within these bounds
    (actual lengths are inputs).

        pool [num_blocks, block_size, KVH, D] seen as [num_blocks, KVH, block_size, D]
        tables [S, width] int32 seen as [S, 1, width, 1]; seq lens [S] seen as [S, 1, 1, 1]
    """

    def __init__(self, layer: PagedLayer, num_heads: int, num_seqs: int, max_q: int,
                 dense_kv: int | None = None) -> None:
        cudnn, self.handle = cudnn_frontend()
        head_dim = layer.k.shape[3]
        types = {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float16: cudnn.data_type.HALF}
        self.io, f32 = types[layer.k.dtype], cudnn.data_type.FLOAT
        g = cudnn.pygraph(io_data_type=self.io, intermediate_data_type=f32,
                          compute_data_type=f32, handle=self.handle)
        dims = (num_seqs, num_heads, max_q, head_dim)
        strides = (max_q * num_heads * head_dim, head_dim, num_heads * head_dim, 1)
        ints = {"stride": (1, 1, 1, 1), "data_type": cudnn.data_type.INT32}
        offsets = {"dim": (num_seqs + 1, 1, 1, 1), "stride": (1, 1, 1, 1),
                   "data_type": cudnn.data_type.INT64}
        self.q = g.tensor(name="q", dim=dims, stride=strides, data_type=self.io)
        self.offsets = g.tensor(name="q_offsets", **offsets)
        self.q.set_ragged_offset(self.offsets)
        self.seq_q = g.tensor(name="seq_q", dim=(num_seqs, 1, 1, 1), **ints)
        self.seq_kv = g.tensor(name="seq_kv", dim=(num_seqs, 1, 1, 1), **ints)
        paged = (self._pool(cudnn, g, layer, num_seqs) if dense_kv is None
                 else self._dense(g, num_seqs, layer.k.shape[2], head_dim, dense_kv))
        self.o, _ = g.sdpa(
            name="sdpa", q=self.q, k=self.k, v=self.v, attn_scale=head_dim ** -0.5,
            generate_stats=False, use_padding_mask=True, seq_len_q=self.seq_q,
            seq_len_kv=self.seq_kv, use_causal_mask_bottom_right=True,
            compute_data_type=f32, **paged)
        self.o_offsets = g.tensor(name="o_offsets", **offsets)
        self.o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(self.io)
        self.o.set_ragged_offset(self.o_offsets)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        self.graph = g
        self.workspace = torch.empty(g.get_workspace_size(), dtype=torch.uint8,
                                     device=layer.k.device)

    def _pool(self, cudnn, g, layer: PagedLayer, num_seqs: int) -> dict:
        """K/V as the pool seen through page tables; the sdpa's paging arguments."""
        blocks, block_size, num_kv, head_dim = layer.k.shape
        width = layer.tables.shape[1]
        pool = (blocks, num_kv, block_size, head_dim)
        self.k = g.tensor(name="k_pool", dim=pool, data_type=self.io,
                          stride=(layer.k.stride(0), layer.k.stride(2), layer.k.stride(1), 1))
        self.v = g.tensor(name="v_pool", dim=pool, data_type=self.io,
                          stride=(layer.v.stride(0), layer.v.stride(2), layer.v.stride(1), 1))
        table = {"dim": (num_seqs, 1, width, 1), "stride": (width, width, 1, 1),
                 "data_type": cudnn.data_type.INT32}
        self.tables = (g.tensor(name="k_table", **table), g.tensor(name="v_table", **table))
        return {"paged_attention_k_table": self.tables[0],
                "paged_attention_v_table": self.tables[1],
                "paged_attention_max_seq_len_kv": width * block_size}

    def _dense(self, g, num_seqs: int, num_kv: int, head_dim: int, kv_len: int) -> dict:
        """K/V as dense [S, kv_len, KVH, D] token-major buffers (BSHD)."""
        dims = (num_seqs, num_kv, kv_len, head_dim)
        strides = (kv_len * num_kv * head_dim, head_dim, num_kv * head_dim, 1)
        self.k = g.tensor(name="k", dim=dims, stride=strides, data_type=self.io)
        self.v = g.tensor(name="v", dim=dims, stride=strides, data_type=self.io)
        self.tables = None
        return {}

    def bind(self, q: Tensor, k: Tensor, v: Tensor, tables: Tensor | None,
             seq_q: Sequence[int], seq_kv: Sequence[int], out: Tensor) -> ChunkFn:
        """The call over packed q/out [T, H, D] with these K/V (the pool, or dense buffers),
        tables (paged only) and lengths."""
        dev, row = q.device, q.shape[1] * q.shape[2]
        starts = [0]
        for n in seq_q:
            starts.append(starts[-1] + n * row)

        def ints(values: Sequence[int], dtype: torch.dtype) -> Tensor:
            return torch.tensor(list(values), dtype=dtype, device=dev)
        offsets = ints(starts, torch.int64)
        pack = {self.q: q, self.k: k, self.v: v, self.seq_q: ints(seq_q, torch.int32),
                self.seq_kv: ints(seq_kv, torch.int32), self.offsets: offsets,
                self.o_offsets: offsets, self.o: out}
        if self.tables is not None:
            pack.update({self.tables[0]: tables, self.tables[1]: tables})

        def run() -> Tensor:
            self.graph.execute(pack, self.workspace, handle=self.handle)
            return out
        return run


@functools.lru_cache(maxsize=4)
def cudnn_graph(layer: PagedLayer, num_heads: int, num_seqs: int, max_q: int,
                dense_kv: int | None = None) -> CudnnSdpa:
    return CudnnSdpa(layer, num_heads, num_seqs, max_q, dense_kv)


def cudnn_paged() -> Builder:
    """One sequence's chunk through CudnnSdpa over the pool (a graph per chunk size)."""
    def build(chunk: Chunk) -> ChunkFn:
        layer = chunk.prompt.layer
        graph = cudnn_graph(layer, chunk.q.shape[1], 1, chunk.length)
        return graph.bind(chunk.q, layer.k, layer.v, chunk.table, [chunk.length],
                          [chunk.seq_len], torch.empty_like(chunk.q))
    return build


def cudnn_gathered(padded_to: int) -> Builder:
    """The prefix + chunk keys gathered from the pool (timed) into buffers of `padded_to`
    keys, then CudnnSdpa on dense K/V with a bottom-right causal mask: one kernel, no
    merge."""
    def build(chunk: Chunk) -> ChunkFn:
        layer = chunk.prompt.layer
        fetch = Gather(layer, chunk.table[0], chunk.seq_len, padded_to)
        k, v = fetch()
        graph = cudnn_graph(layer, chunk.q.shape[1], 1, chunk.length, padded_to)
        run = graph.bind(chunk.q, k, v, None, [chunk.length], [chunk.seq_len],
                         torch.empty_like(chunk.q))

        def both() -> Tensor:
            fetch()
            return run()
        return both
    return build


# ----------------------------------------------------------------------------- FlashInfer

FLASHINFER_BACKENDS = ("fa3", "fa2")  # fa3: its Hopper kernels (wgmma, TMA); fa2: portable


@functools.cache
def flashinfer_planner(device: str, backend: str) -> FlashInferPrefill:
    """The engine's FlashInfer planner (its workspace, its two wrappers) on `device` with
    FlashInfer's `backend` kernels: every option plans and runs as the engine does."""
    return FlashInferPrefill(torch.device(device), family=backend)


def flashinfer_call(backend: str, layer: PagedLayer, q: Tensor, tables: Tensor,
                    q_lens: Sequence[int], seq_lens: Sequence[int], scale: float
                    ) -> tuple[ChunkFn, float]:
    """FlashInfer's batch prefill over the pool in place: packed q [T, H, D] of sequences
    with `q_lens` new tokens each over `seq_lens` keys (causal, aligned bottom-right), the
    pool's [num_blocks, block_size, KVH, D] blocks as its NHD pages, `tables` [S, width] their
    page tables. Planned here as the engine plans a step (page_lists, then
    FlashInferPrefill.plan; the host's per-step work, shared by every layer; its time is
    returned), so a call is `run` alone, valid until the planner's plan after next."""
    block = layer.k.shape[1]
    query_start_loc = np.concatenate(([0], np.cumsum(q_lens)))
    lists = page_lists(query_start_loc, np.asarray(seq_lens), tables.cpu().numpy(), 0, block)
    planner = flashinfer_planner(str(q.device), backend)
    start = time.perf_counter()
    plan = planner.plan(lists, q.shape[1], layer.k.shape[2], layer.k.shape[3], block, scale,
                        q.dtype)
    plan_ms = 1e3 * (time.perf_counter() - start)
    out = torch.empty_like(q)
    return (lambda: plan.run(q, layer.k, layer.v, out)), plan_ms


def flashinfer_paged(backend: str) -> Builder:
    """One sequence's chunk through FlashInfer over the pool (`backend` fa2 or fa3)."""
    def build(chunk: Chunk) -> ChunkFn:
        run, _ = flashinfer_call(backend, chunk.prompt.layer, chunk.q, chunk.table,
                                 [chunk.length], [chunk.seq_len], scale_of(chunk))
        return run
    return build


def mixed_flashinfer_one_call(backend: str) -> Callable[[Chunk, Decodes], MixedFn]:
    """Decode rows and the chunk in one ragged FlashInfer call over the pool."""
    def make(chunk: Chunk, decodes: Decodes) -> MixedFn:
        n, layer = decodes.q.shape[0], chunk.prompt.layer
        q = torch.cat([decodes.q, chunk.q])
        run, _ = flashinfer_call(backend, layer, q, layer.tables[:n + 1],
                                 [1] * n + [chunk.length],
                                 [decodes.context] * n + [chunk.seq_len], scale_of(chunk))

        def both() -> tuple[Tensor, Tensor]:
            out = run()
            return out[:n], out[n:]
        return both
    return make


def flashinfer_plan_ms(chunk: Chunk, decodes: Decodes, backend: str) -> float:
    """The host's time to plan a mixed step (FlashInfer plans once per step, not per
    layer), median of 5."""
    n, layer = decodes.q.shape[0], chunk.prompt.layer
    q = torch.cat([decodes.q, chunk.q])
    times = [flashinfer_call(backend, layer, q, layer.tables[:n + 1], [1] * n + [chunk.length],
                             [decodes.context] * n + [chunk.seq_len], scale_of(chunk))[1]
             for _ in range(5)]
    return statistics.median(times)


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


def mixed_cudnn_one_call(chunk: Chunk, decodes: Decodes) -> MixedFn:
    """Decode rows and the chunk in one ragged cuDNN paged call."""
    n, layer = decodes.q.shape[0], chunk.prompt.layer
    graph = cudnn_graph(layer, chunk.q.shape[1], n + 1, chunk.length)
    q = torch.cat([decodes.q, chunk.q])
    run = graph.bind(q, layer.k, layer.v, layer.tables[:n + 1], [1] * n + [chunk.length],
                     [decodes.context] * n + [chunk.seq_len], torch.empty_like(q))

    def both() -> tuple[Tensor, Tensor]:
        out = run()
        return out[:n], out[n:]
    return both


# ----------------------------------------------------------------------------- running

class ContextLost(RuntimeError):
    """The CUDA context failed (a kernel faulted): nothing after it can run."""


@contextmanager
def soft_timeout(seconds: float) -> Iterator[None]:
    """TimeoutError raised in this thread once `seconds` pass (at the next Python bytecode:
    a call stuck inside C returns first; the hard limit covers that)."""
    def expire(signum, frame):
        raise TimeoutError(f"abandoned after {seconds:.0f} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def device_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Median device milliseconds of fn() by CUDA events, with ~5 ms of GPU sleep queued
    before each call instead of the engine profile's ~0.5: SPLIT's half dozen launches keep
    the host busy up to ~0.75 ms, and the GPU must not wait for them inside the timed span."""
    return profile_device_ms(fn, reps, warmup, queue_cycles=QUEUE_AHEAD_CYCLES)


def wall_ms(fn: Callable[[], object], reps: int = 1) -> float:
    """Host milliseconds of fn() (the CPU check, where there are no CUDA events)."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def host_ms(fn: Callable[[], object], reps: int = 20) -> float:
    """Host milliseconds to launch fn() while the GPU is still busy with queued sleep (so
    the call cannot wait on the GPU unless it synchronises, which then shows)."""
    fn()
    times = []
    for _ in range(reps):
        torch.cuda._sleep(BUSY_CYCLES)
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
        torch.cuda.synchronize()
    return statistics.median(times)


@dataclass
class Bench:
    """What every measurement shares: shapes, sizes, timers, the rows so far."""
    heads: Heads
    sizes: Sizes
    out: Path | None
    env: dict
    rows: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    lse_op: LseOp | None = None
    cudnn_probe: dict = field(default_factory=dict)
    flashinfer_probe: dict = field(default_factory=dict)
    only: tuple[str, ...] = ()  # run only options whose names match one of these patterns

    @property
    def cuda(self) -> bool:
        return self.heads.device == "cuda"

    def timer(self, fn: Callable[[], object]) -> float:
        return device_ms(fn) if self.cuda else wall_ms(fn)

    def skip_reason(self, option: Option) -> str | None:
        if option.needs_cuda and not self.cuda:
            return "skipped: needs CUDA"
        if time.perf_counter() - self.started > self.sizes.budget_s:
            return f"skipped: the run's {self.sizes.budget_s:.0f} s budget is spent"
        if option.needs_frontend and not self.cudnn_probe.get("ok"):
            return self.cudnn_probe.get("error") or "cuDNN frontend probe failed"
        if option.flashinfer:
            probe = self.flashinfer_probe.get(option.flashinfer, self.flashinfer_probe)
            if not probe.get("ok"):
                return probe.get("error") or "FlashInfer probe failed"
        return None

    def check_context(self) -> None:
        if not self.cuda:
            return
        try:
            torch.cuda.synchronize()
        except RuntimeError as error:
            raise ContextLost(first_line(error)) from error

    def attempt(self, base: dict, option: Option, work: Callable[[], dict]) -> dict | None:
        """Run `work` for `option` and record its row; a failure records its first line.
        An option that `only` leaves out is neither run nor recorded (None)."""
        if self.only and not any(fnmatch.fnmatchcase(option.name, p) for p in self.only):
            return None
        row = {**base, "option": option.name, "note": option.note,
               "block_size": option.block_size or self.heads.block_size}
        reason = self.skip_reason(option)
        if reason:
            row["error"] = reason
        else:
            try:
                with soft_timeout(OPTION_TIMEOUT_S):
                    row.update(work())
            except Exception as error:  # noqa: BLE001 - every failure is a result here
                row["error"] = first_line(error)
                self.check_context()
        if row.get("max_abs_err") is not None:
            row["correct"] = row["max_abs_err"] <= TOLERANCE[self.heads.dtype]
        self.record(row)
        return row

    def record(self, row: dict) -> None:
        self.rows.append(row)
        print(format_row(row), flush=True)
        self.save()

    def result(self) -> dict:
        return {"env": self.env, "heads": {**self.heads.__dict__, "dtype": str(self.heads.dtype)},
                "sizes": {k: (v if k != "tiles" else [tile_name(t) for t in v])
                          for k, v in self.sizes.__dict__.items()},
                "lse_op": self.lse_op.name if self.lse_op else None,
                "cudnn_probe": self.cudnn_probe, "flashinfer_probe": self.flashinfer_probe,
                "rows": self.rows,
                "elapsed_s": time.perf_counter() - self.started}

    def save(self) -> Path | None:
        """Rewritten after every row, so a run cut short keeps what it measured."""
        if self.out is None and not self.cuda:
            return None
        return write_result(self.result(), self.out, "attention_options", self.env["gpu"])


def tile_name(tile: TileConfig) -> str:
    order = ", longest first" if tile.longest_first else ""
    return f"{tile.block_m}x{tile.block_n} w{tile.num_warps} s{tile.num_stages}{order}"


def measure_chunks(bench: Bench, option: Option, chunks: Sequence[Chunk]) -> dict:
    """Build, check and time `option` on each chunk: device ms summed, the worst error."""
    total_ms, worst, each = 0.0, 0.0, []
    flops = 0.0
    for chunk in chunks:
        fn = option.build(chunk)
        worst = max(worst, chunk_error(chunk, fn(), bench.sizes.check_rows, scale_of(chunk)))
        ms = bench.timer(fn)
        each.append(ms)
        total_ms += ms
        flops += attention_flops(chunk.length, chunk.prefix, bench.heads)
    return {"ms": total_ms, "tflops": flops / total_ms / 1e9, "max_abs_err": worst,
            "chunk_ms": each if len(each) > 1 else None,
            "host_ms": host_ms(fn) if bench.cuda else None}  # the last chunk's launch


def measure_mixed(bench: Bench, option: Option, chunk: Chunk, decodes: Decodes) -> dict:
    """A mixed step's attention (decode rows and chunk; the chunk's output None where an
    option runs the decode rows alone): checked, device-timed, host launch timed."""
    fn = option.build(chunk, decodes)
    rows_out, chunk_out = fn()
    err = decode_error(decodes, chunk.prompt.layer, rows_out, scale_of(chunk))
    flops = 4.0 * bench.heads.head_dim * bench.heads.num_heads * decodes.context * len(
        decodes.q)
    if chunk_out is not None:
        err = max(err, chunk_error(chunk, chunk_out, bench.sizes.check_rows, scale_of(chunk)))
        flops += attention_flops(chunk.length, chunk.prefix, bench.heads)
    ms = bench.timer(fn)
    return {"ms": ms, "tflops": flops / ms / 1e9, "max_abs_err": err,
            "host_ms": host_ms(fn) if bench.cuda else None}


# ----------------------------------------------------------------------------- sections

def lse_ops(bench: Bench) -> list[LseOp]:
    if not bench.cuda:
        return [LseOp("cpu", False)]
    return [LseOp(kernel, expand) for kernel in ("cudnn", "flash") for expand in (False, True)]


def one_pass_options(bench: Bench, tiles: bool) -> list[Option]:
    opts = [Option("ours", ours(), needs_cuda=False, note="prefill_config tile")]
    if tiles:
        opts += [Option(f"ours {tile_name(t)}", ours(t), needs_cuda=False)
                 for t in bench.sizes.tiles] + other_blocks(bench)
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        short = backend.split("_")[0].lower()
        opts.append(Option(f"sdpa {short} (gqa)", sdpa(backend, True)))
        opts.append(Option(f"sdpa {short} (kv expanded)", sdpa(backend, False),
                           note="K/V expanded beforehand, the copy not timed"))
    if not bench.cuda:  # materialises every score: small shapes only
        opts.append(Option("sdpa math (gqa)", sdpa("MATH", True), needs_cuda=False))
    opts += [Option(op.name, lse_one_pass(op), needs_cuda=op.kernel != "cpu")
             for op in lse_ops(bench)]
    opts += [Option("fa2 varlen", fa2_varlen(False)),
             Option("flex (compiled, causal block mask)", flex(None)),
             Option("cudnn paged (frontend)", cudnn_paged(), needs_frontend=True,
                    note="ragged Q, page tables, bottom-right causal")]
    return opts + flashinfer_options()


def flashinfer_options(block_size: int | None = None) -> list[Option]:
    """FlashInfer's batch prefill over the pool, each backend (on the pool re-paged at
    `block_size` if given)."""
    tail = f", {block_size}-token blocks" if block_size else ""
    return [Option(f"flashinfer {backend} paged{tail}",
                   on_blocks(flashinfer_paged(backend), block_size) if block_size
                   else flashinfer_paged(backend), flashinfer=backend, block_size=block_size,
                   note="pages read in place; planned once (untimed)")
            for backend in FLASHINFER_BACKENDS]


def chunked_options(bench: Bench, prompt: int) -> list[Option]:
    op = bench.lse_op or lse_ops(bench)[0]
    on_cpu = op.kernel == "cpu"
    return [
        Option("ours", ours(), needs_cuda=False, note="as the engine runs chunks"),
        Option(f"split: {op.name} square + gathered prefix", split(op, False),
               needs_cuda=not on_cpu, note="gather, both parts and the merge timed"),
        Option(f"split: {op.name} square + our prefix kernel", split(op, True),
               needs_cuda=not on_cpu, note="both parts and the merge timed"),
        Option("fa2 varlen, gathered prefix+chunk", fa2_varlen(True), note="gather timed"),
        Option("flex, gathered keys padded", flex(prompt),
               note=f"keys gathered (timed) into {prompt}; block mask made untimed"),
        Option("cudnn paged (frontend)", cudnn_paged(), needs_frontend=True),
        Option("cudnn dense (frontend), gathered prefix+chunk", cudnn_gathered(prompt),
               needs_frontend=True, note=f"gather timed, buffers of {prompt} keys"),
    ] + flashinfer_options() + other_blocks(bench)


def other_blocks(bench: Bench) -> list[Option]:
    """Ours and cuDNN paged over the pool re-paged at the other block size."""
    size = bench.sizes.other_block_size
    return [Option(f"ours, {size}-token blocks", on_blocks(ours(), size), needs_cuda=False,
                   block_size=size),
            Option(f"cudnn paged (frontend), {size}-token blocks",
                   on_blocks(cudnn_paged(), size), needs_frontend=True, block_size=size),
            *flashinfer_options(size)]


def run_one_pass(bench: Bench, tokens_: int, tiles: bool) -> None:
    prompt = make_prompt(bench.heads, tokens_)
    chunk = Chunk(prompt, 0, tokens_)
    base = {"section": "one_pass", "prompt": tokens_, "chunk": tokens_}
    for option in one_pass_options(bench, tiles):
        bench.attempt(base, option, lambda o=option: measure_chunks(bench, o, [chunk]))
    release()


def pick_lse_op(bench: Bench, prompt: int) -> LseOp:
    """The fastest correct SDPA op with LSE on the one pass (SPLIT's square and prefix)."""
    ops = {op.name: op for op in lse_ops(bench)}
    timed = [r for r in bench.rows if r["section"] == "one_pass" and r["prompt"] == prompt
             and r["option"] in ops and r.get("correct")]
    if not timed:
        return lse_ops(bench)[0]
    return ops[min(timed, key=lambda r: r["ms"])["option"]]


def run_chunked(bench: Bench, prompt_tokens: int) -> dict[str, Builder]:
    """Every chunked option over each chunk size and the whole prompt as one chunk; the
    tiles at the first chunk size. Returns the builders by name (for the mixed steps)."""
    prompt = make_prompt(bench.heads, prompt_tokens)
    sizes = list(bench.sizes.chunks) + [prompt_tokens]
    options = chunked_options(bench, prompt_tokens)
    tiles = [Option(f"ours {tile_name(t)}", ours(t), needs_cuda=False)
             for t in bench.sizes.tiles]
    runs = [(o, sizes) for o in options] + [(t, sizes[:1]) for t in tiles]
    for option, option_sizes in runs:
        for size in option_sizes:
            chunks = [Chunk(prompt, p, n) for p, n in chunk_starts(prompt_tokens, size)]
            base = {"section": "chunked", "prompt": prompt_tokens, "chunk": size}
            bench.attempt(base, option,
                          lambda o=option, c=chunks: measure_chunks(bench, o, c))
    run_split_parts(bench, prompt, sizes[:-1])
    release()
    return {o.name: o.build for o in options}


def run_split_parts(bench: Bench, prompt: Prompt, sizes: Sequence[int]) -> None:
    """SPLIT's steps timed one by one, summed over the chunks of each size."""
    op = bench.lse_op or lse_ops(bench)[0]
    option = Option(f"split parts ({op.name}, gathered prefix)", split_parts,
                    needs_cuda=op.kernel != "cpu")

    def work(size: int) -> dict:
        parts_ms: dict[str, float] = {}
        for p, n in chunk_starts(prompt.keys.shape[0], size):
            for name, fn in split_parts(op, Chunk(prompt, p, n)).items():
                parts_ms[name] = parts_ms.get(name, 0.0) + bench.timer(fn)
        return {"ms": sum(parts_ms.values()), "parts_ms": parts_ms}
    for size in sizes:
        base = {"section": "split_parts", "prompt": prompt.keys.shape[0], "chunk": size}
        bench.attempt(base, option, lambda s=size: work(s))


def best_tile(bench: Bench) -> TileConfig | None:
    """The swept tile fastest over the first chunk size (correct, timed), if any."""
    tiles = {f"ours {tile_name(t)}": t for t in bench.sizes.tiles}
    names = best_options(bench.rows, bench.sizes.chunks[0], 1, "-", bench.heads.block_size,
                         among=tuple(tiles))
    return tiles[names[0]] if names else None


def mixed_options(bench: Bench, builders: dict[str, Builder]) -> list[Option]:
    """Ours (one launch, with the fastest swept tile too; two launches), the two best
    other chunked options beside our decode launch, cuDNN's one ragged call, the decode
    rows alone."""
    opts = [Option("ours (one launch)", mixed_one_launch(), needs_cuda=False)]
    tile = best_tile(bench)
    if tile is not None:
        opts.append(Option(f"ours (one launch, {tile_name(tile)})", mixed_one_launch(tile),
                           needs_cuda=False))
    opts.append(Option("ours (decode launch + chunk launch)", mixed_beside_decodes(ours()),
                       needs_cuda=False))
    for name in best_options(bench.rows, bench.sizes.chunks[0], 2, "ours",
                             bench.heads.block_size):
        opts.append(Option(f"{name} + our decode launch", mixed_beside_decodes(builders[name]),
                           needs_cuda=bench.cuda, needs_frontend=name.startswith("cudnn"),
                           flashinfer=next((b for b in FLASHINFER_BACKENDS
                                            if name.startswith(f"flashinfer {b}")), None)))
    return opts + [Option("cudnn paged (one ragged call)", mixed_cudnn_one_call,
                          needs_frontend=True),
                   *(Option(f"flashinfer {b} (one ragged call)", mixed_flashinfer_one_call(b),
                            flashinfer=b) for b in FLASHINFER_BACKENDS),
                   Option("our decode launch alone (no chunk)", decode_rows_alone,
                          needs_cuda=False)]


def run_mixed(bench: Bench, builders: dict[str, Builder]) -> None:
    s = bench.sizes
    for prefix in s.mixed_prefixes:
        prompt = make_prompt(bench.heads, prefix + s.mixed_chunk,
                             [s.decode_context] * s.num_decodes)
        chunk = Chunk(prompt, prefix, s.mixed_chunk)
        decodes = make_decodes(bench.heads, prompt, s.num_decodes, s.decode_context)
        base = {"section": "mixed", "prompt": prefix + s.mixed_chunk, "chunk": s.mixed_chunk,
                "prefix": prefix, "decodes": f"{s.num_decodes}x{s.decode_context}"}
        for option in mixed_options(bench, builders):
            bench.attempt(base, option,
                          lambda o=option, c=chunk, d=decodes: measure_mixed(bench, o, c, d))
        for backend in FLASHINFER_BACKENDS:
            option = Option(f"flashinfer {backend} plan (host, once per step)", None,
                            flashinfer=backend, note="host_ms: the plan of this mixed step")
            bench.attempt(base, option, lambda c=chunk, d=decodes, b=backend:
                          {"host_ms": flashinfer_plan_ms(c, d, b)})
        release()


def release() -> None:
    """Free the finished section's tensors before the next allocates."""
    cudnn_graph.cache_clear()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_all(bench: Bench) -> None:
    """The chunked prompt's one pass first (its rows pick SPLIT's op and the baseline),
    then chunked, mixed, and the shorter prompts' one passes last."""
    *shorter, prompt = bench.sizes.prompts
    run_one_pass(bench, prompt, tiles=True)
    bench.lse_op = pick_lse_op(bench, prompt)
    builders = run_chunked(bench, prompt)
    run_mixed(bench, builders)
    for tokens_ in shorter:
        run_one_pass(bench, tokens_, tiles=False)


# ----------------------------------------------------------------------------- report

def sdpa_cudnn_ms(rows: Sequence[dict], prompt: int) -> float | None:
    """SDPA cuDNN's one pass of `prompt` tokens (its faster correct variant)."""
    times = [r["ms"] for r in rows if r["section"] == "one_pass" and r["prompt"] == prompt
             and r["option"].startswith("sdpa cudnn") and r.get("correct")]
    return min(times) if times else None


def add_ratios(rows: list[dict]) -> None:
    for row in rows:
        base = sdpa_cudnn_ms(rows, row["prompt"])
        if row["section"] != "mixed" and row.get("ms") is not None and base:
            row["ratio_to_sdpa_cudnn"] = row["ms"] / base


def shape_label(row: dict) -> str:
    if row["section"] == "one_pass":
        return f"{row['prompt']}"
    if row["section"] in ("chunked", "split_parts"):
        return f"{row['prompt']} / {row['chunk']}"
    return f"{row['chunk']} @{row['prefix']} + {row['decodes']}"


def format_row(row: dict) -> str:
    def num(key: str, fmt: str) -> str:
        value = row.get(key)
        return format(value, fmt) if value is not None else "-"
    status = ("ok" if row.get("correct") else "WRONG") if "correct" in row else ""
    tail = row.get("error") or status
    return (f"{row['section']:>8} {row['option'][:52]:<52} {shape_label(row):>22} "
            f"{num('ms', '9.3f')} {num('tflops', '7.0f')} {num('ratio_to_sdpa_cudnn', '6.2f')} "
            f"{num('max_abs_err', '8.1e')} {num('host_ms', '7.3f')} {tail}")


def print_report(res: dict) -> None:
    print(f"\n{res['env'].get('gpu')}  torch {res['env'].get('torch')}  "
          f"triton {res['env'].get('triton')}  SPLIT op: {res['lse_op']}  "
          f"cuDNN frontend: {res['cudnn_probe']}")
    print(f"{'section':>8} {'option':<52} {'shape':>22} {'ms':>9} {'TFLOP/s':>7} "
          f"{'x cuDNN':>6} {'max err':>8} {'host ms':>7} status")
    for row in res["rows"]:
        print(format_row(row))
        if row.get("parts_ms"):
            print(" " * 9 + "  ".join(f"{k} {v:.3f}" for k, v in row["parts_ms"].items()))
    print(f"\nchunk penalty ({res['sizes']['prompts'][-1]}-token prompt): sum over chunks / "
          "the option's own one pass, / SDPA cuDNN's one pass")
    for p in res["chunk_penalties"]:
        own, sdpa_ = p["vs_own_one_pass"], p["vs_sdpa_cudnn_one_pass"]
        print(f"  {p['option'][:56]:<56} chunk {p['chunk']:>6} {p['sum_ms']:9.3f} ms  "
              f"{own if own is not None else float('nan'):6.3f}  "
              f"{sdpa_ if sdpa_ is not None else float('nan'):6.3f}")
    split = [p for p in res["chunk_penalties"] if "launch_fixed_ms" in p]
    if split:
        print("\neach chunk's time = a fixed cost per launch + its (query, key) pairs at a rate "
              "(least squares over the chunks), beside the one pass's rate (pairs per head)")
        for p in split:
            one = p["one_pass_pairs_per_ms"]
            print(f"  {p['option'][:56]:<56} chunk {p['chunk']:>6} "
                  f"fixed {1e3 * p['launch_fixed_ms']:6.1f} us  "
                  f"{p['pairs_per_ms'] / 1e6:6.2f} M pairs/ms  one pass "
                  f"{one / 1e6 if one else float('nan'):6.2f}")


def print_saved_report(path: Path) -> None:
    """`print_report` of a result this script wrote, its chunk penalties computed again."""
    try:
        res = json.loads(path.read_text())
        prompt = res["sizes"]["prompts"][-1]
        res["chunk_penalties"] = chunk_penalties(res["rows"], prompt,
                                                 sdpa_cudnn_ms(res["rows"], prompt))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
        sys.exit(f"attention_options: {path}: not a result this script wrote ({error}); "
                 "give a benchmarks/results/attention_options_*.json file")
    print_report(res)


# ----------------------------------------------------------------------------- cuDNN probe

def probe_cudnn() -> dict:
    """Run in a child process: small cases through CudnnSdpa (one sequence over the pool and
    over gathered keys, and decode rows beside a chunk in one ragged call), checked against
    the reference. A fault here costs the child, not the benchmark's CUDA context."""
    heads = Heads(8, 2, 128, 16, torch.bfloat16, "cuda")
    try:
        cudnn, _ = cudnn_frontend()
        info = {"frontend": cudnn.__version__, "backend": cudnn.backend_version()}
        prompt = make_prompt(heads, 200, [60, 60])
        chunk = Chunk(prompt, 128, 72)
        scale = scale_of(chunk)
        err = max(chunk_error(chunk, cudnn_paged()(chunk)(), 1 << 30, scale),
                  chunk_error(chunk, cudnn_gathered(256)(chunk)(), 1 << 30, scale))
        decodes = make_decodes(heads, prompt, 2, 60)
        rows_out, chunk_out = mixed_cudnn_one_call(chunk, decodes)()
        err = max(err, chunk_error(chunk, chunk_out, 1 << 30, scale),
                  decode_error(decodes, prompt.layer, rows_out, scale))
        torch.cuda.synchronize()
        ok = err <= TOLERANCE[heads.dtype]
        return {**info, "ok": ok, "max_abs_err": err,
                "error": None if ok else f"wrong on the probe: max abs error {err:.3g}"}
    except ModuleNotFoundError as error:
        return {"ok": False, "error": f"{first_line(error)}: pip install --no-deps "
                                      "nvidia-cudnn-frontend==1.23.0"}
    except Exception as error:  # noqa: BLE001 - the probe reports, the parent decides
        return {"ok": False, "error": first_line(error)}


def probe_flashinfer(backend: str) -> dict:
    """Run in a child process, one per backend: build FlashInfer's kernels for the
    benchmark's heads (nvcc through its JIT: minutes the first time, then loaded from its
    cache) and check a chunk over a cached prefix and decode rows beside it in one ragged
    call against the reference."""
    heads = LLAMA_8B
    start = time.perf_counter()
    try:
        import flashinfer

        info = {"version": flashinfer.__version__}
        prompt = make_prompt(heads, 300, [60, 60])
        chunk = Chunk(prompt, 200, 100)
        scale = scale_of(chunk)
        err = chunk_error(chunk, flashinfer_paged(backend)(chunk)(), 1 << 30, scale)
        decodes = make_decodes(heads, prompt, 2, 60)
        rows_out, chunk_out = mixed_flashinfer_one_call(backend)(chunk, decodes)()
        err = max(err, chunk_error(chunk, chunk_out, 1 << 30, scale),
                  decode_error(decodes, prompt.layer, rows_out, scale))
        torch.cuda.synchronize()
        ok = err <= TOLERANCE[heads.dtype]
        return {**info, "ok": ok, "max_abs_err": err,
                "build_and_check_s": time.perf_counter() - start,
                "error": None if ok else f"wrong on the probe: max abs error {err:.3g}"}
    except ModuleNotFoundError as error:
        return {"ok": False, "error": f"{first_line(error)}: pip install flashinfer-python "
                                      "(and its apache-tvm-ffi)"}
    except Exception as error:  # noqa: BLE001 - the probe reports, the parent decides
        return {"ok": False, "error": first_line(error),
                "build_and_check_s": time.perf_counter() - start}


def run_probe(flags: Sequence[str], what: str, timeout_s: float) -> dict:
    """This script re-run with `flags` in a child process; its last output line (JSON)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *flags]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"{what} probe still running after {timeout_s:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": f"{what} probe exited {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------- main

def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default benchmarks/results/attention_options_<gpu>"
                             ".json on a GPU; none for --smoke)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on CPU through Triton's interpreter")
    parser.add_argument("--only", default="",
                        help="comma-separated shell patterns of option names: run only the "
                             "options named by one (e.g. 'flashinfer*,sdpa cudnn*,ours'); "
                             "SPLIT's op is then picked among those run")
    parser.add_argument("--flashinfer-build-s", type=float, default=FLASHINFER_BUILD_S,
                        help="how long FlashInfer's probe may build its kernels, per backend "
                             "(default %(default)s s; a second run loads them from its cache)")
    parser.add_argument("--report", type=Path, default=None, metavar="RESULT",
                        help="print the report of a saved result (its chunk penalties computed "
                             "again from its rows) and run nothing")
    parser.add_argument("--probe-cudnn", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe-flashinfer", choices=FLASHINFER_BACKENDS,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.report is not None:
        print_saved_report(args.report)
        return
    if args.probe_cudnn:
        print(json.dumps(probe_cudnn()))
        return
    if args.probe_flashinfer:
        print(json.dumps(probe_flashinfer(args.probe_flashinfer)))
        return
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("attention_options needs a CUDA GPU; --smoke runs tiny shapes on the CPU")
    heads, sizes = (TINY, SMOKE) if args.smoke else (LLAMA_8B, FULL)
    flashinfer_probe = ({b: run_probe(["--probe-flashinfer", b], f"FlashInfer {b}",
                                      args.flashinfer_build_s) for b in FLASHINFER_BACKENDS}
                        if heads.device == "cuda" else {"ok": False, "error": "needs CUDA"})
    faulthandler.dump_traceback_later(HARD_LIMIT_S * (4 if args.smoke else 1), exit=True)
    torch.manual_seed(0)
    env = ({"gpu": "cpu-smoke", **versions()} if args.smoke else device_environment())
    env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    env["command"] = "python benchmarks/attention_options.py " + " ".join(sys.argv[1:])
    env["measured_on"] = datetime.date.today().isoformat()
    bench = Bench(heads, sizes, args.out, env,
                  only=tuple(part.strip() for part in args.only.split(",") if part.strip()))
    bench.cudnn_probe = (run_probe(["--probe-cudnn"], "cuDNN frontend", 150.0) if bench.cuda
                         else {"ok": False, "error": "needs CUDA"})
    bench.flashinfer_probe = flashinfer_probe
    try:
        run_all(bench)
    except ContextLost as error:
        print(f"stopped: the CUDA context failed ({error}); rows so far are kept")
    add_ratios(bench.rows)
    res = bench.result()
    res["chunk_penalties"] = chunk_penalties(bench.rows, sizes.prompts[-1],
                                             sdpa_cudnn_ms(bench.rows, sizes.prompts[-1]))
    print_report(res)
    path = bench.save()
    if path is not None:
        path.write_text(json.dumps(res, indent=2))
        print(f"wrote {path}")
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
