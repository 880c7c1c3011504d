"""Where an engine step's device time goes, kernel by kernel (one CUDA GPU, ~2 minutes).

    python benchmarks/step_breakdown.py [--model llama-3.1-8b] [--attention-backend auto]
                                        [--out PATH]

Two questions behind the engine's targets, answered with torch's profiler (CUPTI kernel
records, CUDA-graph replays included):

1. The decode step (batch 64, context 1,024, CUDA graph) against its memory roofline: each
   kernel class's device time beside the bytes it must move (weights for the matmuls, the
   K/V for attention) over a large copy's bandwidth, so the excess over the roofline is
   split between the matmuls, attention and the small kernels.
2. The chunk penalty: a 16,384-token prompt prefilled at chunks 2,048, 8,192 and 16,384,
   alone and beside 64 decodes of 1,024 keys, as engine_bench times it (host batches ->
   device -> forward -> ids, one step after another). Per chunk size: the wall time, the
   device's busy time (union of kernel intervals), the idle time between and inside steps
   (the longest gaps with the kernels on either side, and the host's CUDA calls), and each
   kernel class's sum, so the TTFT added by chunking is split into attention, matmuls, small
   kernels and idle device.
3. Both again with every step launched before the first is collected
   (`ModelRunner.launch`): the host stages and launches a step while the last one runs, as
   an engine with vLLM's async scheduling does, so the idle time the host's work between
   and inside steps costs shows as the difference (`*_launched_ahead`).

Also: each decode matmul shape (M = 64) timed alone on the device (50 calls in one CUDA
graph) through torch's default BLAS and through cuBLASLt, against the weights' bytes over the
copy bandwidth.

Writes JSON (benchmarks/results/step_breakdown_<gpu>_<model>_<backend>.json by default) and
prints the tables.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from engine_bench import DECODE_BATCH, DECODE_CONTEXT, prompt_batches  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from gpu_backend.engine.memory import dummy_store, kv_caches_of  # noqa: E402
from gpu_backend.engine.runner import DecodeGraphs, ModelRunner  # noqa: E402
from gpu_backend.engine.setup import load_model  # noqa: E402
from gpu_backend.engine.shapes import decode_shape, host_batch  # noqa: E402
from gpu_backend.env import copy_bandwidth_bytes_s, device_environment, write_result  # noqa: E402
from gpu_backend.kernels.split_attention import SplitShapes, warm_plans  # noqa: E402
from gpu_backend.layers import SPLIT_BACKENDS  # noqa: E402
from sim.core.catalog import get_gpu, get_model  # noqa: E402
from sim.core.engine_config import EngineConfig  # noqa: E402

PROMPT = 16384
CHUNKS = (2048, 8192, 16384)

# kernel class <- first pattern its name matches (checked in this order)
CLASSES = (
    ("attention (cuDNN)", r"cudnn|fmha|flash|sdpa"),
    ("attention (Triton)", r"paged_attention|combine_splits|decode_split_plan"),
    ("LSE merge", r"_merge_kernel"),
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|splitK|sm90_|sm80_"),
    ("fused norm/rotary/act", r"rms_norm|rotary|silu|store_kv"),
    ("gather/copy", r"index|gather|copy|Memcpy|memcpy|scatter|cat"),
    ("sampling", r"argmax|reduce|max"),
)


def kernel_class(name: str) -> str:
    for label, pattern in CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def kernel_records(prof) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every device kernel and copy the profiler saw."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > 0:
            out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    return sorted(out, key=lambda r: r[1])


def busy_us(records: list[tuple[str, float, float]]) -> float:
    """Length of the union of the kernel intervals."""
    total, end = 0.0, -1.0
    for _, s, e in records:
        if s >= end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


GAP_BUCKETS_US = (5.0, 20.0, 100.0, 1000.0)


def gaps(records: list[tuple[str, float, float]], repeat: int) -> dict:
    """The device's idle gaps between kernels (each length's count and ms divided by
    `repeat`, the runs or steps profiled), and the longest with the kernels on either side."""
    found, end, before = [], None, ""
    for name, s, e in records:
        if end is not None and s > end:
            found.append((s - end, before, name))
        if end is None or e >= end:
            end, before = e, name
    edges = (0.0, *GAP_BUCKETS_US, float("inf"))
    buckets = {}
    for low, high in zip(edges, edges[1:]):
        inside = [g for g, _, _ in found if low <= g < high]
        buckets[f"{low:g}-{high:g} us"] = {"count": len(inside) / repeat,
                                          "ms": sum(inside) / 1e3 / repeat}
    longest = sorted(found, key=lambda g: -g[0])[:10]
    return {"by_length": buckets,
            "longest": [{"us": g, "after": a[:80], "before": b[:80]} for g, a, b in longest]}


def host_calls(fn, repeat: int, per: int) -> list[dict]:
    """CUDA runtime and driver calls on the host while `fn` runs `repeat` times, divided by
    `per` (a second, host-traced profile: the host tracing slows the host, so no device timing
    is taken from it)."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
    calls: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("cu"):
            entry = calls.setdefault(e.name, [0.0, 0])
            entry[0] += (e.time_range.end - e.time_range.start) / 1e3 / per
            entry[1] += 1
    top = sorted(calls.items(), key=lambda kv: -kv[1][0])[:10]
    return [{"name": n, "ms": v[0], "calls": v[1] / per} for n, v in top]


