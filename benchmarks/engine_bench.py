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
The timed cases are in engine_bench_cases.py; the chunk penalties and the printed report in
engine_bench_report.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from engine_bench_cases import DECODE_BATCH as DECODE_BATCH  # noqa: E402
from engine_bench_cases import DECODE_CONTEXT as DECODE_CONTEXT  # noqa: E402
from engine_bench_cases import (  # noqa: E402
    Engine,
    add_curves,
    bench_attention_chunks,
    bench_backends,
    bench_chunks,
    bench_decode,
    bench_fusion,
    bench_prefill,
    build_engine,
    warm_split,
)
from engine_bench_cases import prompt_batches as prompt_batches  # noqa: E402
from engine_bench_report import attention_penalties, chunk_penalties, print_report  # noqa: E402

from gpu_backend.engine.piecewise import PiecewiseGraphs  # noqa: E402
from gpu_backend.engine.runner import ModelRunner  # noqa: E402
from gpu_backend.env import device_environment, write_result  # noqa: E402
from gpu_backend.layers import SPLIT_BACKENDS  # noqa: E402
from sim.core.catalog import ModelSpec, get_model  # noqa: E402

# DECODE_BATCH, DECODE_CONTEXT and prompt_batches are imported as themselves, for the scripts
# that time the same steps (step_breakdown.py, reclaim_step.py) to import from here

CHUNKS = (512, 1024, 2048, 4096, 8192, 16384)
PROMPTS = (16384, 32768)
# the attention backends a model can switch between
BACKENDS = ("triton", "split", "auto", "flashinfer")


def build_parser() -> argparse.ArgumentParser:
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
    return parser


def result_suffix(args: argparse.Namespace, backends: tuple[str, ...]) -> tuple[str, ...]:
    """The parts of the result's file name beyond GPU and model, from the flags set."""
    # results named by what they measure: the default file holds the Triton backend's
    suffix = () if backends == ("triton",) else ("attention", *backends)
    if args.async_scheduling:
        suffix = (*suffix, "async")
    if args.blas != "default":
        suffix = (*suffix, args.blas)
    if args.mixed_split_mib is not None:
        suffix = (*suffix, f"mixed-split-{args.mixed_split_mib}mib")
    return suffix


def prompts_within(spec: ModelSpec, quick: bool) -> tuple[int, ...]:
    """The prompts timed: within the model's context only (EngineConfig refuses a longer
    max_model_len, as vLLM does; Qwen2.5's context is exactly the 32k prompt)."""
    context = spec.max_position_embeddings
    prompts = tuple(p for p in (PROMPTS[:1] if quick else PROMPTS) if p <= context)
    if not prompts:
        sys.exit(f"engine_bench: {spec.name}'s context ({context:,} tokens) is shorter than "
                 f"every prompt it times ({', '.join(f'{p:,}' for p in PROMPTS)})")
    return prompts


def chunk_sizes(args: argparse.Namespace, prompts: tuple[int, ...]) -> tuple[int, ...]:
    """The chunk sizes of the chunk-size curves: --chunks with the longest prompt added, or
    the defaults."""
    chunks = (512, 4096, 16384) if args.quick else CHUNKS
    if args.chunks is not None:
        try:
            chunks = tuple(sorted({int(c) for c in args.chunks.split(",") if c.strip()}
                                  | {max(prompts)}))
        except ValueError:
            sys.exit(f"engine_bench: --chunks {args.chunks!r}: give chunk sizes as N,N,...")
        if chunks[0] < 1:
            sys.exit("engine_bench: --chunks: every chunk size must be at least 1")
    return chunks


@dataclass(frozen=True)
class Sweep:
    """What the chunk-size curves run: the prompts, the chunk sizes and the attention
    backends (the first is the model's own between stages)."""
    prompts: tuple[int, ...]
    chunks: tuple[int, ...]
    backends: tuple[str, ...]


