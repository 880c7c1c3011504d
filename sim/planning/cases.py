"""Plain-data descriptions of one simulation: which trace, which engine, which rate.

A `Case` is small and picklable so that it, not a loaded trace, travels to worker
processes or Ray tasks; each worker rebuilds the trace from its `TraceSpec` (cached per
process) and the engine from the case's fields.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from sim.core.catalog import MIB, get_gpu, get_model
from sim.core.config_flags import setting_default
from sim.core.cost_model import Efficiency, piecewise_sizes_for
from sim.core.elastic import DrainStrategy, Policy, VmmCosts
from sim.core.engine_checks import SettingRangeError
from sim.core.engine_config import EngineConfig
from sim.core.memory_plan import DEFAULT_MAX_MODEL_LEN, ActivationProfile
from sim.recording.metrics import Slo
from sim.runner import RunSpec
from traces import LengthDist, Trace, load_trace, synthetic
from traces.lengths import FixedLength, LognormalLength, UniformLength
from traces.loader import cut_trace


@dataclass(frozen=True)
class SyntheticSpec:
    """Arguments of `traces.synthetic`, kept as data."""

    num_requests: int
    rate_per_s: float
    prompt: LengthDist
    output: LengthDist
    arrival: str = "poisson"
    cv: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class TraceSpec:
    """Either a trace file / bundled name with loading options, or a synthetic trace;
    `request_range` then keeps requests [first, last) of it (a searched stretch,
    `sim.planning.stretch`), arrival times unchanged."""

    source: str | None = None
    format: str | None = None
    window_s: tuple[float, float] | None = None
    limit: int | None = None
    sort: bool = False
    synthetic: SyntheticSpec | None = None
    request_range: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if (self.source is None) == (self.synthetic is None):
            raise ValueError("a trace spec needs exactly one of a file/bundled name or synthetic")
        if self.request_range is not None and not 0 <= self.request_range[0] < self.request_range[1]:
            raise ValueError(f"a request range needs 0 <= first < last, got {self.request_range}")

    @property
    def label(self) -> str:
        kept = ("" if self.request_range is None
                else f" requests {self.request_range[0]:,}-{self.request_range[1] - 1:,}")
        if self.synthetic is None:
            window = "" if self.window_s is None else f"[{self.window_s[0]:g}:{self.window_s[1]:g}]"
            return f"{self.source}{window}{kept}"
        s = self.synthetic
        return (f"synthetic:{s.arrival},n={s.num_requests},rate={s.rate_per_s:g}/s,"
                f"seed={s.seed}{kept}")

    @property
    def prompt_label(self) -> str:
        return "" if self.synthetic is None else length_label(self.synthetic.prompt)


@functools.lru_cache(maxsize=8)
def build_trace(spec: TraceSpec) -> Trace:
    """The trace a spec names (cached per process: a sweep reuses it across cases)."""
    if spec.request_range is not None:
        whole = build_trace(replace(spec, request_range=None))
        first, last = spec.request_range
        if last > len(whole):
            raise ValueError(f"request range {first}-{last - 1} runs past the trace's "
                             f"{len(whole)} requests")
        return whole.select(np.arange(first, last))
    if spec.synthetic is not None:
        s = spec.synthetic
        return cut_trace(synthetic(s.num_requests, s.rate_per_s, arrival=s.arrival, cv=s.cv,
                                   prompt=s.prompt, output=s.output, seed=s.seed),
                         window_s=spec.window_s, limit=spec.limit)
    assert spec.source is not None
    return load_trace(spec.source, spec.format, sort=spec.sort, window_s=spec.window_s,
                      limit=spec.limit)


@dataclass(frozen=True)
class TraceLength:
    """The max_model_len a plan runs its trace at, and the trace's requests longer than it.

    vLLM rejects a request longer than max_model_len, and refuses a max_model_len past the
    model's context unless told otherwise (EngineConfig.allow_long_max_model_len); a plan
    follows both, so a trace's longest requests may be rejected, and the plan says how many.
    """

    max_model_len: int | None  # None: EngineConfig's default (the model's context)
    limit_tokens: int  # the length requests are held to: max_model_len, resolved
    context_tokens: int  # the model's context (max_position_embeddings)
    stopped_at_context: bool  # the longest request is past the context, and no opt-in
    num_requests: int
    num_too_long: int  # requests longer than limit_tokens: rejected

    def note(self) -> str | None:
        """One line on the rejected requests (None: every request is run)."""
        if not self.num_too_long:
            return None
        if self.stopped_at_context:
            why = (f"the model's context ({self.context_tokens:,} tokens, its max_position_"
                   "embeddings), where max_model_len stops as vLLM's does "
                   "(--allow-long-max-model-len runs them)")
        else:
            why = f"max_model_len ({self.limit_tokens:,} tokens)"
        return (f"{self.num_too_long:,} of the trace's {self.num_requests:,} requests are "
                f"longer than {why}: they are rejected, as vLLM rejects them")


def trace_length(spec: TraceSpec, options: EngineOptions, model: str) -> TraceLength:
    """The user's max_model_len, else vLLM's default raised to the trace's longest request
    but no further than the model's context (past it only with allow_long_max_model_len);
    and how many requests are longer than that."""
    context = get_model(model).max_position_embeddings
    trace = build_trace(spec)
    lengths = trace.prompt_tokens + trace.output_tokens
    longest = int(lengths.max()) if len(trace) else 0
    chosen = options.max_model_len
    stopped = (chosen is None and longest > context
               and not options.allow_long_max_model_len)
    if chosen is None and longest > min(DEFAULT_MAX_MODEL_LEN, context):
        chosen = min(longest, context) if stopped else longest
    limit = context if chosen is None else chosen
    return TraceLength(chosen, limit, context, stopped, len(trace),
                       int((lengths > limit).sum()))


def parse_length(data: dict | int) -> LengthDist:
    """A length distribution from YAML: 1024, {kind: fixed, value: 1024},
    {kind: uniform, low: 64, high: 512} or {kind: lognormal, median: 1000, sigma: 1.0}."""
    if isinstance(data, int):
        return LengthDist.fixed(data)
    if not isinstance(data, dict) or "kind" not in data:
        raise ValueError(f"a length distribution is an integer or a mapping with 'kind', got {data!r}")
    args = {k: v for k, v in data.items() if k != "kind"}
    kind = data["kind"]
    makers: dict[str, Callable[..., LengthDist]] = {"fixed": LengthDist.fixed, "uniform": LengthDist.uniform,
              "lognormal": LengthDist.lognormal}
    if kind not in makers:
        raise ValueError(f"length kind must be one of {sorted(makers)}, got {kind!r}")
    try:
        return makers[kind](**args)
    except TypeError as exc:
        raise ValueError(f"bad arguments for a {kind} length: {args!r} ({exc})") from None


def length_label(dist: LengthDist) -> str:
    if isinstance(dist, FixedLength):
        return f"fixed({dist.value})"
    if isinstance(dist, UniformLength):
        return f"uniform({dist.low},{dist.high})"
    if isinstance(dist, LognormalLength):
        return f"lognormal(median={dist.median:g},sigma={dist.sigma:g})"
    return dist.kind


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings a sweep holds fixed (vLLM names; None means vLLM's default). Their
    defaults are EngineConfig's, read from it: a sweep, a plan and a single run agree."""

    max_num_seqs: int | None = None
    gpu_memory_utilization: float = setting_default("gpu_memory_utilization")
    max_model_len: int | None = None
    allow_long_max_model_len: bool = setting_default("allow_long_max_model_len")
    block_size: int = setting_default("block_size")
    drain: str = setting_default("drain").value
    vmm_handle_mib: int = setting_default("vmm_handle_bytes") // MIB
    reclaim: str = setting_default("reclaim")
    detach_behind_step: bool = setting_default("detach_behind_step")
    enable_prefix_caching: bool = setting_default("enable_prefix_caching")
    cuda_graph_sizes: tuple[int, ...] = ()  # EngineConfig.cuda_graph_sizes
    piecewise_graphs: bool = False  # EngineConfig.piecewise_graph_sizes, at the case's chunk
    piecewise_max_tokens: int | None = None  # ... or up to this cap (sim.core.cost_model.piecewise_sizes_for)
    attention_backend: str = setting_default("attention_backend")
    async_scheduling: bool = setting_default("async_scheduling")
    mixed_split_mib: int = setting_default("mixed_split_bytes") // MIB

    def engine(self, model: str, gpu: str, tp: int, chunk: int | None,
               policy: str = Policy.STATIC.value) -> EngineConfig:
        """The engine config of these options at one grid point; raises ValueError for unknown
        names or invalid shapes (SettingRangeError for a value out of any engine's range).
        Piecewise graphs are captured at the engine's chunk, vLLM's default where none is
        given."""
        config = EngineConfig(
            model=get_model(model), gpu=get_gpu(gpu), tensor_parallel_size=tp,
            max_num_batched_tokens=chunk, max_num_seqs=self.max_num_seqs,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len,
            allow_long_max_model_len=self.allow_long_max_model_len,
            block_size=self.block_size, policy=Policy.parse(policy),
            drain=DrainStrategy.parse(self.drain), vmm_handle_bytes=self.vmm_handle_mib * MIB,
            reclaim=self.reclaim, detach_behind_step=self.detach_behind_step,
            enable_prefix_caching=self.enable_prefix_caching,
            cuda_graph_sizes=self.cuda_graph_sizes, attention_backend=self.attention_backend,
            async_scheduling=self.async_scheduling, mixed_split_bytes=self.mixed_split_mib * MIB,
        )
        if not self.piecewise_graphs:
            return config
        return replace(config, piecewise_graph_sizes=piecewise_sizes_for(
            config.chunk_tokens, self.piecewise_max_tokens))


