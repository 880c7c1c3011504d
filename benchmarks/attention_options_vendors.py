"""attention_options' vendor kernels: cuDNN's SDPA through its frontend and FlashInfer's batch
prefill, each over the paged pool (cuDNN also over gathered keys), for one chunk and for a
mixed step in one ragged call; and the probes that try each in a child process first."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from attention_options_builders import Builder, ChunkFn, Gather, MixedFn, scale_of
from attention_options_cases import (
    LLAMA_8B,
    TOLERANCE,
    Chunk,
    Decodes,
    Heads,
    chunk_error,
    decode_error,
    first_line,
    make_decodes,
    make_prompt,
)
from torch import Tensor

from gpu_backend.engine.attention_profile import PagedLayer
from gpu_backend.kernels.flashinfer_attention import FlashInferPrefill, page_lists

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


# ----------------------------------------------------------------------------- probes

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
