"""Engine step times on one CUDA GPU, each printed next to its roofline.

Run from the repository root on the GPU machine (under ~3 minutes for Llama-3.1-8B)::

    python benchmarks/engine_bench.py [--model llama-3.1-8b] [--out PATH] [--quick]

1. decode step, batch 64, context 1,024 (CUDA graph): against the memory roofline, weights +
   KV bytes over the bandwidth of a large device-to-device copy (target: within 1.2x);
2. a 16,384-token prefill at chunk 16,384: achieved FLOP/s against a large torch.matmul's
   bf16 throughput (target: >= 75%);
3. the chunk-size curve: TTFT of a 16k and a 32k prompt prefilled at chunks 512 .. 16,384,
   alone and with 64 concurrent decodes in every step (the published study finds it flat
   within ~1%; an attention kernel with a chunking penalty would show a slope here), and
   each point's excess chunk penalty (`chunk_penalty`): the TTFT chunking adds against the
   prompt in one step, less the work the decode rows carry in the extra steps priced at the
   roofline (their KV read over the copy bandwidth, their tokens' matmuls at the matmul
   rate), over the one-step TTFT (target at chunk 2,048: <= 2%, alone and beside decodes).
   Each point also records the SM clock and board power while it ran, sampled by NVML every
   5 ms (`gpu_backend.env.ClockSampler`; mean and lowest clock, mean power, the shares of
   samples held back by the power cap and by heat), where nvidia-ml-py is installed.
4. fusion A/B: the decode step and one 512-token chunk step (8k prefix) with the fused
   Triton layer kernels and with the torch norm / rotary / activation they replace.
5. with `--piecewise-max-tokens N`: the chunk-size curve again with piecewise CUDA graphs up
   to N tokens (vLLM's default cap is 512) and steps beyond fully eager, as an engine run
   with `--piecewise-graphs --piecewise-max-tokens N` takes them.
6. with `--attention-backend triton split auto flashinfer`: the prefill and the chunk-size
   curves (3, 5) on each attention backend over the same weights, the backends taking turns
   at every point; the first backend's keep the names above, the others' carry the backend's name
   (`chunk_curve_split`, ...). Per backend also: prefill steps of chunk lengths never run
   before, timed on their first run and again (cuDNN builds an execution plan for each new
   shape: with split or auto every shape SPLIT pads to, up to the longest chunk timed, is
   built first, as the engine does at start-up, and `split_plan_warmup` records its count
   and seconds), and the activation-memory profile's peaks at 2k..16k tokens with their
   fitted line.
7. with `--async-scheduling`: the decode step and the chunk-size curves (3, 5) also timed as
   the engine runs them under async scheduling, each step launched before the one before it
   is collected (`ModelRunner.launch`), so the host's work between steps overlaps the
   device's; under `decode_async`, `chunk_curve_async`, ... (and their chunk penalties).
8. with `--mixed-split-mib N`: the engine's mixed split at N MiB (0: every mixed step one
   launch); by default the engine's, under which the 64 decodes of 1k run apart from the
   chunks. The result records the threshold in keys (`mixed_split_min_keys`).
9. the attention alone (`attention_chunks`): one layer's attention of every step of each
   chunk-size point without decodes, device time summed over the prompt's steps, per backend
   (the profile's `backend_launch_ms`), and its part of the chunk penalty
   (`attention_penalty`): the attention chunking adds over all layers, as a share of the
   one-step TTFT, beside the whole step's penalty.
Steps are timed as the engine times them: host arrays -> device -> forward -> ids on host.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from gpu_backend.engine.calibrate import backend_launch_ms  # noqa: E402
from gpu_backend.engine.memory import (  # noqa: E402
    dummy_store,
    fit_envelope,
    kv_caches_of,
    measure_activation_peak,
)
from gpu_backend.engine.piecewise import PiecewiseGraphs  # noqa: E402
from gpu_backend.engine.runner import DecodeGraphs, ModelRunner  # noqa: E402
from gpu_backend.engine.setup import load_model  # noqa: E402
from gpu_backend.engine.shapes import (  # noqa: E402
    decode_shape,
    host_batch,
    prefill_shape,
    prompt_shapes,
)
from gpu_backend.env import (  # noqa: E402
    ClockSampler,
    copy_bandwidth_bytes_s,
    device_environment,
    write_result,
)
from gpu_backend.kernels.split_attention import SplitShapes, warm_plans  # noqa: E402
from gpu_backend.layers import SPLIT_BACKENDS  # noqa: E402
from gpu_backend.model import set_attention_backend, set_fused  # noqa: E402
from sim.core.catalog import get_gpu, get_model  # noqa: E402
from sim.core.elastic import MIB  # noqa: E402
from sim.core.engine_config import EngineConfig  # noqa: E402

CHUNKS = (512, 1024, 2048, 4096, 8192, 16384)
PROMPTS = (16384, 32768)
DECODE_BATCH, DECODE_CONTEXT = 64, 1024
# the attention backends a model can switch between
BACKENDS = ("triton", "split", "auto", "flashinfer")
NEW_SHAPES = ((3001, 9000), (3013, 9013), (1777, 0))  # (chunk, prefix) no other step runs
PROFILE_TOKENS = (2048, 4096, 8192, 16384)
DECODE_TARGET_RATIO = 1.2  # the decode step within this multiple of its memory roofline
PREFILL_TARGET_FRACTION = 0.75  # the 16k prefill at this share of the matmul rate or more
PENALTY_CHUNK, PENALTY_TARGET = 2048, 0.02  # the excess chunk penalty at this chunk, at most


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


DECODE_RUN = 20  # decode steps launched ahead in a row, per timing


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


def one_step(rows: list[dict], r: dict) -> dict | None:
    """The point of `rows` that runs r's prompt (beside as many decodes) in one step: the
    smallest chunk timed that holds the whole prompt; None for such a point itself, or where
    none was timed."""
    whole = [b for b in rows if b["prompt"] == r["prompt"]
             and b["num_decodes"] == r["num_decodes"] and b["chunk"] >= r["prompt"]]
    if not whole or r["chunk"] >= r["prompt"]:
        return None
    return min(whole, key=lambda b: b["chunk"])


def chunk_penalties(rows: list[dict], spec, bandwidth: float, matmul_peak: float) -> list[dict]:
    """Each chunk-size point against its prompt run in one step (the smallest chunk timed that
    holds the whole prompt): the TTFT chunking adds, the decode rows' own work in the extra
    steps at the roofline (per step: their KV read over `bandwidth`, their tokens' matmuls at
    `matmul_peak`), and the excess left, each as a share of the one-step TTFT."""
    per_decode_s = (DECODE_CONTEXT * spec.kv_bytes_per_token() / bandwidth
                    + spec.linear_flops_per_token() / matmul_peak)
    out = []
    for r in rows:
        base = one_step(rows, r)
        if base is None:
            continue
        extra_steps = -(-r["prompt"] // r["chunk"]) - 1
        decode_s = extra_steps * r["num_decodes"] * per_decode_s
        added = r["ttft_s"] - base["ttft_s"]
        excess = (added - decode_s) / base["ttft_s"]
        out.append({"prompt": r["prompt"], "chunk": r["chunk"], "num_decodes": r["num_decodes"],
                    "penalty": added / base["ttft_s"], "decode_work": decode_s / base["ttft_s"],
                    "excess": excess, "target_max": PENALTY_TARGET if r["chunk"] == PENALTY_CHUNK
                    else None})
    return out


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


def attention_penalties(attention: list[dict], curve: list[dict]) -> list[dict]:
    """Each chunk-size point's attention against its prompt's one-step attention (the smallest
    chunk timed that holds the whole prompt): the time chunking adds to the attention of all
    layers, as a share of the one-step TTFT of `curve` (the same backend's chunk-size curve),
    beside the whole step's penalty there."""
    ttft = {(r["prompt"], r["chunk"], r["num_decodes"]): r["ttft_s"] for r in curve}
    out = []
    for r in attention:
        base = one_step(attention, r)
        if base is None:
            continue
        whole_s = ttft[(base["prompt"], base["chunk"], 0)]
        out.append({"prompt": r["prompt"], "chunk": r["chunk"],
                    "attention_added": (r["all_layers_s"] - base["all_layers_s"]) / whole_s,
                    "penalty": ttft[(r["prompt"], r["chunk"], 0)] / whole_s - 1})
    return out


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


def print_curve(rows: list[dict], first: str, others: dict[str, list[dict]]) -> None:
    """The first backend's curve; each other backend's TTFT and its ratio to the first's."""
    names = "".join(f" {name + ' ms':>11} {'x ' + first:>8}" for name in others)
    print(f"{'prompt':>7} {'decodes':>7} {'chunk':>6} {'TTFT ms':>9} {'vs first':>8}{names}")
    for i, r in enumerate(rows):
        tail = "".join(f" {o[i]['ttft_s'] * 1e3:>11.1f} {o[i]['ttft_s'] / r['ttft_s']:>8.3f}"
                       for o in others.values())
        clock = (f"  {r['sm_clock_mhz']:.0f} MHz {r['power_w']:.0f} W"
                 f" capped {r['power_capped_share']:.0%}" if "sm_clock_mhz" in r else
                 "  clocks not sampled" if "clocks_not_sampled" in r else "")
        print(f"{r['prompt']:>7} {r['num_decodes']:>7} {r['chunk']:>6} "
              f"{r['ttft_s'] * 1e3:>9.1f} {r['ratio_to_first_chunk']:>8.3f}{tail}{clock}")


def print_backends(res: dict) -> None:
    for name in res["attention_backends"][1:]:
        p = res[f"prefill_{name}"]
        print(f"prefill {p['tokens']} tokens, attention {name}: {p['measured_s'] * 1e3:.1f} ms, "
              f"{p['achieved_flops_s'] / 1e12:.0f} TFLOP/s")
    for name, rows in res["new_shape_steps"].items():
        steps = ", ".join(f"{r['chunk']}@{r['prefix']} {r['first_s'] * 1e3:.1f} -> "
                          f"{r['again_s'] * 1e3:.1f}" for r in rows)
        print(f"new shapes, attention {name} (first run -> again, ms): {steps}")
    if "split_plan_warmup" in res:
        w = res["split_plan_warmup"]
        print(f"SPLIT plans built up front: {w['shapes']} shapes in {w['seconds']:.1f} s")
    for name, prof in res["activation_profile"].items():
        print(f"activation profile, attention {name}: {prof['bytes_per_token']:.0f} B/token + "
              f"{prof['fixed_bytes'] / 2**20:.1f} MiB")


def print_report(res: dict) -> None:
    d, p = res["decode"], res["prefill"]
    backends = res.get("attention_backends", ["triton"])
    print(f"GPU {res['env']['gpu']}, model {res['model']}, attention {', '.join(backends)}")
    print(f"copy bandwidth {res['copy_bandwidth_bytes_s'] / 1e9:.0f} GB/s, "
          f"matmul {res['matmul_flops_s'] / 1e12:.0f} TFLOP/s")
    print(f"decode b={d['batch']} ctx={d['context']}: {d['measured_s'] * 1e3:.3f} ms vs roofline "
          f"{d['roofline_s'] * 1e3:.3f} ms -> {d['ratio_to_roofline']:.2f}x (target <= "
          f"{d['target_ratio_max']}x)")
    print(f"prefill {p['tokens']} tokens: {p['measured_s'] * 1e3:.1f} ms, "
          f"{p['achieved_flops_s'] / 1e12:.0f} TFLOP/s = {p['fraction_of_matmul']:.0%} of matmul "
          f"(target >= {p['target_fraction_min']:.0%})")
    if "decode_async" in res:
        a = res["decode_async"]
        print(f"decode launched ahead (async scheduling): {a['measured_s'] * 1e3:.3f} ms -> "
              f"{a['ratio_to_roofline']:.2f}x the roofline")
    if backends != ["triton"]:
        print_backends(res)
    for curve in ("chunk_curve", "chunk_curve_async", "chunk_curve_piecewise",
                  "chunk_curve_piecewise_async"):
        if curve not in res:
            continue
        if curve.startswith("chunk_curve_piecewise"):
            print(f"with piecewise graphs up to {res['piecewise_max_tokens']} tokens:")
        if curve.endswith("_async"):
            print("each step launched before the one before it is collected (async):")
        print_curve(res[curve], backends[0],
                    {name: res[f"{curve}_{name}"] for name in backends[1:]})
    for key in sorted(k for k in res if k.startswith("chunk_penalty")):
        print(f"{key}: TTFT added by chunking, less the decode rows' work at the roofline")
        for r in res[key]:
            target = ("" if r["target_max"] is None else
                      f"  (target <= {r['target_max']:.0%}: "
                      f"{'met' if r['excess'] <= r['target_max'] else 'missed'})")
            print(f"  prompt {r['prompt']:>6} decodes {r['num_decodes']:>3} chunk {r['chunk']:>6}: "
                  f"{r['penalty']:+.1%} - decodes {r['decode_work']:.1%} = excess "
                  f"{r['excess']:+.1%}{target}")
    for key in sorted(k for k in res if k.startswith("attention_penalty")):
        print(f"{key}: the attention alone, TTFT share chunking adds to it, beside the step's")
        for r in res[key]:
            print(f"  prompt {r['prompt']:>6} chunk {r['chunk']:>6}: attention "
                  f"{r['attention_added']:+.1%} of a whole step's {r['penalty']:+.1%}")
    f = res.get("fusion", {})
    for key, label in (("decode_s", "decode step"), ("chunk512_prefix8192_s", "512-token chunk")):
        if not f:
            break
        print(f"{label}: torch layers {f['unfused'][key] * 1e3:.2f} ms, fused "
              f"{f['fused'][key] * 1e3:.2f} ms ({f[key.removesuffix('_s') + '_speedup']:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="16k prompt, three chunk sizes")
    parser.add_argument("--chunks", default=None, metavar="N,N,...",
                        help="the chunk sizes of the chunk-size curve (default: 512 .. 16,384; "
                             "with --quick 512, 4,096, 16,384); the prompt's own length is "
                             "always timed, as the curve's reference")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--piecewise-max-tokens", type=int, default=None, metavar="N",
                        help="also time the chunk-size curve with piecewise graphs up to N tokens")
    parser.add_argument("--attention-backend", nargs="+", choices=BACKENDS, default=["triton"],
                        metavar="NAME",
                        help="attention backends to time, over the same weights (triton: the "
                             "Triton paged kernel; split: prefill rows through cuDNN's SDPA "
                             "over their own keys and gathered prefix, merged by log-sum-exp; "
                             "auto: split for prefill rows of at least 2,048 new tokens; "
                             "flashinfer: prefill rows through FlashInfer's paged prefill "
                             "over the cache in place, decode rows apart). "
                             "The first runs every section; each other one adds its prefill, "
                             "chunk-size curves, new-shape steps and memory profile "
                             "(default: triton)")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="also time the decode step and the chunk-size curves with each "
                             "step launched before the one before it is collected, as the "
                             "engine runs under async scheduling")
    parser.add_argument("--mixed-split-mib", type=int, default=None, metavar="MIB",
                        help="decode rows' KV per layer (MiB) from which a mixed step runs them "
                             "apart from its chunks, as the engine's flag of that name; 0: one "
                             "launch (default: the engine's, 128)")
    parser.add_argument("--blas", choices=("default", "cublaslt"), default="default",
                        help="torch's BLAS library for every matmul (torch.backends.cuda."
                             "preferred_blas_library), set before anything runs")
    args = parser.parse_args()
    backends = tuple(dict.fromkeys(args.attention_backend))
    # results named by what they measure: the default file holds the Triton backend's
    suffix = () if backends == ("triton",) else ("attention", *backends)
    if args.async_scheduling:
        suffix = (*suffix, "async")
    if args.blas != "default":
        suffix = (*suffix, args.blas)
    if args.mixed_split_mib is not None:
        suffix = (*suffix, f"mixed-split-{args.mixed_split_mib}mib")
    if not torch.cuda.is_available():
        sys.exit("engine_bench needs a CUDA GPU")
    if args.blas != "default":
        torch.backends.cuda.preferred_blas_library(args.blas)
    spec, bs = get_model(args.model), args.block_size
    context = spec.max_position_embeddings
    # prompts within the model's context only: EngineConfig refuses a longer max_model_len,
    # as vLLM does (Qwen2.5's context is exactly the 32k prompt)
    prompts = tuple(p for p in (PROMPTS[:1] if args.quick else PROMPTS) if p <= context)
    if not prompts:
        sys.exit(f"engine_bench: {spec.name}'s context ({context:,} tokens) is shorter than "
                 f"every prompt it times ({', '.join(f'{p:,}' for p in PROMPTS)})")
    chunks = (512, 4096, 16384) if args.quick else CHUNKS
    if args.chunks is not None:
        try:
            chunks = tuple(sorted({int(c) for c in args.chunks.split(",") if c.strip()}
                                  | {max(prompts)}))
        except ValueError:
            sys.exit(f"engine_bench: --chunks {args.chunks!r}: give chunk sizes as N,N,...")
        if chunks[0] < 1:
            sys.exit("engine_bench: --chunks: every chunk size must be at least 1")
    max_len = min(max(prompts) + bs, context)
    split = ({} if args.mixed_split_mib is None
             else {"mixed_split_bytes": args.mixed_split_mib * MIB})
    config = EngineConfig(spec, get_gpu(args.gpu), max_model_len=max_len, block_size=bs, **split)
    bandwidth, matmul_peak = copy_bandwidth_bytes_s(), matmul_flops_s()
    allocated = torch.cuda.memory_allocated()
    model = load_model(config, torch.device("cuda"), seed=0, backend=backends[0])
    weights_bytes = torch.cuda.memory_allocated() - allocated
    num_blocks = 1 + max(prompts) // bs + DECODE_BATCH * (DECODE_CONTEXT // bs + 1)
    store = dummy_store(spec, num_blocks, bs, torch.device("cuda"))
    caches = kv_caches_of(store, spec.num_layers)
    graphs = DecodeGraphs(model, caches, DECODE_BATCH, max_len, bs, torch.device("cuda"),
                          (DECODE_BATCH,))
    graphs.capture()
    runner = ModelRunner(model, caches, torch.device("cuda"), graphs)
    res = {"env": device_environment(), "model": spec.name, "attention_backends": list(backends),
           "blas": args.blas, "mixed_split_min_keys": config.mixed_split_min_keys,
           "cudnn_sdpa_avoid_recompile": os.environ.get("TORCH_CUDNN_SDPA_AVOID_RECOMPILE"),
           "copy_bandwidth_bytes_s": bandwidth, "matmul_flops_s": matmul_peak,
           "weights_bytes": weights_bytes,
           "decode": bench_decode(runner, spec, num_blocks, bs, weights_bytes, bandwidth)}
    if args.async_scheduling:
        res["decode_async"] = bench_decode(runner, spec, num_blocks, bs, weights_bytes,
                                           bandwidth, ahead=True)
    if set(backends) & set(SPLIT_BACKENDS):
        res["split_plan_warmup"] = warm_split(model, spec, max(chunks), max_len)
    if backends != ("triton",):
        res.update(bench_backends(model, runner, config, num_blocks, matmul_peak, backends))
    else:
        res["prefill"] = bench_prefill(runner, spec, num_blocks, bs, matmul_peak, 16384)
    add_curves(res, "chunk_curve",
               bench_chunks(runner, bs, num_blocks, prompts, chunks, model, backends))
    if args.async_scheduling:
        add_curves(res, "chunk_curve_async",
                   bench_chunks(runner, bs, num_blocks, prompts, chunks, model, backends, True))
    if args.piecewise_max_tokens is not None:
        pieces = PiecewiseGraphs(model, caches, args.piecewise_max_tokens, torch.device("cuda"))
        pieces.capture()
        piecewise = ModelRunner(model, caches, torch.device("cuda"), graphs, pieces)
        res["piecewise_max_tokens"] = args.piecewise_max_tokens
        add_curves(res, "chunk_curve_piecewise",
                   bench_chunks(piecewise, bs, num_blocks, prompts, chunks, model, backends))
        if args.async_scheduling:
            add_curves(res, "chunk_curve_piecewise_async",
                       bench_chunks(piecewise, bs, num_blocks, prompts, chunks, model, backends,
                                    True))
        pieces.release()
    graphs.release()
    for key in [k for k in res if k.startswith("chunk_curve")]:
        res[key.replace("chunk_curve", "chunk_penalty", 1)] = chunk_penalties(
            res[key], spec, bandwidth, matmul_peak)
    add_curves(res, "attention_chunks", bench_attention_chunks(spec, prompts, chunks, backends))
    curve = "chunk_curve_async" if args.async_scheduling else "chunk_curve"
    for i, backend in enumerate(backends):
        tail = "" if i == 0 else f"_{backend}"
        res[f"attention_penalty{tail}"] = attention_penalties(res[f"attention_chunks{tail}"],
                                                              res[f"{curve}{tail}"])
    names = (res["env"]["gpu"], spec.name, *suffix)
    print(f"wrote {write_result(res, args.out, 'engine', *names)}")
    res["fusion"] = bench_fusion(model, caches, spec, bs, num_blocks, max_len)  # last: A/B only
    print_report(res)
    print(f"wrote {write_result(res, args.out, 'engine', *names)}")


if __name__ == "__main__":
    main()
