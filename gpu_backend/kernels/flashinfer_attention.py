"""Prefill attention through FlashInfer's batch prefill, reading the paged cache in place (the
flashinfer attention backend, gpu_backend.layers).

FlashInfer (the `flashinfer` extra: flashinfer-python) takes the engine's K and V caches,
[num_blocks, block_size, KVH, D] each, as its NHD pages: every sequence is a list of pages
(`PageLists`, the block table's first ceil(len / block_size) entries) and the length of its
last one. Each query row sees the keys up to its own position, the chunk aligned to the end of
its sequence's keys (causal, bottom-right), GQA by head counts. On Hopper it runs its `fa3`
kernels (wgmma, TMA, warp-specialised), elsewhere `fa2`; its JIT builds them with nvcc the
first time (about 90 s for fa3 on 16 cores) and loads them from its cache
($FLASHINFER_WORKSPACE_BASE/.cache/flashinfer) after.

A step plans once on the host (`FlashInferPrefill.plan`: the page lists from the step's host
lengths and block tables, the key lengths among them, copied from pinned memory: FlashInfer
would otherwise derive the lengths itself and copy them from pageable memory, which can hold
the host until the device catches up) and every layer runs that plan (`PrefillPlan.run`).
Two wrappers take turns, and a wrapper waits for its previous plan's copies before it is
planned again, so planning a step never rewrites a plan whose copy is still queued; the
engine launches at most one step ahead, so that wait does not happen there. The wrappers
share one float workspace.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

WORKSPACE_BYTES = 128 << 20  # FlashInfer's split-KV scratch, its documented size
INSTALL_HINT = ("the flashinfer attention backend needs FlashInfer: "
                "pip install 'elastic-kv[flashinfer]' (flashinfer-python)")


@dataclass(frozen=True)
class PageLists:
    """The prefill sequences of a step as FlashInfer's paged prefill takes them (int32)."""

    qo_indptr: np.ndarray  # [S+1] offsets of each sequence's query rows, from 0
    kv_indptr: np.ndarray  # [S+1] offsets of each sequence's pages in `indices`
    indices: np.ndarray  # [pages] the pool blocks of every sequence, in order
    last_page_len: np.ndarray  # [S] keys in each sequence's last page (1..block_size)
    kv_lens: np.ndarray  # [S] keys of each sequence


