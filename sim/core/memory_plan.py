"""Per-GPU memory plan: how vLLM splits GPU memory into weights, activations and KV cache.

vLLM v1's ``Worker.determine_available_memory`` (gpu_worker.py) loads the weights, runs
``profile_run`` -- one dummy forward of ``max_num_batched_tokens`` tokens spread over
``min(max_num_batched_tokens, max_num_seqs)`` requests, then the sampler on one logit row per
request -- reads torch's caching-allocator peak and the non-torch growth, and gives the KV
cache what is left of ``total x gpu_memory_utilization``::

    |<---------------------- total x gpu_memory_utilization ---------------------->|
    | weights | activation reserve (profiled peak) | non-torch | KV pool ........... |

The activation reserve is the memory elastic reclamation lends to the KV pool while only
decodes run. The CUDA context, created before vLLM's baseline snapshot, is not subtracted:
it lives in the ``1 - gpu_memory_utilization`` headroom.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sim.core.activation import ActivationProfile, activation_bytes
from sim.core.catalog import GIB, MIB, GpuSpec, ModelSpec

__all__ = ["ActivationProfile", "MemoryConfig", "MemoryPlan", "activation_bytes", "plan_memory",
           "plan_summary"]

# max_model_len when None, capped at the model's max_position_embeddings (model defaults
# reach 128k+)
DEFAULT_MAX_MODEL_LEN = 32768
BLOCK_SIZES = (8, 16, 32, 64, 128)  # vLLM's --block-size choices

# Non-torch memory vLLM subtracts (its "non-torch memory" log line plus the CUDA graph estimate).
# 0.13 GiB: logged at TP 1 on H100 for Llama-3.1-8B, Qwen3-0.6B and gpt-oss-20b alike
# (llm-d-benchmark config_explorer/empirical-vllm-memory-results.md): cuBLAS/cuBLASLt
# workspaces and other allocations made outside torch's allocator during profiling.
NON_TORCH_BASE_BYTES = int(0.13 * GIB)
# 0.55 GiB logged at TP 2 for Llama-3.3-70B (same source) -> +0.42 GiB for NCCL communicator
# buffers and vLLM's custom all-reduce buffers. Ring/NVLS buffers do not grow much with the
# number of ranks, so we keep it flat for any tp > 1 (unmeasured for TP 4/8).
NCCL_BYTES = int(0.42 * GIB)
# vLLM >= 0.21 profiles the CUDA graph pool before sizing the KV cache ("Estimated CUDA graph
# memory: 0.36 GiB" in vLLM logs, vllm-project issue threads; 0.39 GiB for gpt-oss-20b in the
# llm-d logs; older "Graph capturing finished ... took 0.5 GiB" lines for 7-8B models).
CUDA_GRAPH_POOL_BYTES = int(0.5 * GIB)
# CUDA context + kernel images: 79.18 GiB total vs 78.57 GiB free at vLLM startup on H100
# (llm-d logs). Reported, not subtracted from the KV pool (see module docstring).
CUDA_CONTEXT_BYTES = int(0.6 * GIB)


@dataclass(frozen=True)
class MemoryConfig:
    model: ModelSpec
    gpu: GpuSpec
    tensor_parallel_size: int = 1
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_model_len: int | None = None  # None: DEFAULT_MAX_MODEL_LEN or the model's context
    block_size: int = 16
    vmm_handle_bytes: int = 512 * MIB  # the elastic reserve is attached in handles of this size
    piecewise_max_tokens: int = 0  # the largest piecewise CUDA graph captured (0: none)

    def __post_init__(self) -> None:
        tp, model = self.tensor_parallel_size, self.model
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if tp < 1 or tp & (tp - 1):
            raise ValueError(f"tensor_parallel_size must be a power of two (1, 2, 4, 8), got {tp}")
        if model.num_attention_heads % tp:
            raise ValueError(
                f"tensor_parallel_size {tp} must divide the "
                f"{model.num_attention_heads} attention heads of {model.name}"
            )
        if model.num_kv_heads % tp and tp % model.num_kv_heads:
            raise ValueError(
                f"tensor_parallel_size {tp} and the {model.num_kv_heads} KV heads "
                f"of {model.name} must divide one another"
            )
        if model.moe is not None and model.moe.moe_intermediate_size % tp:
            raise ValueError(
                f"tensor_parallel_size {tp} must divide the expert width "
                f"{model.moe.moe_intermediate_size} of {model.name} (experts split by TP)"
            )
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens (chunk size) must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError("max_model_len must be >= 1 (or None for the default)")
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {self.block_size}")
        granularity = self.gpu.vmm_granularity_bytes
        if self.vmm_handle_bytes < granularity or self.vmm_handle_bytes % granularity:
            raise ValueError(
                f"vmm_handle_bytes ({self.vmm_handle_bytes}) must be a positive "
                f"multiple of the {self.gpu.name} VMM granularity ({granularity} B)"
            )

    @property
    def effective_max_model_len(self) -> int:
        if self.max_model_len is not None:
            return self.max_model_len
        return min(DEFAULT_MAX_MODEL_LEN, self.model.max_position_embeddings)

    @property
    def num_sample_rows(self) -> int:
        """Logit rows in vLLM's dummy sampler run: one per dummy request."""
        return min(self.max_num_batched_tokens, self.max_num_seqs)


