"""The engine configuration, the one place engine defaults live, and the core built from it.

`EngineConfig` holds every engine setting both executors (the simulator and the GPU engine)
and validation read. Its defaults are vLLM v1's, each resolved explicitly from an Optional
field (None: the rule applies), as sim.core.vllm_defaults lists them.

`__post_init__` refuses what vLLM's EngineArgs refuses (max_num_batched_tokens below
max_num_seqs; without chunked prefill, below max_model_len; a max_model_len beyond the
model's context without allow_long_max_model_len) and values out of range, each with a
message saying what to change (sim.core.engine_checks). Every field carries a `Setting`
(sim.core.settings): `sim.core.config_flags` makes every command's flags from them, and
`to_json`/`from_json` write and read the configuration a run used (a GPU replay's
config.json; sim.core.config_json).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from sim.core import config_json
from sim.core.block_pool import BlockPool
from sim.core.catalog import (
    DTYPES,
    GPUS,
    KV_CACHE_DTYPE_BYTES,
    MIB,
    MODELS,
    QUANTIZATION_BYTES,
    GpuSpec,
    ModelSpec,
    apply_dtypes,
    get_gpu,
    get_model,
)
from sim.core.controller import ElasticController
from sim.core.elastic import (
    DrainStrategy,
    Policy,
    ReserveLayout,
    VmmCostModel,
    VmmCosts,
    plan_reserve,
)
from sim.core.engine_checks import RECLAIM_MODES, check_config
from sim.core.launch_shapes import mixed_split_min_keys
from sim.core.memory_plan import (
    BLOCK_SIZES,
    ActivationProfile,
    MemoryConfig,
    MemoryPlan,
    activation_bytes,
    plan_memory,
)
from sim.core.scheduler import Scheduler, SchedulerConfig
from sim.core.settings import (
    BOOL,
    COUNT,
    FLOAT,
    INT,
    MIB_BYTES,
    SIZES,
    choice,
    enum_codec,
    optional,
    setting,
    spec_codec,
)
from sim.core.split_shapes import ATTENTION_BACKENDS
from sim.core.vllm_defaults import (
    DEFAULT_GPU,
    DEFAULT_MODEL,
    MAX_NUM_BATCHED_TOKENS_RULE,
    MAX_NUM_SEQS_RULE,
    NON_CHUNKED_MIN_BATCHED_TOKENS,
    vllm_default_chunk,
    vllm_default_max_num_seqs,
)

__all__ = [
    "DEFAULT_GPU", "DEFAULT_MODEL", "NON_CHUNKED_MIN_BATCHED_TOKENS", "EngineConfig", "EngineCore",
    "build_core", "vllm_default_chunk", "vllm_default_max_num_seqs",
]


@dataclass(frozen=True)
class EngineConfig:
    model: ModelSpec = field(default_factory=partial(get_model, DEFAULT_MODEL), metadata=setting(
        f"model: a preset ({', '.join(MODELS)}), a Hugging Face config.json (file or folder) "
        "or a Hugging Face repo id", "--model",
        codec=spec_codec(ModelSpec, get_model), default_text=DEFAULT_MODEL))
    gpu: GpuSpec = field(default_factory=partial(get_gpu, DEFAULT_GPU), metadata=setting(
        f"GPU: a preset ({', '.join(GPUS)}, or an alias such as h100) for its memory and peak "
        "rates", "--gpu", codec=spec_codec(GpuSpec, get_gpu), default_text=DEFAULT_GPU))
    tensor_parallel_size: int = field(default=1, metadata=setting(
        "GPUs per model replica (tensor parallelism; weights, KV heads and activations split)",
        "--tensor-parallel-size", "--tp", codec=COUNT))
    max_num_batched_tokens: int | None = field(default=None, metadata=setting(
        "tokens per engine step (the chunk size); it sizes the activation reserve",
        "--max-num-batched-tokens", "--chunk", codec=optional(COUNT),
        default_text=MAX_NUM_BATCHED_TOKENS_RULE))
    max_num_seqs: int | None = field(default=None, metadata=setting(
        "sequences per engine step", "--max-num-seqs", codec=optional(COUNT),
        default_text=MAX_NUM_SEQS_RULE))
    gpu_memory_utilization: float = field(default=0.9, metadata=setting(
        "share of the GPU's memory the engine may use (weights, activations, KV cache)",
        "--gpu-memory-utilization", codec=FLOAT))
    max_model_len: int | None = field(default=None, metadata=setting(
        "longest request (prompt + output tokens): longer ones are rejected, and the KV pool "
        "must hold one", "--max-model-len", codec=optional(COUNT),
        default_text="the model's max_position_embeddings"))
    allow_long_max_model_len: bool = field(default=False, metadata=setting(
        "accept a max_model_len beyond the model's context (max_position_embeddings), as "
        "vLLM does only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: the positions past it were "
        "never trained", "--allow-long-max-model-len", codec=BOOL))
    block_size: int = field(default=16, metadata=setting(
        f"tokens per KV cache block, one of {', '.join(map(str, BLOCK_SIZES))}",
        "--block-size", codec=INT))
    policy: Policy = field(default=Policy.STATIC, metadata=setting(
        "what the activation reserve does: static (kept for activations), elastic (lent to "
        "the KV pool while only decodes run), overcommit (added to the KV pool for good)",
        "--policy", codec=enum_codec(Policy, Policy.parse),
        choices=tuple(p.value for p in Policy)))
    # Migrate: on the H200 map's stressed cells, draining by preemption recomputes the victims
    # and lost up to 30% throughput, while migration copied ~10 MiB per detach and lost
    # nothing (README, 'Where elastic pays').
    drain: DrainStrategy = field(default=DrainStrategy.MIGRATE, metadata=setting(
        "how the elastic policy empties the reserve before a prefill: migrate (copy the "
        "blocks to free base blocks), preempt (recompute their requests later) or wait",
        "--drain", codec=enum_codec(DrainStrategy, DrainStrategy.parse),
        choices=tuple(d.value for d in DrainStrategy)))
    vmm_handle_bytes: int = field(default=512 * MIB, metadata=setting(
        "CUDA VMM handle size of the elastic reserve, MiB (a multiple of 2)",
        "--vmm-handle-mib", codec=MIB_BYTES))
    # Release: the GPU engine's activations come from torch's allocator, which only a
    # released handle's memory reaches (gpu_backend/engine/setup.py); remap needs an arena.
    reclaim: str = field(default="release", metadata=setting(
        "how a detached reserve reaches the activations: release (free the handles and "
        "create them again on attach, as the GPU engine does) or remap (keep the handles and "
        "map them elsewhere; simulator only)", "--reclaim", codec=choice(RECLAIM_MODES),
        choices=RECLAIM_MODES))
    # Under async scheduling a detach comes while the step before it still runs. When that
    # step's tables hold no elastic block its kernels never touch the reserve, so the GPU
    # engine unmaps behind it and launches the prompt's step at once (ElasticAction.
    # needs_idle_device); an attach always waits (it hands torch's cache back). The unmap
    # still holds the device back about as long as it takes, so the simulator charges its
    # whole time either way (sim.engine's _run_ahead); running behind saves the drain. Replays
    # recorded before this setting existed waited for every elastic action.
    detach_behind_step: bool = field(default=True, metadata=setting(
        "under async scheduling, take the reserve back while the step in flight still runs "
        "when that step holds no elastic block (nothing it runs touches the reserve), and "
        "launch the next step behind it; off: wait for the step in flight first, as an "
        "attach does", "--detach-behind-step", codec=BOOL, absent=False))
    enable_prefix_caching: bool = field(default=True, metadata=setting(
        "reuse the KV blocks of a prompt prefix computed before (traces with block hashes)",
        "--enable-prefix-caching", codec=BOOL))
    hash_block_tokens: int = field(default=512, metadata=setting(
        "prompt tokens one trace block hash names (Mooncake traces: 512)",
        "--hash-block-tokens", codec=COUNT))
    # Decode CUDA graph batch sizes: a decode-only batch runs padded to the next one up
    # (CostModel's graph_sizes). Empty: priced at its own size.
    cuda_graph_sizes: tuple[int, ...] = field(default=(), metadata=setting(
        "decode CUDA graph batch sizes, comma-separated: a decode-only batch is priced padded "
        "to the next size up, eager beyond the largest (vLLM captures 1,2,4,8,16,24,...,512); "
        "none: each batch at its own size. The GPU engine captures its own and records them",
        "--cuda-graph-sizes", codec=SIZES))
    # Piecewise CUDA graph token counts for steps with prefill tokens: such a step's linear
    # layers run padded to the next one up (CostModel's token_graph_sizes; the engine captures
    # sim.core.cost_model.piecewise_capture_sizes(chunk)). Empty: prefill steps run fully
    # eager. Set from --piecewise-graphs and --piecewise-max-tokens (sim.core.config_flags).
    piecewise_graph_sizes: tuple[int, ...] = field(default=(), metadata=setting(
        "token counts of the piecewise CUDA graphs that steps with prefill tokens run padded "
        "to", codec=SIZES))
    dtype: str = field(default="auto", metadata=setting(
        "model dtype (weights, activations and, with kv_cache_dtype auto, the KV cache); auto "
        "keeps the checkpoint's (config.json's torch_dtype)", "--dtype", codec=choice(DTYPES),
        choices=DTYPES))
    kv_cache_dtype: str = field(default="auto", metadata=setting(
        "KV cache element type: auto (the model dtype) or fp8 (one byte per element)",
        "--kv-cache-dtype", codec=choice(tuple(KV_CACHE_DTYPE_BYTES)),
        choices=tuple(KV_CACHE_DTYPE_BYTES)))
    quantization: str | None = field(default=None, metadata=setting(
        "weight quantization: fp8 stores the decoder's linear weights in one byte",
        "--quantization", codec=optional(choice(tuple(QUANTIZATION_BYTES))),
        choices=tuple(QUANTIZATION_BYTES)))
    enable_chunked_prefill: bool = field(default=True, metadata=setting(
        "split a prompt over steps to fit max_num_batched_tokens; off, a prompt is never "
        "split (the memory plan takes it; the simulator's scheduler does not model it)",
        "--enable-chunked-prefill", codec=BOOL))

    # The attention of steps with prefill tokens (decode-only steps run the Triton kernel on
    # every backend): what the GPU engine runs and the cost model prices (sim.core.split_shapes).
    attention_backend: str = field(default="triton", metadata=setting(
        "attention of steps with prefill tokens. triton: the Triton paged kernel over the "
        "whole batch. split: decode rows through the Triton decode path, each prefill "
        "sequence through SPLIT (cuDNN's SDPA over the chunk's own keys, causal, and over its "
        "cached prefix in segments, merged by log-sum-exp, every call padded to one of a few "
        "shapes). auto: SPLIT for prefill sequences of at least 2,048 new tokens, the Triton "
        "kernel for the rest. flashinfer: every prefill sequence through FlashInfer's paged "
        "prefill over the cache in place (its Hopper kernel on Hopper; needs the flashinfer "
        "extra), a mixed step's decode rows apart through the Triton decode path. The GPU "
        "engine runs split, auto and flashinfer on one GPU only",
        "--attention-backend", codec=choice(ATTENTION_BACKENDS), choices=ATTENTION_BACKENDS,
        absent="triton"))

    # A step with prefill tokens on the Triton kernel launches once over the whole batch, and
    # each decode row takes a 128-row tile per KV head there: a tile's FLOPs per key where a
    # decode step reads the key. Long decode rows beside a chunk make that the step's largest
    # cost; run apart they cost their reads and two more launches per layer (host time). On an
    # H200, Llama-3.1-8B, async, static chunk 2,048: Mooncake (decode rows of ~170k keys,
    # ~680 MiB of KV per layer) TTFT p50 -33% and throughput +10% apart; Azure conversations
    # (10-21k keys, 40-80 MiB) TTFT p50 +22% and TPOT p50 +9% apart (docs/engine.md).
    mixed_split_bytes: int = field(default=128 * MIB, metadata=setting(
        "on the Triton kernel, a step with prefill tokens runs its decode rows apart (the "
        "decode kernel with their keys split over the SMs, then the prefill rows: two more "
        "launches per layer) when they hold at least this much KV per layer and GPU, MiB; 0: "
        "never (one launch, each decode row a 128-row tile)", "--mixed-split-mib",
        codec=MIB_BYTES, absent=0))

    # vLLM's scheduler config `async_scheduling` (on by default since v0.14, unless an option
    # it cannot run with is set): step N+1 is scheduled and launched while step N runs; a
    # request arriving during step N is seen by step N+2, and the host's work of a step hides
    # behind the device's. The profile prices a step timed alone; the simulator derives the
    # overlap (sim/engine.py) and validation checks it per engine (docs/engine.md, "Async
    # scheduling").
    async_scheduling: bool = field(default=True, metadata=setting(
        "schedule and launch each step while the one before it still runs on the GPU (the "
        "next step's decode inputs taken from the running step's ids on the device): the "
        "host's per-step work hides behind the device's, and a request arriving during a "
        "step waits one step more to be scheduled", "--async-scheduling", codec=BOOL,
        absent=False))

    def __post_init__(self) -> None:
        # The model as served: dtype, KV cache dtype and quantization applied. apply_dtypes
        # sets each size outright, so applying it again (replace, from_json) changes nothing.
        object.__setattr__(self, "model", apply_dtypes(
            self.model, dtype=self.dtype, kv_cache_dtype=self.kv_cache_dtype,
            quantization=self.quantization))
        check_config(self)

    # ------------------------------------------------------------------ resolved defaults
    @property
    def effective_max_model_len(self) -> int:
        if self.max_model_len is not None:
            return self.max_model_len
        return self.model.max_position_embeddings

    @property
    def chunk_tokens(self) -> int:
        """max_num_batched_tokens as given, else vLLM's default (sim.core.vllm_defaults)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if not self.enable_chunked_prefill:
            return max(self.effective_max_model_len, NON_CHUNKED_MIN_BATCHED_TOKENS)
        return vllm_default_chunk(self.gpu)

    @property
    def num_seqs(self) -> int:
        """max_num_seqs as given, else vLLM's default capped at max_num_batched_tokens."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return min(vllm_default_max_num_seqs(self.gpu), self.chunk_tokens)

    @property
    def mixed_split_min_keys(self) -> int:
        """The decode rows' keys from which a mixed step runs them apart, per GPU
        (mixed_split_bytes; sim.core.launch_shapes.mixed_split_min_keys); 0: never."""
        return mixed_split_min_keys(self.model.kv_bytes_per_token(self.tensor_parallel_size),
                                    self.model.num_layers, self.mixed_split_bytes)

    # ------------------------------------------------------------------ derived configs
    def memory_config(self) -> MemoryConfig:
        return MemoryConfig(
            model=self.model, gpu=self.gpu, tensor_parallel_size=self.tensor_parallel_size,
            max_num_batched_tokens=self.chunk_tokens,
            gpu_memory_utilization=self.gpu_memory_utilization, max_num_seqs=self.num_seqs,
            max_model_len=self.effective_max_model_len, block_size=self.block_size,
            vmm_handle_bytes=self.vmm_handle_bytes,
            piecewise_max_tokens=max(self.piecewise_graph_sizes, default=0),
        )

    def scheduler_config(self) -> SchedulerConfig:
        if not self.enable_chunked_prefill:
            raise ValueError("--no-enable-chunked-prefill: the scheduler splits every prompt "
                             "that exceeds the step's token budget (vLLM v1's chunked "
                             "prefill) and cannot run it unsplit; drop the flag (`python -m "
                             "sim memory` plans the memory of either)")
        return SchedulerConfig(
            max_num_batched_tokens=self.chunk_tokens, max_num_seqs=self.num_seqs,
            max_model_len=self.effective_max_model_len, block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            hash_block_tokens=self.hash_block_tokens,
        )

    def vmm_cost(self, costs: VmmCosts | None = None) -> VmmCostModel:
        """The VMM transition model; `costs` (a calibration's) replace the H200 defaults."""
        return VmmCostModel(handle_bytes=self.vmm_handle_bytes, reclaim=self.reclaim, costs=costs)

    def with_(self, **changes) -> EngineConfig:
        return replace(self, **changes)

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON values (models and GPUs in full)."""
        return config_json.to_dict(self)

    @classmethod
    def from_dict(cls, data: object, source: object = "engine config",
                  recorded: bool = False) -> EngineConfig:
        """The inverse of `to_dict`; a missing key takes its default, or in a `recorded`
        configuration (a replay's config.json) the value engines ran before the key existed.
        Errors name `source` and the key."""
        return config_json.from_dict(cls, data, source, recorded)

    def to_json(self) -> str:
        return config_json.to_json(self)

    @classmethod
    def from_json(cls, text: str, source: object = "engine config",
                  recorded: bool = False) -> EngineConfig:
        return config_json.from_json(cls, text, source, recorded)


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
    scheduler_config = config.scheduler_config()
    plan = plan or plan_memory(config.memory_config(), profile)
    tp = config.tensor_parallel_size
    act = partial(_activation, config.model, tp, profile)
    layout = plan_reserve(config.policy, plan.activation_reserve_bytes, plan.block_bytes,
                          config.vmm_handle_bytes, act(1, 1))
    pool = BlockPool(plan.num_kv_blocks, layout.num_elastic_blocks,
                     elastic_attached=config.policy is Policy.OVERCOMMIT)
    controller = ElasticController(config.policy, layout, act, vmm or config.vmm_cost(),
                                   config.drain, config.detach_behind_step)
    return EngineCore(config, plan, layout, Scheduler(scheduler_config, pool, controller))


def _activation(model: ModelSpec, tp: int, profile: ActivationProfile | None,
                num_tokens: int, num_rows: int) -> int:
    return activation_bytes(model, num_tokens, tp=tp, num_sample_rows=num_rows, profile=profile)
