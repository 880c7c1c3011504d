"""engine_bench's timed cases on the GPU: each step as the engine runs it (host arrays ->
device -> forward -> ids on host), the decode step and the 16k prefill with their rooflines,
the chunk-size curves per attention backend, the attention alone, the new-shape steps, SPLIT's
plans, the activation-memory profile and the fusion A/B.

benchmarks/engine_bench.py puts the repository root on sys.path before importing this module.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass

import torch

from gpu_backend.engine.calibrate_timing import backend_launch_ms
from gpu_backend.engine.kv_store import PlainKVStore
from gpu_backend.engine.memory import (
    dummy_store,
    fit_envelope,
    kv_caches_of,
    measure_activation_peak,
)
from gpu_backend.engine.runner import DecodeGraphs, ModelRunner
from gpu_backend.engine.setup import load_model
from gpu_backend.engine.shapes import decode_shape, host_batch, prefill_shape, prompt_shapes
from gpu_backend.env import ClockSampler, copy_bandwidth_bytes_s
from gpu_backend.kernels.split_attention import warm_plans
from gpu_backend.model import set_attention_backend, set_fused
from sim.core.catalog import ModelSpec, get_gpu
from sim.core.elastic import MIB
from sim.core.engine_config import EngineConfig
from sim.core.split_shapes import SplitShapes

DECODE_BATCH, DECODE_CONTEXT = 64, 1024
DECODE_RUN = 20  # decode steps launched ahead in a row, per timing
NEW_SHAPES = ((3001, 9000), (3013, 9013), (1777, 0))  # (chunk, prefix) no other step runs
PROFILE_TOKENS = (2048, 4096, 8192, 16384)
DECODE_TARGET_RATIO = 1.2  # the decode step within this multiple of its memory roofline
PREFILL_TARGET_FRACTION = 0.75  # the 16k prefill at this share of the matmul rate or more


def timed(fn, repeat: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_flops_s() -> float:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    seconds = timed(lambda: a @ b, repeat=20, warmup=5)
    return 2 * 8192**3 / seconds


@dataclass(frozen=True)
class Engine:
    """The model on the GPU over dummy KV caches, its decode graphs and runner, and the rates
    the rooflines divide by (measured before the model loads)."""
    spec: ModelSpec
    config: EngineConfig
    bs: int
    max_len: int
    num_blocks: int
    model: torch.nn.Module
    store: PlainKVStore
    caches: list[tuple[torch.Tensor, torch.Tensor]]
    graphs: DecodeGraphs
    runner: ModelRunner
    weights_bytes: int
    bandwidth: float
    matmul_peak: float


def build_engine(spec: ModelSpec, gpu: str, bs: int, longest_prompt: int, backend: str,
                 mixed_split_mib: int | None) -> Engine:
    """The copy bandwidth and matmul rate, then the model with its caches of every block a
    stage uses and the decode graph of DECODE_BATCH rows captured (`mixed_split_mib`: the
    engine's mixed split; None: its default)."""
    max_len = min(longest_prompt + bs, spec.max_position_embeddings)
    split = ({} if mixed_split_mib is None
             else {"mixed_split_bytes": mixed_split_mib * MIB})
    config = EngineConfig(spec, get_gpu(gpu), max_model_len=max_len, block_size=bs, **split)
    bandwidth, matmul_peak = copy_bandwidth_bytes_s(), matmul_flops_s()
    allocated = torch.cuda.memory_allocated()
    model = load_model(config, torch.device("cuda"), seed=0, backend=backend)
    weights_bytes = torch.cuda.memory_allocated() - allocated
    num_blocks = 1 + longest_prompt // bs + DECODE_BATCH * (DECODE_CONTEXT // bs + 1)
    store = dummy_store(spec, num_blocks, bs, torch.device("cuda"))
    caches = kv_caches_of(store, spec.num_layers)
    graphs = DecodeGraphs(model, caches, DECODE_BATCH, max_len, bs, torch.device("cuda"),
                          (DECODE_BATCH,))
    graphs.capture()
    runner = ModelRunner(model, caches, torch.device("cuda"), graphs)
    return Engine(spec=spec, config=config, bs=bs, max_len=max_len, num_blocks=num_blocks,
                  model=model, store=store, caches=caches, graphs=graphs, runner=runner,
                  weights_bytes=weights_bytes, bandwidth=bandwidth, matmul_peak=matmul_peak)


def run_steps(runner, batches, ahead: bool) -> None:
    """Run the steps in order: each executed (launched and collected) in turn, or, `ahead`,
    each launched before the one before it is collected (async scheduling)."""
    if not ahead:
        for batch in batches:
            runner.execute(batch)
        return
    before = None
    for batch in batches:
        step = runner.launch(batch)
        if before is not None:
            before.collect()
        before = step
    if before is not None:
        before.collect()


def bench_decode(runner, spec, num_blocks, bs, weights_bytes, bandwidth,
                 ahead: bool = False) -> dict:
    batch = host_batch(decode_shape(DECODE_BATCH, DECODE_CONTEXT), bs, num_blocks)
    if ahead:  # the mean step of a run launched ahead
        seconds = timed(lambda: run_steps(runner, [batch] * DECODE_RUN, True), repeat=5,
                        warmup=1) / DECODE_RUN
    else:
        seconds = timed(lambda: runner.execute(batch), repeat=20, warmup=3)
    kv_bytes = DECODE_BATCH * DECODE_CONTEXT * spec.kv_bytes_per_token()
    roofline = (weights_bytes + kv_bytes) / bandwidth
    return {"batch": DECODE_BATCH, "context": DECODE_CONTEXT, "measured_s": seconds,
            "roofline_s": roofline, "ratio_to_roofline": seconds / roofline,
            "target_ratio_max": DECODE_TARGET_RATIO, "graph": True,
            "launched_ahead": ahead}


def bench_prefill(runner, spec, num_blocks, bs, matmul_peak, tokens: int) -> dict:
    batch = host_batch(prefill_shape(tokens), bs, num_blocks)
    seconds = timed(lambda: runner.execute(batch), repeat=3, warmup=1)
    lm_head = 2.0 * spec.hidden_size * spec.vocab_size  # one sampled row, not every token
    linear = (spec.linear_flops_per_token() - lm_head) * tokens + lm_head
    attention = 4.0 * tokens * (tokens / 2) * spec.num_attention_heads * spec.head_dim \
        * spec.num_layers
    achieved = (linear + attention) / seconds
    return {"tokens": tokens, "measured_s": seconds, "flops": linear + attention,
            "achieved_flops_s": achieved, "matmul_flops_s": matmul_peak,
            "fraction_of_matmul": achieved / matmul_peak,
            "target_fraction_min": PREFILL_TARGET_FRACTION}


def prompt_batches(bs, num_blocks, prompt: int, chunk: int, num_decodes: int) -> list:
    """The host batches of a prompt prefilled chunk by chunk, each step beside `num_decodes`
    decodes of DECODE_CONTEXT keys."""
    return [host_batch(shape, bs, num_blocks)
            for shape in prompt_shapes(prompt, chunk, num_decodes, DECODE_CONTEXT)]


def ttft(runner, bs, num_blocks, prompt: int, chunk: int, num_decodes: int,
         ahead: bool = False) -> float:
    """Sum of the step times of a prompt prefilled chunk by chunk (+ decodes in each step);
    `ahead`: each step launched before the one before it is collected."""
    batches = prompt_batches(bs, num_blocks, prompt, chunk, num_decodes)
    return timed(lambda: run_steps(runner, batches, ahead), repeat=2, warmup=1)


def bench_chunks(runner, bs, num_blocks, prompts, chunks, model,
                 backends: tuple[str, ...], ahead: bool = False) -> dict[str, list[dict]]:
    """The chunk-size curve of each attention backend; at every point each backend in turn."""
    rows: dict[str, list[dict]] = {backend: [] for backend in backends}
    for prompt in prompts:
        for num_decodes in (0, DECODE_BATCH):
            base: dict[str, float] = {}
            for chunk in chunks:
                for backend in backends:
                    set_attention_backend(model, backend)
                    with ClockSampler() as clocks:
                        seconds = ttft(runner, bs, num_blocks, prompt, chunk, num_decodes, ahead)
                    base.setdefault(backend, seconds)
                    rows[backend].append({"prompt": prompt, "chunk": chunk,
                                          "num_decodes": num_decodes, "ttft_s": seconds,
                                          "ratio_to_first_chunk": seconds / base[backend],
                                          **clocks.summary()})
    set_attention_backend(model, backends[0])
    return rows


def bench_attention_chunks(spec, prompts, chunks, backends: tuple[str, ...],
                           reps: int = 10) -> dict[str, list[dict]]:
    """Per backend, one layer's attention alone (device ms) summed over each chunk-size
    point's steps, the prompt alone (no decodes), every backend in turn at every point."""
    rows: dict[str, list[dict]] = {backend: [] for backend in backends}
    for prompt in prompts:
        for chunk in chunks:
            shapes = prompt_shapes(prompt, chunk)
            for backend in backends:
                layer_ms = sum(backend_launch_ms(shape, backend, spec.num_attention_heads,
                                                 spec.num_kv_heads, spec.head_dim, reps)
                               for shape in shapes)
                rows[backend].append({"prompt": prompt, "chunk": chunk, "num_decodes": 0,
                                      "layer_ms": layer_ms,
                                      "all_layers_s": 1e-3 * layer_ms * spec.num_layers})
    return rows


def add_curves(res: dict, key: str, curves: dict[str, list[dict]]) -> None:
    """The first backend's curve under `key`, each other's under `key`_<backend>."""
    for i, (backend, rows) in enumerate(curves.items()):
        res[key if i == 0 else f"{key}_{backend}"] = rows


def bench_new_shapes(runner, bs, num_blocks) -> list[dict]:
    """Prefill steps of lengths nothing ran before: the first run's time and the median of
    runs again (the difference is what a new shape costs the host once)."""
    rows = []
    for chunk, prefix in NEW_SHAPES:
        batch = host_batch(prefill_shape(chunk, prefix), bs, num_blocks)
        torch.cuda.synchronize()
        start = time.perf_counter()
        runner.execute(batch)
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        rows.append({"chunk": chunk, "prefix": prefix, "first_s": first,
                     "again_s": timed(lambda b=batch: runner.execute(b), repeat=3, warmup=0)})
    return rows


def warm_split(model, spec, max_chunk: int, max_len: int) -> dict:
    """cuDNN's plans of every shape SPLIT pads to for chunks up to max_chunk tokens, built
    once before any step (as the engine's setup does): their count and seconds."""
    shapes = SplitShapes().sdpa_shapes(max_chunk, max_len)
    torch.cuda.synchronize()
    start = time.perf_counter()
    warm_plans(shapes, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim,
               next(model.parameters()).dtype, torch.device("cuda"))
    torch.cuda.synchronize()
    return {"shapes": len(shapes), "seconds": time.perf_counter() - start}


def bench_profile(model, config: EngineConfig) -> dict:
    """The memory profile's activation peaks (gpu_backend.engine.memory) and their line."""
    max_len = config.memory_config().effective_max_model_len
    peaks = {n: measure_activation_peak(model, config.model, n, config.num_seqs,
                                        config.block_size, torch.device("cuda"), max_len)
             for n in PROFILE_TOKENS}
    slope, fixed = fit_envelope(peaks)
    return {"peaks_bytes": {str(n): v for n, v in peaks.items()},
            "bytes_per_token": slope, "fixed_bytes": fixed}


def bench_backends(model, runner, config: EngineConfig, num_blocks, matmul_peak,
                   backends: tuple[str, ...]) -> dict:
    """Per backend: the 16k prefill, the new-shape steps and the memory profile."""
    res: dict = {"new_shape_steps": {}, "activation_profile": {}}
    for backend in backends:
        set_attention_backend(model, backend)
        key = "prefill" if backend == backends[0] else f"prefill_{backend}"
        res[key] = bench_prefill(runner, config.model, num_blocks, config.block_size,
                                 matmul_peak, 16384)
        res["new_shape_steps"][backend] = bench_new_shapes(runner, config.block_size,
                                                           num_blocks)
        res["activation_profile"][backend] = bench_profile(model, config)
    set_attention_backend(model, backends[0])
    return res


def bench_fusion(model, caches, spec, bs, num_blocks, max_len) -> dict:
    """Decode (CUDA graph) and a 512-token chunk step (eager), fused kernels vs torch layers."""
    cuda = torch.device("cuda")
    decode = host_batch(decode_shape(DECODE_BATCH, DECODE_CONTEXT), bs, num_blocks)
    chunk = host_batch(prefill_shape(512, 8192), bs, num_blocks)
    res: dict = {}
    for fused in (False, True):  # ends with the fused kernels on, as the engine runs
        set_fused(model, fused)
        graphs = DecodeGraphs(model, caches, DECODE_BATCH, max_len, bs, cuda, (DECODE_BATCH,))
        graphs.capture()
        runner = ModelRunner(model, caches, cuda, graphs)
        res["fused" if fused else "unfused"] = {
            "decode_s": timed(functools.partial(runner.execute, decode), repeat=20, warmup=3),
            "chunk512_prefix8192_s": timed(functools.partial(runner.execute, chunk), repeat=5,
                                           warmup=2)}
        graphs.release()
    for key in ("decode_s", "chunk512_prefix8192_s"):
        res[f"{key.removesuffix('_s')}_speedup"] = res["unfused"][key] / res["fused"][key]
    return res