def breakdown(fn, repeat: int, steps: int = 1) -> dict:
    """Profile `fn` run `repeat` times (after one warm-up): wall, busy and per-class ms, the
    device's idle gaps and the host's CUDA calls, per run, or per step where one run of `fn`
    is `steps` steps."""
    per = repeat * steps
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / per
    records = kernel_records(prof)
    classes: dict[str, float] = {}
    kernels: dict[str, list[float]] = {}
    for name, s, e in records:
        label = kernel_class(name)
        classes[label] = classes.get(label, 0.0) + (e - s) / 1e3 / per
        entry = kernels.setdefault(name, [0.0, 0])
        entry[0] += (e - s) / 1e3 / per
        entry[1] += 1
    span = (records[-1][2] - records[0][1]) / 1e3 / per if records else 0.0
    busy = busy_us(records) / 1e3 / per
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:12]
    return {"wall_ms": wall * 1e3, "device_span_ms": span, "busy_ms": busy,
            "idle_ms": wall * 1e3 - busy, "classes_ms": dict(sorted(classes.items())),
            "top_kernels": [{"name": n[:120], "class": kernel_class(n), "ms": v[0],
                             "calls": v[1] // per} for n, v in top],
            "gaps": gaps(records, per), "host_calls": host_calls(fn, repeat, per)}


def graph_ms(fn, calls: int = 50, repeat: int = 20) -> float:
    """Device time of one `fn()` (ms): `calls` of them captured in one CUDA graph, the replay
    timed with events (median of `repeat`), so no launch cost of the host's is in it."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return sorted(times)[len(times) // 2]


def decode_matmuls(spec, bandwidth: float) -> list[dict]:
    """Each decode matmul (M = 64), device time through the default BLAS and cuBLASLt."""
    hidden, inter = spec.hidden_size, spec.intermediate_size
    q = spec.num_attention_heads * spec.head_dim
    kv = spec.num_kv_heads * spec.head_dim
    shapes = {"qkv": (hidden, q + 2 * kv), "o": (q, hidden), "gate_up": (hidden, 2 * inter),
              "down": (inter, hidden), "lm_head": (hidden, spec.vocab_size)}
    rows = []
    x_full = torch.randn(DECODE_BATCH, max(hidden, inter, q), dtype=torch.bfloat16, device="cuda")
    for name, (k, n) in shapes.items():
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
        x = x_full[:, :k].contiguous()
        row = {"name": name, "k": k, "n": n, "weight_bytes": w.numel() * 2,
               "roofline_ms": w.numel() * 2 / bandwidth * 1e3}
        for library in ("default", "cublaslt"):
            previous = torch.backends.cuda.preferred_blas_library()
            if library == "cublaslt":
                torch.backends.cuda.preferred_blas_library("cublaslt")
            try:
                ms = graph_ms(lambda x=x, w=w: torch.nn.functional.linear(x, w))
            finally:
                torch.backends.cuda.preferred_blas_library(previous)
            row[f"{library}_ms"] = ms
            row[f"{library}_fraction_of_copy"] = row["roofline_ms"] / ms
        rows.append(row)
    return rows


def print_table(title: str, rows: dict[str, dict]) -> None:
    labels = sorted({c for r in rows.values() for c in r["classes_ms"]})
    print(title)
    head = "".join(f"{name:>14}" for name in rows)
    print(f"{'':>24}{head}")
    for key in ("wall_ms", "busy_ms", "idle_ms"):
        print(f"{key:>24}" + "".join(f"{r[key]:>14.2f}" for r in rows.values()))
    for label in labels:
        print(f"{label[:24]:>24}" + "".join(f"{r['classes_ms'].get(label, 0.0):>14.2f}"
                                            for r in rows.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--attention-backend", default="auto",
                        choices=("triton", "split", "auto"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("step_breakdown needs a CUDA GPU")
    spec, bs = get_model(args.model), args.block_size
    max_len = PROMPT + bs
    config = EngineConfig(spec, get_gpu(args.gpu), max_model_len=max_len, block_size=bs)
    cuda = torch.device("cuda")
    bandwidth = copy_bandwidth_bytes_s()
    allocated = torch.cuda.memory_allocated()
    model = load_model(config, cuda, seed=0, backend=args.attention_backend)
    weights_bytes = torch.cuda.memory_allocated() - allocated
    num_blocks = 1 + PROMPT // bs + DECODE_BATCH * (DECODE_CONTEXT // bs + 1)
    caches = kv_caches_of(dummy_store(spec, num_blocks, bs, cuda), spec.num_layers)
    if args.attention_backend in SPLIT_BACKENDS:
        warm_plans(SplitShapes().sdpa_shapes(PROMPT, max_len), spec.num_attention_heads,
                   spec.num_kv_heads, spec.head_dim, torch.bfloat16, cuda)
    graphs = DecodeGraphs(model, caches, DECODE_BATCH, max_len, bs, cuda, (DECODE_BATCH,))
    graphs.capture()
    runner = ModelRunner(model, caches, cuda, graphs)

    decode = host_batch(decode_shape(DECODE_BATCH, DECODE_CONTEXT), bs, num_blocks)
    kv_bytes = DECODE_BATCH * DECODE_CONTEXT * spec.kv_bytes_per_token()
    res: dict = {"env": device_environment(), "model": spec.name,
                 "attention_backend": args.attention_backend, "copy_bandwidth_bytes_s": bandwidth,
                 "weights_bytes": weights_bytes, "kv_bytes": kv_bytes}
    roofline = {"roofline_ms": (weights_bytes + kv_bytes) / bandwidth * 1e3,
                "weights_roofline_ms": weights_bytes / bandwidth * 1e3,
                "kv_roofline_ms": kv_bytes / bandwidth * 1e3}
    res["decode"] = {**breakdown(lambda: runner.execute(decode), repeat=20), **roofline}
    steps = 20

    def decodes_launched() -> None:
        for step in [runner.launch(decode) for _ in range(steps)]:
            step.collect()

    res["decode_launched_ahead"] = {**breakdown(decodes_launched, repeat=1, steps=steps),
                                    **roofline}
    res["decode_matmuls"] = decode_matmuls(spec, bandwidth)

    for key, launched in (("chunked_prompt", False), ("chunked_prompt_launched_ahead", True)):
        curves: dict[str, dict] = {}
        for num_decodes in (0, DECODE_BATCH):
            for chunk in CHUNKS:
                batches = prompt_batches(bs, num_blocks, PROMPT, chunk, num_decodes)

                def run_all(batches=batches, launched=launched) -> None:
                    if launched:  # every step queued before the first is collected
                        for step in [runner.launch(batch) for batch in batches]:
                            step.collect()
                    else:
                        for batch in batches:
                            runner.execute(batch)

                row = breakdown(run_all, repeat=3)
                row.update({"chunk": chunk, "num_decodes": num_decodes,
                            "steps": len(batches)})
                curves[f"chunk {chunk}, {num_decodes} decodes"] = row
        res[key] = curves
    graphs.release()

    d = res["decode"]
    for name in ("decode", "decode_launched_ahead"):
        r = res[name]
        print(f"{name} b{DECODE_BATCH} ctx {DECODE_CONTEXT}: wall {r['wall_ms']:.2f} ms "
              f"({r['wall_ms'] / r['roofline_ms']:.2f}x roofline), busy {r['busy_ms']:.2f} ms "
              f"({r['busy_ms'] / r['roofline_ms']:.2f}x), roofline {r['roofline_ms']:.2f} ms "
              f"(weights {r['weights_roofline_ms']:.2f}, KV {r['kv_roofline_ms']:.2f})")
    for label, ms in d["classes_ms"].items():
        print(f"  {label:<24} {ms:8.3f} ms")
    for r in res["decode_matmuls"]:
        print(f"  matmul {r['name']:<8} roofline {r['roofline_ms']:.4f} ms, default "
              f"{r['default_ms']:.4f} ({r['default_fraction_of_copy']:.2f}), cublaslt "
              f"{r['cublaslt_ms']:.4f} ({r['cublaslt_fraction_of_copy']:.2f})")
    for key in ("chunked_prompt", "chunked_prompt_launched_ahead"):
        print_table(f"{PROMPT}-token prompt by chunk size, {key} (ms per prompt)", res[key])
        for num_decodes in (0, DECODE_BATCH):
            rows = {r["chunk"]: r["wall_ms"] for r in res[key].values()
                    if r["num_decodes"] == num_decodes}
            print(f"  {num_decodes} decodes: chunk {CHUNKS[0]} against {PROMPT}: "
                  f"{rows[CHUNKS[0]] / rows[PROMPT] - 1:+.1%}")
    for name, row in {"decode": d, **res["chunked_prompt"]}.items():
        print(f"{name}:")
        print("  top kernels: " + ", ".join(f"{k['name'][:48]} {k['ms']:.1f}"
                                            for k in row["top_kernels"][:5]))
        print("  idle gaps: " + ", ".join(f"{k} {v['count']:.0f} = {v['ms']:.2f} ms"
                                          for k, v in row["gaps"]["by_length"].items()))
        for g in row["gaps"]["longest"][:4]:
            print(f"    {g['us']:.0f} us after {g['after'][:40]} before {g['before'][:40]}")
        print("  host CUDA calls: " + ", ".join(f"{c['name']} {c['calls']:.0f}x {c['ms']:.2f} ms"
                                                for c in row["host_calls"][:6]))
    print(f"wrote {write_result(res, args.out, 'step_breakdown', res['env']['gpu'], spec.name, args.attention_backend)}")


if __name__ == "__main__":
    main()