def page_lists(query_start_loc: np.ndarray, seq_lens: np.ndarray, block_tables: np.ndarray,
               first: int, block_size: int) -> PageLists:
    """The page lists of sequences `first`.. of a step: their query rows (offsets rebased to
    0), and the first ceil(seq_len / block_size) blocks of each one's table row."""
    qsl = np.asarray(query_start_loc[first:], dtype=np.int64)
    lens = np.asarray(seq_lens[first:], dtype=np.int64)
    tables = np.asarray(block_tables[first:])
    if len(qsl) != len(lens) + 1 or tables.shape[0] < len(lens):
        raise ValueError(f"{len(lens)} sequences with {len(qsl)} query offsets and "
                         f"{tables.shape[0]} block-table rows")
    if len(lens) and lens.min() < 1:
        raise ValueError(f"a sequence of {int(lens.min())} keys: every one needs at least one")
    pages = -(-lens // block_size)
    if len(lens) and pages.max() > tables.shape[1]:
        raise ValueError(f"a sequence of {int(lens.max())} keys needs {int(pages.max())} "
                         f"blocks; the block table holds {tables.shape[1]}")
    taken = np.arange(tables.shape[1])[None, :] < pages[:, None]
    return PageLists(
        qo_indptr=(qsl - qsl[0]).astype(np.int32),
        kv_indptr=np.concatenate(([0], np.cumsum(pages))).astype(np.int32),
        indices=tables[:len(lens)][taken].astype(np.int32),
        last_page_len=(lens - (pages - 1) * block_size).astype(np.int32),
        kv_lens=lens.astype(np.int32))


def kernel_family(device: torch.device) -> str:
    """FlashInfer's backend for this GPU: fa3 on Hopper (compute capability 9.x), else fa2."""
    if device.type != "cuda":
        return "fa2"
    return "fa3" if torch.cuda.get_device_capability(device)[0] == 9 else "fa2"


@dataclass(frozen=True)
class PrefillPlan:
    """One step's planned FlashInfer call, run by every layer. Valid until its wrapper is
    planned again (two plans later: `FlashInferPrefill.plan`)."""

    wrapper: object  # flashinfer.BatchPrefillWithPagedKVCacheWrapper, planned
    num_rows: int  # query rows it attends (the step's prefill rows)
    generation: int  # the wrapper's plan count when this plan was made
    owner: FlashInferPrefill

    def run(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, out: Tensor) -> Tensor:
        """q, out: [num_rows, H, D] (out contiguous); caches [num_blocks, block_size, KVH, D]."""
        if self.owner.generation(self.wrapper) != self.generation:
            raise RuntimeError("a FlashInfer plan run after its wrapper was planned again: "
                               "plan each step once and run it before the step after next")
        if q.shape[0] != self.num_rows or out.shape != q.shape or not out.is_contiguous():
            raise ValueError(f"query {tuple(q.shape)} and out {tuple(out.shape)} for a plan "
                             f"of {self.num_rows} rows (out contiguous, q's shape)")
        return self.wrapper.run(q, (k_cache, v_cache), out=out)  # type: ignore[attr-defined]


class FlashInferPrefill:
    """FlashInfer's paged prefill on one device: its workspaces and two wrappers taking
    turns (the module docstring). `workspace_bytes`: the device memory they hold for good,
    which the memory plan counts."""

    def __init__(self, device: torch.device, family: str | None = None) -> None:
        try:
            import flashinfer
        except ModuleNotFoundError as error:
            raise RuntimeError(INSTALL_HINT) from error
        self.device = device
        self.family = family or kernel_family(device)
        cuda = device.type == "cuda"
        before = torch.cuda.memory_allocated(device) if cuda else 0
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrappers = [flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            workspace, "NHD", backend=self.family) for _ in range(2)]
        self.workspace_bytes = (torch.cuda.memory_allocated(device) - before if cuda
                                else WORKSPACE_BYTES)
        self._turn = 0
        self._plans = [0, 0]  # plans made on each wrapper
        # each wrapper's last plan's copies (queued on the stream): a wrapper is planned again
        # only once they ran, so its pinned plan buffer is never rewritten under a queued copy
        self._planned: list[torch.cuda.Event | None] = [None, None]

    def generation(self, wrapper: object) -> int:
        return self._plans[self._wrappers.index(wrapper)]

    def plan(self, lists: PageLists, num_heads: int, num_kv_heads: int, head_dim: int,
             block_size: int, scale: float, dtype: torch.dtype) -> PrefillPlan:
        """Plan a step's prefill rows (host work; its own inputs copied from pinned memory,
        queued on the current stream; the host waits only if the plan before last on this
        wrapper is still queued, which the engine, one step ahead at most, never meets)."""
        turn = self._turn
        self._turn ^= 1
        wrapper = self._wrappers[turn]
        event = self._planned[turn]
        if event is not None:
            event.synchronize()
        cuda = self.device.type == "cuda"

        def host(values: np.ndarray) -> Tensor:
            tensor = torch.from_numpy(values)
            return tensor.pin_memory() if cuda else tensor
        indices = host(lists.indices).to(self.device, non_blocking=True)
        wrapper.plan(host(lists.qo_indptr), host(lists.kv_indptr), indices,
                     host(lists.last_page_len), num_heads, num_kv_heads, head_dim,
                     block_size, causal=True, sm_scale=scale, q_data_type=dtype,
                     kv_data_type=dtype, non_blocking=True, seq_lens=host(lists.kv_lens))
        if cuda:
            self._planned[turn] = torch.cuda.Event()
            self._planned[turn].record()
        self._plans[turn] += 1
        return PrefillPlan(wrapper, int(lists.qo_indptr[-1]), self._plans[turn], self)


def flashinfer_prefill(device: str | torch.device) -> FlashInferPrefill:
    """The device's one FlashInferPrefill (every layer and model on it shares its workspaces);
    "cuda" and "cuda:<current>" are the same device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _prefill_of(device)


@functools.cache
def _prefill_of(device: torch.device) -> FlashInferPrefill:
    return FlashInferPrefill(device)
