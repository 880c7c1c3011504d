"""One engine configuration and the shared core built from it (used by both executors)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from sim.core.block_pool import BlockPool
from sim.core.catalog import GIB, MIB, GpuSpec, ModelSpec
from sim.core.controller import ElasticController
from sim.core.elastic import (
    DrainStrategy,
    Policy,
    ReserveLayout,
    VmmCostModel,
    VmmCosts,
    plan_reserve,
)
from sim.core.memory_plan import (
    ActivationProfile,
    MemoryConfig,
    MemoryPlan,
    activation_bytes,
    plan_memory,
)
from sim.core.scheduler import Scheduler, SchedulerConfig


def vllm_default_chunk(gpu: GpuSpec) -> int:
    """vLLM v1's default max_num_batched_tokens for the OpenAI server: 8192 on GPUs with at
    least 70 GiB, 2048 below (vllm/engine/arg_utils.py, _set_default_args)."""
    return 8192 if gpu.memory_bytes >= 70 * GIB else 2048


def vllm_default_max_num_seqs(gpu: GpuSpec) -> int:
    """vLLM v1's default max_num_seqs for the OpenAI server: 1024 on GPUs with at least
    70 GiB, 256 below (same source)."""
    return 1024 if gpu.memory_bytes >= 70 * GIB else 256


@dataclass(frozen=True)
class EngineConfig:
    model: ModelSpec
    gpu: GpuSpec
    tensor_parallel_size: int = 1
    max_num_batched_tokens: int | None = None  # None: vLLM's default for the GPU
    max_num_seqs: int | None = None  # None: vLLM's default for the GPU
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    block_size: int = 16
    policy: Policy = Policy.STATIC
    # Migrate by default: on the H200 map's stressed cells, draining by preemption recomputes
    # the victims and lost up to 30% throughput, while migration copied ~10 MiB per detach
    # and lost nothing (README, 'Where elastic pays').
    drain: DrainStrategy = DrainStrategy.MIGRATE
    vmm_handle_bytes: int = 512 * MIB
    reclaim: str = "remap"
    enable_prefix_caching: bool = False
    hash_block_tokens: int = 512
    # Decode CUDA graph batch sizes: a decode-only batch runs padded to the next one up
    # (CostModel's graph_sizes). Empty: priced at its own size.
    cuda_graph_sizes: tuple[int, ...] = ()
    # Piecewise CUDA graph token counts for steps with prefill tokens: such a step's linear
    # layers run padded to the next one up (CostModel's token_graph_sizes; the engine captures
    # sim.core.cost_model.piecewise_capture_sizes(chunk)). Empty: prefill steps run fully eager.
    piecewise_graph_sizes: tuple[int, ...] = ()

    @property
    def chunk_tokens(self) -> int:
        return self.max_num_batched_tokens or vllm_default_chunk(self.gpu)

    @property
    def num_seqs(self) -> int:
        return self.max_num_seqs or vllm_default_max_num_seqs(self.gpu)

    def memory_config(self) -> MemoryConfig:
        return MemoryConfig(
            model=self.model, gpu=self.gpu, tensor_parallel_size=self.tensor_parallel_size,
            max_num_batched_tokens=self.chunk_tokens,
            gpu_memory_utilization=self.gpu_memory_utilization, max_num_seqs=self.num_seqs,
            max_model_len=self.max_model_len, block_size=self.block_size,
            vmm_handle_bytes=self.vmm_handle_bytes,
        )

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=self.chunk_tokens, max_num_seqs=self.num_seqs,
            max_model_len=max_model_len, block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            hash_block_tokens=self.hash_block_tokens,
        )

    def vmm_cost(self, costs: VmmCosts | None = None) -> VmmCostModel:
        """The VMM transition model; `costs` (a calibration's) replace the H200 defaults."""
        return VmmCostModel(handle_bytes=self.vmm_handle_bytes, reclaim=self.reclaim, costs=costs)

    def with_(self, **changes) -> EngineConfig:
        return replace(self, **changes)


@dataclass(frozen=True)
class EngineCore:
    config: EngineConfig
    plan: MemoryPlan
    layout: ReserveLayout
    scheduler: Scheduler

    @property
    def kv_capacity_tokens(self) -> int:
        """KV tokens with the reserve lent (the most the pool ever holds)."""
        return (self.plan.num_kv_blocks + self.layout.num_elastic_blocks) * self.config.block_size


def build_core(
    config: EngineConfig,
    profile: ActivationProfile | None = None,
    vmm: VmmCostModel | None = None,
    plan: MemoryPlan | None = None,
) -> EngineCore:
    """Memory plan -> block pool (base + elastic) -> controller -> scheduler.

    `plan` may be given when the KV pool was measured rather than predicted (GPU engine).
    """
    memory = config.memory_config()
    plan = plan or plan_memory(memory, profile)
    tp = config.tensor_parallel_size
    act = partial(_activation, config.model, tp, profile)
    layout = plan_reserve(config.policy, plan.activation_reserve_bytes, plan.block_bytes,
                          config.vmm_handle_bytes, act(1, 1))
    pool = BlockPool(plan.num_kv_blocks, layout.num_elastic_blocks,
                     elastic_attached=config.policy is Policy.OVERCOMMIT)
    controller = ElasticController(config.policy, layout, act, vmm or config.vmm_cost(),
                                   config.drain)
    scheduler = Scheduler(config.scheduler_config(memory.effective_max_model_len), pool,
                          controller)
    return EngineCore(config, plan, layout, scheduler)


def _activation(model: ModelSpec, tp: int, profile: ActivationProfile | None,
                num_tokens: int, num_rows: int) -> int:
    return activation_bytes(model, num_tokens, tp=tp, num_sample_rows=num_rows, profile=profile)