def bench_steps(engine: Engine, args: argparse.Namespace, sweep: Sweep) -> dict:
    """The result's header, the decode step (also launched ahead, with --async-scheduling),
    SPLIT's plans built up front, and the 16k prefill (with the new-shape steps and the
    memory profile, per backend, where any backend but triton is timed)."""
    spec, runner, num_blocks, bs = engine.spec, engine.runner, engine.num_blocks, engine.bs
    backends = sweep.backends
    res = {"env": device_environment(), "model": spec.name, "attention_backends": list(backends),
           "blas": args.blas, "mixed_split_min_keys": engine.config.mixed_split_min_keys,
           "cudnn_sdpa_avoid_recompile": os.environ.get("TORCH_CUDNN_SDPA_AVOID_RECOMPILE"),
           "copy_bandwidth_bytes_s": engine.bandwidth, "matmul_flops_s": engine.matmul_peak,
           "weights_bytes": engine.weights_bytes,
           "decode": bench_decode(runner, spec, num_blocks, bs, engine.weights_bytes,
                                  engine.bandwidth)}
    if args.async_scheduling:
        res["decode_async"] = bench_decode(runner, spec, num_blocks, bs, engine.weights_bytes,
                                           engine.bandwidth, ahead=True)
    if set(backends) & set(SPLIT_BACKENDS):
        res["split_plan_warmup"] = warm_split(engine.model, spec, max(sweep.chunks),
                                              engine.max_len)
    if backends != ("triton",):
        res.update(bench_backends(engine.model, runner, engine.config, num_blocks,
                                  engine.matmul_peak, backends))
    else:
        res["prefill"] = bench_prefill(runner, spec, num_blocks, bs, engine.matmul_peak, 16384)
    return res


def bench_curves(res: dict, runner: ModelRunner, engine: Engine, sweep: Sweep, key: str,
                 async_scheduling: bool) -> None:
    """The chunk-size curves through `runner` under `key` (per backend), and with each step
    launched ahead under `key`_async, with --async-scheduling."""
    def curves(ahead: bool) -> dict[str, list[dict]]:
        return bench_chunks(runner, engine.bs, engine.num_blocks, sweep.prompts, sweep.chunks,
                            engine.model, sweep.backends, ahead)
    add_curves(res, key, curves(False))
    if async_scheduling:
        add_curves(res, f"{key}_async", curves(True))


def bench_piecewise(res: dict, engine: Engine, sweep: Sweep, args: argparse.Namespace) -> None:
    """The chunk-size curves again with piecewise CUDA graphs up to --piecewise-max-tokens."""
    cuda = torch.device("cuda")
    pieces = PiecewiseGraphs(engine.model, engine.caches, args.piecewise_max_tokens, cuda)
    pieces.capture()
    piecewise = ModelRunner(engine.model, engine.caches, cuda, engine.graphs, pieces)
    res["piecewise_max_tokens"] = args.piecewise_max_tokens
    bench_curves(res, piecewise, engine, sweep, "chunk_curve_piecewise", args.async_scheduling)
    pieces.release()


def add_penalties(res: dict, engine: Engine, sweep: Sweep, async_scheduling: bool) -> None:
    """Each curve's chunk penalties, then the attention alone at every point of the curves
    and its part of the penalty (against the async curves, with --async-scheduling)."""
    for key in [k for k in res if k.startswith("chunk_curve")]:
        res[key.replace("chunk_curve", "chunk_penalty", 1)] = chunk_penalties(
            res[key], engine.spec, engine.bandwidth, engine.matmul_peak)
    add_curves(res, "attention_chunks",
               bench_attention_chunks(engine.spec, sweep.prompts, sweep.chunks, sweep.backends))
    curve = "chunk_curve_async" if async_scheduling else "chunk_curve"
    for i, backend in enumerate(sweep.backends):
        tail = "" if i == 0 else f"_{backend}"
        res[f"attention_penalty{tail}"] = attention_penalties(res[f"attention_chunks{tail}"],
                                                              res[f"{curve}{tail}"])


def main() -> None:
    """Build the engine, time each stage the flags ask for, write the result and print its
    report (the fusion A/B last, then the result again with it)."""
    args = build_parser().parse_args()
    backends = tuple(dict.fromkeys(args.attention_backend))
    suffix = result_suffix(args, backends)
    if not torch.cuda.is_available():
        sys.exit("engine_bench needs a CUDA GPU")
    if args.blas != "default":
        torch.backends.cuda.preferred_blas_library(args.blas)
    spec = get_model(args.model)
    prompts = prompts_within(spec, args.quick)
    sweep = Sweep(prompts, chunk_sizes(args, prompts), backends)
    engine = build_engine(spec, args.gpu, args.block_size, max(prompts), backends[0],
                          args.mixed_split_mib)
    res = bench_steps(engine, args, sweep)
    bench_curves(res, engine.runner, engine, sweep, "chunk_curve", args.async_scheduling)
    if args.piecewise_max_tokens is not None:
        bench_piecewise(res, engine, sweep, args)
    engine.graphs.release()
    add_penalties(res, engine, sweep, args.async_scheduling)
    names = (res["env"]["gpu"], spec.name, *suffix)
    print(f"wrote {write_result(res, args.out, 'engine', *names)}")
    # last: A/B only
    res["fusion"] = bench_fusion(engine.model, engine.caches, spec, engine.bs, engine.num_blocks,
                                 engine.max_len)
    print_report(res)
    print(f"wrote {write_result(res, args.out, 'engine', *names)}")


if __name__ == "__main__":
    main()
