"""Build a GPU engine: model, measured memory plan, shared core, KV pool, CUDA graphs.

Order (as vLLM's worker): create the context, load the weights, profile activations and
non-torch memory, trial-capture the decode graphs to measure their memory, size the KV pool
from what is left, build the shared core with that plan, create the pool, capture for real.

The elastic reserve uses reclaim="release": on detach its handles are released so torch's
caching allocator can hand the memory to the next prefill's activations; on attach torch's
cache is emptied first. "remap" would need activations to come from the pool's arena (a
custom torch allocator), which this engine does not have.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, replace

import torch

from gpu_backend.engine.elastic import ElasticExecutor
from gpu_backend.engine.engine import GpuEngine
from gpu_backend.engine.graphs import capture_sizes
from gpu_backend.engine.inputs import RequestMirror
from gpu_backend.engine.kv_store import PlainKVStore
from gpu_backend.engine.memory import (
    NUM_SCRATCH_BLOCKS,
    MemoryMeasurement,
    TorchBudget,
    device_used_bytes,
    dummy_store,
    fit_envelope,
    kv_caches_of,
    kv_layout,
    measure_activation_peak,
    measured_plan,
    profile_token_counts,
)
from gpu_backend.engine.piecewise import PiecewiseGraphs
from gpu_backend.engine.runner import DecodeGraphs, ModelRunner
from gpu_backend.engine.support import check_supported
from gpu_backend.kernels.flashinfer_attention import flashinfer_prefill
from gpu_backend.kernels.split_attention import warm_plans
from gpu_backend.layers import SPLIT_BACKENDS
from gpu_backend.model import build_model, set_mixed_split
from gpu_backend.vmm import ElasticKVPool
from sim.core.cost_model import piecewise_sizes_for
from sim.core.elastic import Policy
from sim.core.engine_config import EngineConfig, EngineCore, build_core
from sim.core.memory_plan import ActivationProfile
from sim.core.split_shapes import SdpaShape
from sim.recording.metrics import ReplicaRecorder

TORCH_CAP_SLACK_BYTES = 256 * 2**20  # allocator rounding and fragmentation above the peak


@dataclass
class EngineSetup:
    engine: GpuEngine
    measurement: MemoryMeasurement | None
    store: object
    graphs: DecodeGraphs | None
    budget: TorchBudget | None
    piecewise: PiecewiseGraphs | None = None


def rope_theta(model_name: str) -> float:
    return 1_000_000.0 if model_name.startswith("qwen") else 500_000.0


def fused_layers_enabled() -> bool:
    """False when GPU_BACKEND_FUSED=0: the torch norm, rotary and activation run instead."""
    return os.environ.get("GPU_BACKEND_FUSED", "1") != "0"


def load_model(config: EngineConfig, device: torch.device, seed: int,
               backend: str = "triton", dtype: torch.dtype = torch.bfloat16):
    """The model of `config` with random weights, its attention on `backend` (one of
    gpu_backend.layers.ATTENTION_BACKENDS). GPU_BACKEND_FUSED=0 in the environment turns
    the fused layer kernels off (an A/B switch for the device scripts)."""
    spec = config.model
    max_len = config.memory_config().effective_max_model_len
    model = build_model(spec, device, dtype, qkv_bias=spec.attention_bias,
                        rope_theta=rope_theta(spec.name), seed=seed,
                        attention_backend=backend, max_position=max_len,  # type: ignore[arg-type]
                        fused=fused_layers_enabled())
    set_mixed_split(model, config.mixed_split_min_keys)
    return model


def measure_memory(config: EngineConfig, device: torch.device, seed: int, use_graphs: bool,
                   piecewise_tokens: int | None = None, attention_backend: str = "triton"):
    """(model, MemoryMeasurement): everything the plan needs, measured on this device
    (`piecewise_tokens`: the memory of piecewise graphs up to that many tokens counted with
    the decode graphs'; the activation peaks are those of `attention_backend`'s steps)."""
    torch.zeros(1, device=device)
    torch.cuda.synchronize(device)
    used0, reserved0 = device_used_bytes(device), torch.cuda.memory_reserved(device)
    allocated0 = torch.cuda.memory_allocated(device)
    model = load_model(config, device, seed, attention_backend)
    torch.cuda.synchronize(device)
    weights = torch.cuda.memory_allocated(device) - allocated0
    workspace = attention_workspace_bytes(attention_backend, device)
    spec, bs = config.model, config.block_size
    max_len = config.memory_config().effective_max_model_len
    peaks = {n: measure_activation_peak(model, spec, n, config.num_seqs, bs, device, max_len)
             for n in profile_token_counts(config.chunk_tokens, config.num_seqs)}
    if attention_backend in SPLIT_BACKENDS:
        warm_split_plans(model, config, device)
    gc.collect()
    torch.cuda.empty_cache()
    non_torch = max(0, (device_used_bytes(device) - used0)
                    - (torch.cuda.memory_reserved(device) - reserved0))
    graph_bytes = (trial_graph_bytes(model, config, device, piecewise_tokens) if use_graphs
                   else 0)
    slope, fixed = fit_envelope(peaks)
    profile = ActivationProfile(slope, fixed + workspace, non_torch + graph_bytes)
    _, total = torch.cuda.mem_get_info(device)
    return model, MemoryMeasurement(total, weights, peaks, profile, non_torch, graph_bytes)


def attention_workspace_bytes(attention_backend: str, device: torch.device) -> int:
    """The bytes an attention backend holds for good on `device`, allocated now (before the
    activation peaks are measured, so none of them holds it): FlashInfer's workspace on the
    flashinfer backend (which also fails here, naming what to install, where FlashInfer is
    missing), else 0. The memory plan counts them with the activations' fixed bytes."""
    if attention_backend != "flashinfer":
        return 0
    return flashinfer_prefill(device).workspace_bytes


