"""Measured memory plan: weights, activation peaks, non-torch and graph memory, as vLLM does.

    weights      torch.cuda.memory_allocated() growth while the model is built
    activations  torch.cuda.max_memory_allocated() growth over a dummy forward of N tokens
                 spread over min(N, max_num_seqs) sequences, each sampling one row (on the
                 split and auto attention backends also one sequence of N tokens over a
                 long cached prefix, its worst case: the larger peak); at the chunk size
                 and a few smaller sizes, fitted as fixed + bytes_per_token x N (an upper
                 envelope, so the fitted reserve covers every measured peak)
    non-torch    device memory used (cudaMemGetInfo) minus torch's reserved growth since the
                 context was created: cuBLAS workspaces, kernel images
    graphs       device memory growth over a trial capture of the decode graphs (counted as
                 non-torch in the plan, as vLLM >= 0.21 does)

    KV pool bytes = total x gpu_memory_utilization - weights - reserve - non-torch - graphs
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from gpu_backend.batch import ForwardBatch, HostLens
from gpu_backend.engine.kv_store import PlainKVStore
from gpu_backend.layers import SPLIT_BACKENDS
from gpu_backend.vmm.layout import KVLayout, base_block_quantum
from sim.core.catalog import ModelSpec
from sim.core.engine_config import EngineConfig
from sim.core.memory_plan import ActivationProfile, MemoryPlan, plan_memory
from sim.core.split_shapes import SplitShapes

NUM_SCRATCH_BLOCKS = 1  # device block 0: padded graph rows write there; never scheduled


@dataclass(frozen=True)
class MemoryMeasurement:
    total_bytes: int
    weights_bytes: int
    activation_peaks: dict[int, int]  # tokens per dummy step -> peak activation bytes
    profile: ActivationProfile  # fitted envelope; non_torch_bytes includes graphs
    non_torch_bytes: int  # without graphs
    graph_bytes: int

    @property
    def reserve_bytes_at(self) -> dict[int, int]:
        return {n: int(self.profile.fixed_bytes + self.profile.bytes_per_token * n)
                for n in self.activation_peaks}


def device_used_bytes(device: torch.device) -> int:
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def kv_layout(model: ModelSpec, block_size: int) -> KVLayout:
    dtype = {2: "bfloat16", 4: "float32", 1: "float8_e4m3fn"}[model.dtype_bytes]
    return KVLayout(model.num_layers, model.num_kv_heads, model.head_dim, block_size, dtype)


def profile_token_counts(chunk: int, max_num_seqs: int) -> list[int]:
    """The chunk, its halves down to 1/8, and one decode-sized step of max_num_seqs tokens."""
    counts = {chunk, max(1, chunk // 2), max(1, chunk // 4), max(1, chunk // 8)}
    counts.add(min(chunk, max_num_seqs))
    return sorted(counts)


def dummy_batch(num_tokens: int, num_seqs: int, block_size: int,
                device: torch.device) -> tuple[ForwardBatch, int]:
    """A prefill of num_tokens over num_seqs sequences (lengths differ by at most one).

    Every sequence uses the same blocks 1..n of a small dummy cache (block 0 is scratch), so
    the cache stays small; the writes race but only the memory peak and time matter here.
    Returns (batch, blocks the dummy cache needs).
    """
    base, extra = divmod(num_tokens, num_seqs)
    lens = np.full(num_seqs, base, dtype=np.int64)
    lens[:extra] += 1  # [S]
    max_len = int(lens.max())
    num_blocks = -(-max_len // block_size)
    positions = np.concatenate([np.arange(n) for n in lens])  # [T]
    slots = (1 + positions // block_size) * block_size + positions % block_size
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)  # [S+1]
    tables = np.tile(np.arange(1, num_blocks + 1, dtype=np.int32), (num_seqs, 1))

    def dev(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(array).to(device=device, dtype=dtype)

    batch = ForwardBatch(
        input_ids=dev(np.arange(num_tokens) % 128, torch.int64),
        positions=dev(positions, torch.int64), slot_mapping=dev(slots, torch.int64),
        block_tables=dev(tables, torch.int32), seq_lens=dev(lens, torch.int32),
        query_start_loc=dev(qsl, torch.int32), logits_indices=dev(qsl[1:] - 1, torch.int64),
        max_query_len=max_len, max_seq_len=max_len,
        host_lens=HostLens(query_start_loc=qsl, seq_lens=lens.astype(np.int32)))
    return batch, num_blocks + 1


def dummy_prefix_batch(num_tokens: int, prefix_tokens: int, block_size: int,
                       device: torch.device) -> tuple[ForwardBatch, int]:
    """One sequence of num_tokens new tokens over a cached prefix of prefix_tokens (a
    multiple of block_size). The chunk writes blocks 1..n of a small dummy cache and the
    prefix's table entries name those same blocks over and over: the prefix costs no cache
    memory, and only the memory peak and time matter here. Returns (batch, blocks needed)."""
    if prefix_tokens % block_size:
        raise ValueError(f"prefix of {prefix_tokens} tokens: use a multiple of {block_size}")
    num_blocks = -(-num_tokens // block_size)
    prefix_blocks = prefix_tokens // block_size
    own = 1 + np.arange(num_blocks)
    tables = np.concatenate([1 + np.arange(prefix_blocks) % num_blocks, own])[None, :]
    offsets = np.arange(num_tokens)
    slots = (1 + offsets // block_size) * block_size + offsets % block_size  # [T]
    qsl = np.array([0, num_tokens], dtype=np.int32)
    lens = np.array([prefix_tokens + num_tokens], dtype=np.int32)

    def dev(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(array).to(device=device, dtype=dtype)

    batch = ForwardBatch(
        input_ids=dev(offsets % 128, torch.int64),
        positions=dev(prefix_tokens + offsets, torch.int64), slot_mapping=dev(slots, torch.int64),
        block_tables=dev(tables, torch.int32), seq_lens=dev(lens, torch.int32),
        query_start_loc=dev(qsl, torch.int32), logits_indices=dev(qsl[1:] - 1, torch.int64),
        max_query_len=num_tokens, max_seq_len=int(lens[0]),
        host_lens=HostLens(query_start_loc=qsl, seq_lens=lens))
    return batch, num_blocks + 1


def split_profile_shapes(num_tokens: int, max_model_len: int, block_size: int,
                         shapes: SplitShapes) -> list[tuple[int, int]]:
    """(new tokens, prefix tokens) of SPLIT's worst steps of num_tokens tokens: one sequence
    holds them all (its padded buffers and partial outputs grow with its chunk) over a prefix
    of a full segment, a smallest one and the most keys the square absorbs (the segment
    buffers, the float32 running result, the most padded rows). Where max_model_len leaves no
    room for both: the longest chunk with the longest prefix beside it, and a chunk shortened
    to fit the long prefix."""
    long_prefix = shapes.max_segment_tokens + 2 * shapes.min_segment_tokens - block_size
    room = max_model_len - block_size
    found = []
    if room >= 1:
        chunk = min(num_tokens, room)
        found.append((chunk, min(long_prefix, (max_model_len - chunk) // block_size * block_size)))
    if found and found[0][1] < long_prefix and max_model_len - long_prefix >= 2:
        found.append((min(num_tokens, max_model_len - long_prefix), long_prefix))
    return found


def dummy_store(model: ModelSpec, num_blocks: int, block_size: int,
                device: torch.device) -> PlainKVStore:
    return PlainKVStore(kv_layout(model, block_size), num_blocks, device=device)


def kv_caches_of(store, num_layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(store.k_cache(i), store.v_cache(i)) for i in range(num_layers)]


def measure_activation_peak(model: torch.nn.Module, spec: ModelSpec, num_tokens: int,
                            max_num_seqs: int, block_size: int, device: torch.device,
                            max_model_len: int | None = None) -> int:
    """Peak bytes torch allocates over one dummy forward of num_tokens tokens. On the split
    and auto attention backends, given `max_model_len`, also over SPLIT's worst steps of as
    many tokens (`split_profile_shapes`): the largest of the peaks."""
    num_seqs = min(num_tokens, max_num_seqs)
    steps = [dummy_batch(num_tokens, num_seqs, block_size, device)]
    attn = model.layers[0].attn  # type: ignore[index]
    if max_model_len is not None and attn.backend in SPLIT_BACKENDS:
        steps += [dummy_prefix_batch(chunk, prefix, block_size, device) for chunk, prefix
                  in split_profile_shapes(num_tokens, max_model_len, block_size,
                                          attn.split_shapes)]
    return max(forward_peak(model, spec, batch, num_blocks, block_size, device)
               for batch, num_blocks in steps)


def forward_peak(model: torch.nn.Module, spec: ModelSpec, batch: ForwardBatch,
                 num_blocks: int, block_size: int, device: torch.device) -> int:
    """Peak bytes torch allocates over one forward of `batch` on a dummy cache."""
    store = dummy_store(spec, num_blocks, block_size, device)
    caches = kv_caches_of(store, spec.num_layers)
    model(batch, caches)  # warm-up: kernel compilation and cuBLAS workspaces
    torch.cuda.synchronize(device)
    baseline = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    model(batch, caches)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - baseline


def fit_envelope(peaks: dict[int, int]) -> tuple[float, int]:
    """(bytes_per_token, fixed_bytes) of a line through the peaks, shifted up to cover all."""
    tokens = np.array(sorted(peaks), dtype=np.float64)
    values = np.array([peaks[int(t)] for t in tokens], dtype=np.float64)
    if tokens.size == 1:
        return 0.0, int(values[0])
    slope, _ = np.polyfit(tokens, values, 1)
    slope = max(0.0, float(slope))
    fixed = int(np.ceil(np.max(values - slope * tokens)))
    return slope, max(0, fixed)


def measured_plan(config: EngineConfig, m: MemoryMeasurement,
                  max_kv_blocks: int | None = None) -> MemoryPlan:
    """The analytic plan with every size replaced by what was measured on this GPU.

    `max_kv_blocks` caps the base pool (memory pressure on a large GPU, tests; rounded up to
    the VMM block quantum); the memory it leaves unused is simply not allocated.
    """
    base = plan_memory(config.memory_config(), m.profile)
    usable = int(m.total_bytes * config.gpu_memory_utilization)
    reserve = int(m.profile.fixed_bytes + m.profile.bytes_per_token * config.chunk_tokens)
    non_torch = m.non_torch_bytes + m.graph_bytes
    kv_pool = usable - m.weights_bytes - reserve - non_torch
    block_bytes = base.block_bytes
    quantum = base_block_quantum(block_bytes, config.gpu.vmm_granularity_bytes)
    num_device_blocks = kv_pool // block_bytes
    if max_kv_blocks is not None:  # rounded up to the pool's block quantum
        cap = -(-(max_kv_blocks + NUM_SCRATCH_BLOCKS) // quantum) * quantum
        num_device_blocks = min(num_device_blocks, cap)
    num_device_blocks = num_device_blocks // quantum * quantum
    num_blocks = num_device_blocks - NUM_SCRATCH_BLOCKS
    if num_blocks < 1:
        raise ValueError(f"measured: no KV blocks fit ({kv_pool / 2**30:.2f} GiB for the pool); "
                         "lower --max-num-batched-tokens or raise --gpu-memory-utilization")
    return replace(
        base, total_bytes=m.total_bytes, usable_bytes=usable, weights_bytes=m.weights_bytes,
        activation_reserve_bytes=reserve, non_torch_bytes=non_torch,
        kv_pool_bytes=num_device_blocks * block_bytes, num_kv_blocks=num_blocks,
        kv_capacity_tokens=num_blocks * config.block_size,
        reserve_handles=reserve // config.vmm_handle_bytes,
        reserve_blocks=reserve // config.vmm_handle_bytes * config.vmm_handle_bytes // block_bytes,
        reserve_share=reserve / max(1, num_device_blocks * block_bytes),
    )


class TorchBudget:
    """Caps torch's allocator so activations can use only the reserve not mapped as KV.

    Used for overcommit: without a cap, torch would quietly take the headroom above
    gpu_memory_utilization and a step the plan says cannot fit would succeed.
    cap = torch memory at the end of setup + reserve + slack - elastic bytes mapped as KV.
    """

    def __init__(self, device: torch.device, baseline_bytes: int, reserve_bytes: int,
                 total_bytes: int, slack_bytes: int) -> None:
        self.device, self.total_bytes = device, total_bytes
        self.allowed_base = baseline_bytes + reserve_bytes + slack_bytes
        self.cap_bytes = self.allowed_base

    def set_mapped(self, mapped_bytes: int) -> None:
        self.cap_bytes = max(0, self.allowed_base - mapped_bytes)
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, self.cap_bytes / self.total_bytes), self.device)
