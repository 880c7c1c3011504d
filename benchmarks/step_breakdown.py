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
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from engine_bench import DECODE_BATCH, DECODE_CONTEXT, prompt_batches  # noqa: E402
from step_breakdown_profile import breakdown, busy_us, gaps, graph_ms, kernel_class  # noqa: E402

from gpu_backend.engine.memory import dummy_store, kv_caches_of  # noqa: E402
from gpu_backend.engine.runner import DecodeGraphs, ModelRunner  # noqa: E402
from gpu_backend.engine.setup import load_model  # noqa: E402
from gpu_backend.engine.shapes import decode_shape, host_batch  # noqa: E402
from gpu_backend.env import copy_bandwidth_bytes_s, device_environment, write_result  # noqa: E402
from gpu_backend.kernels.split_attention import warm_plans  # noqa: E402
from gpu_backend.layers import SPLIT_BACKENDS  # noqa: E402
from sim.core.catalog import ModelSpec, get_gpu, get_model  # noqa: E402
from sim.core.engine_config import EngineConfig  # noqa: E402
from sim.core.split_shapes import SplitShapes  # noqa: E402

PROMPT = 16384
CHUNKS = (2048, 8192, 16384)

__all__ = ["busy_us", "gaps", "kernel_class"]  # what the tests import from this script


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


@dataclass(frozen=True)
class Rig:
    """The model loaded beside a KV pool for the prompt and the decodes, its decode graph
    captured, and the numbers the rooflines need."""

    spec: ModelSpec
    block_size: int
    num_blocks: int
    graphs: DecodeGraphs
    runner: ModelRunner
    bandwidth: float  # bytes/s of a large device copy
    weights_bytes: int


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--attention-backend", default="auto",
                        choices=("triton", "split", "auto"))
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def build_rig(args: argparse.Namespace) -> Rig:
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
    return Rig(spec, bs, num_blocks, graphs, runner, bandwidth, weights_bytes)


def measure_decode(rig: Rig, backend: str) -> dict:
    """The result's header and the decode step against its roofline, executed step by step
    and launched ahead, and the decode matmuls alone."""
    spec, runner, bandwidth = rig.spec, rig.runner, rig.bandwidth
    decode = host_batch(decode_shape(DECODE_BATCH, DECODE_CONTEXT), rig.block_size,
                        rig.num_blocks)
    kv_bytes = DECODE_BATCH * DECODE_CONTEXT * spec.kv_bytes_per_token()
    res: dict = {"env": device_environment(), "model": spec.name,
                 "attention_backend": backend, "copy_bandwidth_bytes_s": bandwidth,
                 "weights_bytes": rig.weights_bytes, "kv_bytes": kv_bytes}
    roofline = {"roofline_ms": (rig.weights_bytes + kv_bytes) / bandwidth * 1e3,
                "weights_roofline_ms": rig.weights_bytes / bandwidth * 1e3,
                "kv_roofline_ms": kv_bytes / bandwidth * 1e3}
    res["decode"] = {**breakdown(lambda: runner.execute(decode), repeat=20), **roofline}
    steps = 20

    def decodes_launched() -> None:
        for step in [runner.launch(decode) for _ in range(steps)]:
            step.collect()

    res["decode_launched_ahead"] = {**breakdown(decodes_launched, repeat=1, steps=steps),
                                    **roofline}
    res["decode_matmuls"] = decode_matmuls(spec, bandwidth)
    return res


def run_steps(runner: ModelRunner, batches: list, launched: bool) -> None:
    """Every step of `batches`, each executed in turn, or all queued before the first is
    collected where `launched`."""
    if launched:  # every step queued before the first is collected
        for step in [runner.launch(batch) for batch in batches]:
            step.collect()
    else:
        for batch in batches:
            runner.execute(batch)


def measure_chunked(rig: Rig, launched: bool) -> dict[str, dict]:
    """The prompt prefilled at each chunk size, alone and beside the decodes."""
    curves: dict[str, dict] = {}
    for num_decodes in (0, DECODE_BATCH):
        for chunk in CHUNKS:
            batches = prompt_batches(rig.block_size, rig.num_blocks, PROMPT, chunk, num_decodes)
            row = breakdown(lambda b=batches: run_steps(rig.runner, b, launched), repeat=3)
            row.update({"chunk": chunk, "num_decodes": num_decodes,
                        "steps": len(batches)})
            curves[f"chunk {chunk}, {num_decodes} decodes"] = row
    return curves


def print_decode(res: dict) -> None:
    for name in ("decode", "decode_launched_ahead"):
        r = res[name]
        print(f"{name} b{DECODE_BATCH} ctx {DECODE_CONTEXT}: wall {r['wall_ms']:.2f} ms "
              f"({r['wall_ms'] / r['roofline_ms']:.2f}x roofline), busy {r['busy_ms']:.2f} ms "
              f"({r['busy_ms'] / r['roofline_ms']:.2f}x), roofline {r['roofline_ms']:.2f} ms "
              f"(weights {r['weights_roofline_ms']:.2f}, KV {r['kv_roofline_ms']:.2f})")
    for label, ms in res["decode"]["classes_ms"].items():
        print(f"  {label:<24} {ms:8.3f} ms")
    for r in res["decode_matmuls"]:
        print(f"  matmul {r['name']:<8} roofline {r['roofline_ms']:.4f} ms, default "
              f"{r['default_ms']:.4f} ({r['default_fraction_of_copy']:.2f}), cublaslt "
              f"{r['cublaslt_ms']:.4f} ({r['cublaslt_fraction_of_copy']:.2f})")


def print_chunked(res: dict) -> None:
    for key in ("chunked_prompt", "chunked_prompt_launched_ahead"):
        print_table(f"{PROMPT}-token prompt by chunk size, {key} (ms per prompt)", res[key])
        for num_decodes in (0, DECODE_BATCH):
            rows = {r["chunk"]: r["wall_ms"] for r in res[key].values()
                    if r["num_decodes"] == num_decodes}
            print(f"  {num_decodes} decodes: chunk {CHUNKS[0]} against {PROMPT}: "
                  f"{rows[CHUNKS[0]] / rows[PROMPT] - 1:+.1%}")


def print_kernels(res: dict) -> None:
    """The decode step's and each chunked prompt's top kernels, idle gaps and host calls."""
    for name, row in {"decode": res["decode"], **res["chunked_prompt"]}.items():
        print(f"{name}:")
        print("  top kernels: " + ", ".join(f"{k['name'][:48]} {k['ms']:.1f}"
                                            for k in row["top_kernels"][:5]))
        print("  idle gaps: " + ", ".join(f"{k} {v['count']:.0f} = {v['ms']:.2f} ms"
                                          for k, v in row["gaps"]["by_length"].items()))
        for g in row["gaps"]["longest"][:4]:
            print(f"    {g['us']:.0f} us after {g['after'][:40]} before {g['before'][:40]}")
        print("  host CUDA calls: " + ", ".join(f"{c['name']} {c['calls']:.0f}x {c['ms']:.2f} ms"
                                                for c in row["host_calls"][:6]))


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("step_breakdown needs a CUDA GPU")
    rig = build_rig(args)
    res = measure_decode(rig, args.attention_backend)
    for key, launched in (("chunked_prompt", False), ("chunked_prompt_launched_ahead", True)):
        res[key] = measure_chunked(rig, launched)
    rig.graphs.release()
    print_decode(res)
    print_chunked(res)
    print_kernels(res)
    print(f"wrote {write_result(res, args.out, 'step_breakdown', res['env']['gpu'], rig.spec.name, args.attention_backend)}")


if __name__ == "__main__":
    main()