def split_sdpa_shapes(model, config: EngineConfig) -> list[SdpaShape]:
    """Every SDPA shape SPLIT can run in `config`'s steps (chunks up to its
    max_num_batched_tokens, contexts up to its max_model_len), by `model`'s padding rules."""
    shapes = model.layers[0].attn.split_shapes
    return shapes.sdpa_shapes(config.chunk_tokens,
                              config.memory_config().effective_max_model_len)


def warm_split_plans(model, config: EngineConfig, device: torch.device) -> float:
    """Build cuDNN's plan of every SPLIT shape of `config` (split_sdpa_shapes) before the
    first step, so no step of a replay builds one. Costs len(shapes) x the plan time
    (39 x 50-190 ms = 2-7 s for Llama-3.1-8B at 8,192 batched tokens and 32,768 of context,
    gpu_backend.kernels.split_shapes). Returns the seconds it took (0 off CUDA: no plans)."""
    if device.type != "cuda":
        return 0.0
    start = time.perf_counter()
    spec = config.model
    warm_plans(split_sdpa_shapes(model, config), spec.num_attention_heads, spec.num_kv_heads,
               spec.head_dim, next(model.parameters()).dtype, device)
    torch.cuda.synchronize(device)
    return time.perf_counter() - start


def trial_graph_bytes(model, config: EngineConfig, device: torch.device,
                      piecewise_tokens: int | None = None) -> int:
    """Device memory the decode graphs (and the piecewise graphs up to `piecewise_tokens`)
    take, captured once over a one-block dummy cache."""
    store = dummy_store(config.model, NUM_SCRATCH_BLOCKS, config.block_size, device)
    torch.cuda.synchronize(device)
    before = device_used_bytes(device)
    caches = kv_caches_of(store, config.model.num_layers)
    graphs = DecodeGraphs(model, caches, config.num_seqs,
                          config.memory_config().effective_max_model_len, config.block_size,
                          device)
    graphs.capture()
    pieces = (PiecewiseGraphs(model, caches, piecewise_tokens, device)
              if piecewise_tokens is not None else None)
    if pieces is not None:
        pieces.capture()
    used = device_used_bytes(device) - before
    graphs.release()
    if pieces is not None:
        pieces.release()
    del graphs, pieces, store, caches
    gc.collect()
    torch.cuda.empty_cache()
    return max(0, used)


