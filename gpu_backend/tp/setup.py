"""Build one rank's TP engine: shard model, measured memory, one agreed plan, own KV pool.

Each rank measures what it holds (weights shard, activation peaks of the sharded dummy
steps, non-torch memory including NCCL's buffers, graph memory). The ranks then agree on
the worst case of every measured size (MAX of weights, reserve envelope, non-torch; MIN of
total memory) and build the plan from it, so every rank derives the same plan, reserve
layout and scheduler; an all-reduce MIN of the block count checks the pools match. Each
rank keeps a record of its own measurement and of the KV blocks it alone would have had.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace

import torch

from gpu_backend.engine.memory import (
    MemoryMeasurement,
    device_used_bytes,
    fit_envelope,
    kv_caches_of,
    measure_activation_peak,
    measured_plan,
    profile_token_counts,
)
from gpu_backend.engine.runner import DecodeGraphs
from gpu_backend.engine.setup import (
    assemble_engine,
    fused_layers_enabled,
    make_store,
    plain_store,
    rope_theta,
    trial_graph_bytes,
)
from gpu_backend.engine.support import check_supported
from gpu_backend.model import set_mixed_split
from gpu_backend.tp.engine import TpEngine
from gpu_backend.tp.group import TpGroup
from gpu_backend.tp.shard import build_tp_model, shard_spec
from sim.core.engine_config import EngineConfig, EngineCore, build_core
from sim.core.memory_plan import ActivationProfile


@dataclass
class TpSetup:
    engine: TpEngine
    measurement: MemoryMeasurement  # the agreed (worst-rank) measurement the plan used
    rank_memory: dict  # this rank's own measurement and the pool it alone would have had
    graphs: DecodeGraphs | None


def shard_core(core: EngineCore, tp: int) -> EngineCore:
    """The core as one rank's KV store sees it: same blocks and scheduler, shard KV layout."""
    config = core.config.with_(model=shard_spec(core.config.model, tp), tensor_parallel_size=1)
    return replace(core, config=config)


def tp_plain_store(core: EngineCore, tp: int, device="cpu", dtype=torch.float32):
    """CPU runs and tests: a plain tensor store of the shard's KV heads, the core's blocks."""
    return plain_store(shard_core(core, tp), device, dtype)


def assemble_tp_engine(core: EngineCore, model, store, group: TpGroup,
                       graphs: DecodeGraphs | None = None, seed: int = 0) -> TpEngine:
    return TpEngine.wrap(assemble_engine(core, model, store, group.device, graphs, None, seed),
                         group)


def measure_tp_memory(config: EngineConfig, group: TpGroup, seed: int, use_graphs: bool):
    """(shard model, this rank's MemoryMeasurement), in the order of engine/setup.py."""
    device, spec = group.device, config.model
    shard = shard_spec(spec, group.world_size)
    torch.zeros(1, device=device)
    torch.cuda.synchronize(device)
    used0, reserved0 = device_used_bytes(device), torch.cuda.memory_reserved(device)
    group.max_float(0.0)  # first collective: NCCL's communicator memory counts as non-torch
    allocated0 = torch.cuda.memory_allocated(device)
    model = build_tp_model(spec, group, device, qkv_bias=spec.attention_bias,
                           rope_theta=rope_theta(spec.name), seed=seed,
                           max_position=config.memory_config().effective_max_model_len,
                           fused=fused_layers_enabled())
    set_mixed_split(model, config.mixed_split_min_keys)
    torch.cuda.synchronize(device)
    weights = torch.cuda.memory_allocated(device) - allocated0
    peaks = {n: measure_activation_peak(model, shard, n, config.num_seqs, config.block_size,
                                        device)
             for n in profile_token_counts(config.chunk_tokens, config.num_seqs)}
    gc.collect()
    torch.cuda.empty_cache()
    non_torch = max(0, (device_used_bytes(device) - used0)
                    - (torch.cuda.memory_reserved(device) - reserved0))
    shard_config = config.with_(model=shard, tensor_parallel_size=1)
    graph_bytes = trial_graph_bytes(model, shard_config, device) if use_graphs else 0
    slope, fixed = fit_envelope(peaks)
    profile = ActivationProfile(slope, fixed, non_torch + graph_bytes)
    _, total = torch.cuda.mem_get_info(device)
    return model, MemoryMeasurement(total, weights, peaks, profile, non_torch, graph_bytes)


def agree(m: MemoryMeasurement, group: TpGroup) -> MemoryMeasurement:
    """The worst rank's value of every size (MIN of total memory), the same on every rank."""
    p = m.profile
    total, weights, slope, fixed, nt, non_torch, graph = group.max_floats(
        [-m.total_bytes, m.weights_bytes, p.bytes_per_token, p.fixed_bytes,
         p.non_torch_bytes or 0, m.non_torch_bytes, m.graph_bytes])
    profile = ActivationProfile(slope, int(fixed), int(nt))
    return MemoryMeasurement(int(-total), int(weights), m.activation_peaks, profile,
                             int(non_torch), int(graph))


def build_tp_gpu_engine(config: EngineConfig, group: TpGroup, *, seed: int = 0,
                        use_graphs: bool = False, max_kv_blocks: int | None = None) -> TpSetup:
    check_supported(config)
    device = group.device
    config = config.with_(reclaim="release", tensor_parallel_size=group.world_size)
    model, own = measure_tp_memory(config, group, seed, use_graphs)
    agreed = agree(own, group)
    config = config.with_(gpu=replace(config.gpu, memory_bytes=agreed.total_bytes))
    own_plan = measured_plan(config, own, max_kv_blocks)
    plan = measured_plan(config, agreed, max_kv_blocks)
    if group.min_int(plan.num_kv_blocks) != plan.num_kv_blocks:
        raise RuntimeError("ranks derived different KV pools from the agreed measurement")
    core = build_core(config, profile=agreed.profile, plan=plan)
    store = make_store(shard_core(core, group.world_size), device)
    graphs = None
    if use_graphs:
        max_len = core.scheduler.config.max_model_len
        graphs = DecodeGraphs(model, kv_caches_of(store, config.model.num_layers),
                              config.num_seqs, max_len, config.block_size, device)
        graphs.capture()
    torch.cuda.empty_cache()
    engine = assemble_tp_engine(core, model, store, group, graphs, seed)
    rank_memory = {
        "rank": group.rank, "total_bytes": own.total_bytes, "weights_bytes": own.weights_bytes,
        "activation_peaks": {str(k): v for k, v in own.activation_peaks.items()},
        "activation_reserve_bytes": own_plan.activation_reserve_bytes,
        "non_torch_bytes": own.non_torch_bytes, "graph_bytes": own.graph_bytes,
        "own_kv_blocks": own_plan.num_kv_blocks, "own_kv_pool_bytes": own_plan.kv_pool_bytes,
        "own_reserve_share": own_plan.reserve_share,
        "kv_blocks": plan.num_kv_blocks, "kv_pool_bytes": plan.kv_pool_bytes,
        "kv_block_bytes": plan.block_bytes, "reserve_share": plan.reserve_share,
        "kv_tokens_per_gpu": plan.kv_capacity_tokens,
    }
    return TpSetup(engine, agreed, rank_memory, graphs)