def non_torch_bytes(tp: int) -> int:
    """Non-torch memory vLLM subtracts before sizing the KV cache (see the constants above)."""
    return NON_TORCH_BASE_BYTES + CUDA_GRAPH_POOL_BYTES + (NCCL_BYTES if tp > 1 else 0)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU byte budget. Every ``*_bytes`` is for one rank."""

    total_bytes: int
    usable_bytes: int  # total x gpu_memory_utilization
    weights_bytes: int
    activation_reserve_bytes: int
    non_torch_bytes: int
    kv_pool_bytes: int
    kv_bytes_per_token: int
    block_bytes: int
    num_kv_blocks: int
    kv_capacity_tokens: int
    reserve_handles: int  # whole VMM handles the reserve holds
    reserve_blocks: int  # KV blocks those handles hold when lent
    reserve_share: float  # activation_reserve_bytes / kv_pool_bytes
    # A decode-only step still runs a forward of up to max_num_seqs tokens and the sampler on
    # max_num_seqs rows; that peak must stay backed while the reserve is lent.
    decode_activation_bytes: int
    lendable_handles: int  # whole handles of (reserve - decode peak)
    lendable_blocks: int  # KV blocks safely lendable during decode-only steps
    cuda_context_bytes: int  # informational: lives in the 1 - utilization headroom

    def to_dict(self) -> dict[str, int | float]:
        return asdict(self)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB"


def plan_memory(cfg: MemoryConfig, profile: ActivationProfile | None = None) -> MemoryPlan:
    """Size the KV pool the way vLLM's worker does; raise ValueError if nothing is left."""
    tp, model = cfg.tensor_parallel_size, cfg.model
    total = cfg.gpu.memory_bytes
    usable = _usable_bytes(cfg)
    weights = model.weight_bytes(tp)
    reserve = activation_bytes(
        model,
        cfg.max_num_batched_tokens,
        tp=tp,
        num_sample_rows=cfg.num_sample_rows,
        profile=profile,
    )
    non_torch = _planned_non_torch_bytes(cfg, profile)
    kv_pool = usable - weights - reserve - non_torch
    kv_per_token = model.kv_bytes_per_token(tp)
    block_bytes = cfg.block_size * kv_per_token
    if kv_pool < block_bytes:
        raise ValueError(
            f"{model.name} at TP {tp} does not fit on {cfg.gpu.name}: weights {_gib(weights)} + "
            f"activation reserve {_gib(reserve)} + non-torch {_gib(non_torch)} + one KV block "
            f"exceed the usable {_gib(usable)} by {_gib(block_bytes - kv_pool)}; raise "
            f"--tensor-parallel-size, lower --max-num-batched-tokens or --max-num-seqs, or "
            f"raise --gpu-memory-utilization"
        )
    num_blocks = kv_pool // block_bytes
    _check_holds_max_len(cfg, num_blocks * cfg.block_size)
    handles = reserve // cfg.vmm_handle_bytes
    decode_peak = activation_bytes(
        model, cfg.max_num_seqs, tp=tp, num_sample_rows=cfg.max_num_seqs, profile=profile
    )
    lendable_handles = max(0, reserve - decode_peak) // cfg.vmm_handle_bytes
    return MemoryPlan(
        total_bytes=total,
        usable_bytes=usable,
        weights_bytes=weights,
        activation_reserve_bytes=reserve,
        non_torch_bytes=non_torch,
        kv_pool_bytes=kv_pool,
        kv_bytes_per_token=kv_per_token,
        block_bytes=block_bytes,
        num_kv_blocks=num_blocks,
        kv_capacity_tokens=num_blocks * cfg.block_size,
        reserve_handles=handles,
        reserve_blocks=handles * cfg.vmm_handle_bytes // block_bytes,
        reserve_share=reserve / kv_pool,
        decode_activation_bytes=decode_peak,
        lendable_handles=lendable_handles,
        lendable_blocks=lendable_handles * cfg.vmm_handle_bytes // block_bytes,
        cuda_context_bytes=CUDA_CONTEXT_BYTES,
    )


def _usable_bytes(cfg: MemoryConfig) -> int:
    """The GPU memory vLLM may use (gpu_memory_utilization of the total), once the CUDA
    context is known to fit beside it."""
    total = cfg.gpu.memory_bytes
    if total * cfg.gpu_memory_utilization > total - CUDA_CONTEXT_BYTES:
        highest = 1 - CUDA_CONTEXT_BYTES / total
        raise ValueError(
            f"gpu_memory_utilization {cfg.gpu_memory_utilization} leaves no room for "
            f"the ~{_gib(CUDA_CONTEXT_BYTES)} CUDA context; use <= {highest:.3f}"
        )
    return int(total * cfg.gpu_memory_utilization)


def _planned_non_torch_bytes(cfg: MemoryConfig, profile: ActivationProfile | None) -> int:
    """Memory outside torch's allocator: the profile's measurement where it has one (its
    piecewise graphs' share grown or shrunk to the configured size), else the default."""
    if profile is None or profile.non_torch_bytes is None:
        return non_torch_bytes(cfg.tensor_parallel_size)
    if profile.graph_tokens is None:
        return profile.non_torch_bytes
    grown = profile.bytes_per_token * (cfg.piecewise_max_tokens - profile.graph_tokens)
    return max(0, profile.non_torch_bytes + round(grown))


def _check_holds_max_len(cfg: MemoryConfig, capacity_tokens: int) -> None:
    max_len = cfg.effective_max_model_len
    if capacity_tokens < max_len:
        raise ValueError(
            f"the KV pool holds {capacity_tokens} tokens per GPU, fewer than max_model_len "
            f"{max_len} (vLLM refuses to start); lower --max-model-len or raise "
            f"--tensor-parallel-size"
        )


def plan_summary(plan: MemoryPlan) -> str:
    """One-line human summary, for logs."""
    return (
        f"KV {_gib(plan.kv_pool_bytes)} = {plan.kv_capacity_tokens} tokens; reserve "
        f"{_gib(plan.activation_reserve_bytes)} ({plan.reserve_share:.1%} of KV, "
        f"{plan.lendable_blocks} of {plan.reserve_blocks} blocks safely lendable)"
    )