def build_gpu_engine(config: EngineConfig, *, device: torch.device | None = None, seed: int = 0,
                     use_graphs: bool = True, torch_cap: str = "auto",
                     torch_cap_headroom_bytes: int = TORCH_CAP_SLACK_BYTES,
                     max_kv_blocks: int | None = None, piecewise: bool = False,
                     piecewise_max_tokens: int | None = None,
                     attention_backend: str = "triton") -> EngineSetup:
    """`piecewise`: steps with prefill tokens replay piecewise graphs (engine/piecewise.py)
    captured at `sim.core.cost_model.piecewise_capture_sizes` of the chunk, or of
    `piecewise_max_tokens` when that is smaller (a longer step runs fully eager); needs
    `use_graphs`. `torch_cap_headroom_bytes`: what a capped torch may hold above the setup's
    memory and the activation reserve (allocator rounding and fragmentation).
    `attention_backend`: one of gpu_backend.layers.ATTENTION_BACKENDS but torch: "triton"
    (every step through the Triton paged kernel), "split" (steps with prefill rows through
    SPLIT, gpu_backend.kernels.split_attention), "auto" (SPLIT for prefill sequences of at
    least SPLIT_MIN_QUERY new tokens) or "flashinfer" (prefill rows through FlashInfer,
    gpu_backend.kernels.flashinfer_attention). On split and auto every SPLIT shape's cuDNN
    plan is built while the memory is measured (warm_split_plans); on flashinfer its
    workspaces are allocated then (attention_workspace_bytes)."""
    check_supported(config)
    if piecewise and not use_graphs:
        raise ValueError("piecewise graphs need CUDA graphs: drop --no-graphs")
    device = device or torch.device("cuda", torch.cuda.current_device())
    config = config.with_(reclaim="release")
    piecewise_tokens = (max(piecewise_sizes_for(config.chunk_tokens, piecewise_max_tokens))
                        if piecewise else None)
    model, m = measure_memory(config, device, seed, use_graphs, piecewise_tokens,
                              attention_backend)
    config = config.with_(gpu=replace(config.gpu, memory_bytes=m.total_bytes))
    core = build_core(config, profile=m.profile, plan=measured_plan(config, m, max_kv_blocks))
    store = make_store(core, device)
    graphs, pieces = capture_graphs(model, store, core, device, use_graphs, piecewise_tokens)
    torch.cuda.empty_cache()
    budget = None
    if torch_cap == "on" or (torch_cap == "auto" and config.policy is Policy.OVERCOMMIT):
        budget = torch_budget(core, m, device, attention_backend, torch_cap_headroom_bytes)
    engine = assemble_engine(core, model, store, device, graphs, budget, seed, pieces)
    if budget is not None:
        budget.set_mapped(engine.elastic.mapped_bytes)
    return EngineSetup(engine, m, store, graphs, budget, pieces)


def capture_graphs(model, store, core: EngineCore, device: torch.device, use_graphs: bool,
                   piecewise_tokens: int | None
                   ) -> tuple[DecodeGraphs | None, PiecewiseGraphs | None]:
    """The engine's CUDA graphs over `store`'s caches, captured: the decode graphs at
    capture_sizes(max_num_seqs) with `use_graphs`, then the piecewise graphs up to
    `piecewise_tokens` when given (None for each one not captured)."""
    config = core.config
    graphs = None
    if use_graphs:
        graphs = DecodeGraphs(model, kv_caches_of(store, config.model.num_layers),
                              config.num_seqs, core.scheduler.config.max_model_len,
                              config.block_size, device, capture_sizes(config.num_seqs))
        graphs.capture()
    pieces = None
    if piecewise_tokens is not None:
        pieces = PiecewiseGraphs(model, kv_caches_of(store, config.model.num_layers),
                                 piecewise_tokens, device)
        pieces.capture()
    return graphs, pieces