def check_settings(options: EngineOptions,
                   points: Iterable[tuple[str, str, int, int | None]]) -> None:
    """Build the engine config of `options` at each distinct (model, GPU, TP, chunk) point, so
    that a value out of any engine's range (SettingRangeError, which names its setting) stops
    a sweep or plan before its first case. Any other refusal (a max_model_len past one
    model's context, a chunk below max_num_seqs) is left to that case's row: the engine's
    range checks come first, so a point refused so holds no value out of range."""
    for model, gpu, tp, chunk in dict.fromkeys(points):
        try:
            options.engine(model, gpu, tp, chunk)
        except SettingRangeError:
            raise
        except ValueError:
            continue


@dataclass(frozen=True)
class Case:
    """One point of a grid: engine axes, the rate scale and the trace."""

    model: str
    gpu: str
    tp: int
    chunk: int | None  # None: vLLM's default for the GPU (EngineConfig.chunk_tokens)
    policy: str
    trace: TraceSpec
    rate_scale: float = 1.0
    options: EngineOptions = field(default_factory=EngineOptions)
    slo: Slo = field(default_factory=Slo)
    num_replicas: int = 1
    router: str = "round-robin"  # how the fleet spreads requests (sim.fleet.Fleet)
    efficiency: Efficiency | None = None
    profile: ActivationProfile | None = None
    vmm_costs: VmmCosts | None = None  # a calibration's measured elastic transition costs

    def engine(self) -> EngineConfig:
        """The engine config (EngineOptions.engine at the case's grid point)."""
        return self.options.engine(self.model, self.gpu, self.tp, self.chunk, self.policy)

    def run_spec(self) -> RunSpec:
        return RunSpec(self.engine(), self.num_replicas, self.router, efficiency=self.efficiency,
                       profile=self.profile, slo=self.slo, vmm_costs=self.vmm_costs)

    def scaled_trace(self) -> Trace:
        return build_trace(self.trace).scaled(self.rate_scale)

    def input_fields(self) -> dict:
        """The case's inputs as table columns (the same whether or not it fits)."""
        o = self.options
        return {
            "model": self.model, "gpu": self.gpu, "tensor_parallel_size": self.tp,
            "chunk": self.chunk, "policy": self.policy, "rate_scale": self.rate_scale,
            "trace": self.trace.label, "prompt": self.trace.prompt_label,
            "max_num_seqs": o.max_num_seqs, "gpu_memory_utilization": o.gpu_memory_utilization,
            "max_model_len": o.max_model_len,
            "allow_long_max_model_len": o.allow_long_max_model_len, "block_size": o.block_size, "drain": o.drain,
            "vmm_handle_mib": o.vmm_handle_mib, "reclaim": o.reclaim,
            "detach_behind_step": o.detach_behind_step,
            "enable_prefix_caching": o.enable_prefix_caching,
            "cuda_graph_sizes": ",".join(map(str, o.cuda_graph_sizes)) or "none",
            "piecewise_graphs": o.piecewise_graphs,
            "piecewise_max_tokens": ("none" if o.piecewise_max_tokens is None
                                     else o.piecewise_max_tokens),
            "attention_backend": o.attention_backend, "async_scheduling": o.async_scheduling,
            "mixed_split_mib": o.mixed_split_mib, "num_replicas": self.num_replicas, "router": self.router,
            "slo_ttft_s": self.slo.ttft_s, "slo_tpot_s": self.slo.tpot_s,
        }