def torch_budget(core: EngineCore, measurement: MemoryMeasurement, device: torch.device,
                 attention_backend: str, headroom_bytes: int) -> TorchBudget:
    """The cap on torch's allocator: what torch holds at the end of setup, the plan's
    activation reserve less the attention backend's workspaces (the reserve counts them, and
    torch already holds them) and `headroom_bytes` of slack."""
    held = attention_workspace_bytes(attention_backend, device)
    return TorchBudget(device, torch.cuda.memory_reserved(device),
                       core.plan.activation_reserve_bytes - held, measurement.total_bytes,
                       headroom_bytes)


def make_store(core: EngineCore, device: torch.device):
    """ElasticKVPool (device ids shifted by the scratch block) or, without a reserve, a tensor."""
    config, layout = core.config, kv_layout(core.config.model, core.config.block_size)
    num_device_base = core.plan.num_kv_blocks + NUM_SCRATCH_BLOCKS
    if config.policy is Policy.STATIC or core.layout.lent_bytes == 0:
        return PlainKVStore(layout, num_device_base, device=device)
    sched = core.scheduler
    # Overcommit maps on first use: granule-sized handles, so the mapped bytes follow the
    # used elastic blocks as closely as the driver allows (the core counts used blocks).
    handle_bytes = (core.layout.granule_bytes if config.policy is Policy.OVERCOMMIT
                    else config.vmm_handle_bytes)
    pool = ElasticKVPool(layout, num_device_base, core.layout.lent_bytes,
                         elastic_handle_bytes=handle_bytes, reclaim="release",
                         device_ordinal=device.index or 0,
                         live_elastic_blocks=lambda: sched.pool.num_used_elastic)
    return pool


def plain_store(core: EngineCore, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.bfloat16) -> PlainKVStore:
    """A tensor store with the core's base (+ scratch) and elastic blocks (CPU runs, tests)."""
    config = core.config
    return PlainKVStore(kv_layout(config.model, config.block_size),
                        core.plan.num_kv_blocks + NUM_SCRATCH_BLOCKS,
                        core.layout.num_elastic_blocks, device=device, dtype=dtype,
                        elastic_handle_bytes=config.vmm_handle_bytes)


def assemble_engine(core: EngineCore, model, store, device: torch.device,
                    graphs: DecodeGraphs | None, budget: TorchBudget | None = None,
                    seed: int = 0, piecewise: PiecewiseGraphs | None = None) -> GpuEngine:
    """Wire runner, mirror, elastic executor and recorder around a built core and store."""
    cuda = device.type == "cuda"
    caches = kv_caches_of(store, core.config.model.num_layers)
    runner = ModelRunner(model, caches, device, graphs, piecewise)
    mirror = RequestMirror(core.config.model.vocab_size, core.config.block_size,
                           block_id_offset=NUM_SCRATCH_BLOCKS, seed=seed)
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    elastic = ElasticExecutor(
        store, core.config.policy, block_id_offset=NUM_SCRATCH_BLOCKS,
        num_core_base_blocks=core.plan.num_kv_blocks, sync=sync,
        empty_cache=torch.cuda.empty_cache if cuda else None,
        on_mapped=budget.set_mapped if budget is not None else None,
        reserved_bytes=(lambda: torch.cuda.memory_reserved(device)) if cuda else None)
    if core.config.policy is Policy.OVERCOMMIT and not elastic.partial_attach:
        store.attach()  # no partial attach: map the whole reserve up front
    recorder = ReplicaRecorder(0, core.config.block_size)
    oom_errors = (torch.OutOfMemoryError,) if cuda else (MemoryError,)
    return GpuEngine(core, runner, mirror, elastic, recorder, oom_errors=oom_errors,
                     on_oom=torch.cuda.empty_cache if cuda else None)
