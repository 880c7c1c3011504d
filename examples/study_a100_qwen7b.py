"""The published study's controlled experiment, simulated: chunk size versus elastic borrowing.

    .venv/bin/python examples/study_a100_qwen7b.py > examples/study_a100_qwen7b.txt

Setup (one A100-40GB, Qwen2.5-7B in FP16, gpu_memory_utilization 0.9, max_model_len 32768,
vLLM's other defaults for a 40 GB card): 40 long-running decode requests (1,024-token
prompts, 6,000 output tokens) arrive at t = 0; at t = 5 s six prompts of 25,000 tokens
(256 output tokens each) arrive together. We compare

    static   chunk  8,192   (a smaller activation reserve, for good)
    static   chunk 32,768   (the whole long prompt in one step)
    elastic  chunk 32,768   (the large reserve, lent to the KV pool while only decodes run)

on the median and maximum time to first token of the six long prompts and on KV capacity.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from sim.core.catalog import GIB, get_gpu, get_model, with_dtype  # noqa: E402
from sim.core.cost_model import CostModel  # noqa: E402
from sim.core.elastic import Policy  # noqa: E402
from sim.core.engine_config import EngineConfig  # noqa: E402
from sim.recording.metrics import TIMELINE_COLUMNS, timeline_array  # noqa: E402
from sim.runner import RunResult, RunSpec, simulate  # noqa: E402
from traces import Trace  # noqa: E402

MAX_MODEL_LEN = 32768
GPU_MEMORY_UTILIZATION = 0.9
CONFIGS = ((Policy.STATIC, 8192), (Policy.STATIC, 32768), (Policy.ELASTIC, 32768))


def study_trace(args: argparse.Namespace) -> Trace:
    """`num_decodes` decode requests at t = 0, then `num_long` long prompts at `inject_s`."""
    n, m = args.num_decodes, args.num_long
    return Trace(
        arrival_s=np.array([0.0] * n + [args.inject_s] * m),
        prompt_tokens=np.array([args.decode_prompt] * n + [args.long_prompt] * m, dtype=np.int64),
        output_tokens=np.array([args.decode_output] * n + [args.long_output] * m, dtype=np.int64),
        source=f"{n} decodes at 0 s + {m} x {args.long_prompt:,}-token prompts at "
               f"{args.inject_s:g} s",
        format="synthetic",
    )


def engine(policy: Policy, chunk: int) -> EngineConfig:
    return EngineConfig(
        model=with_dtype(get_model("qwen2.5-7b"), "fp16"), gpu=get_gpu("a100-40gb"),
        max_num_batched_tokens=chunk, gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        max_model_len=MAX_MODEL_LEN, policy=policy,
    )


def long_prompt_ttft_s(result: RunResult, num_decodes: int) -> np.ndarray:
    requests = sorted((r for rec in result.recorders for r in rec.requests),
                      key=lambda r: r.request_id)
    return np.array([r.first_token_s - r.arrival_s for r in requests[num_decodes:]])


def peak_kv_tokens(result: RunResult) -> int:
    used = TIMELINE_COLUMNS.index("kv_blocks_used")
    peak_blocks = max(int(timeline_array(rec)[:, used].max()) for rec in result.recorders)
    return peak_blocks * result.spec.engine.block_size


def isolated_prefill_s(cost: CostModel, prompt: int, chunk: int) -> float:
    """One prompt alone on an idle engine, cut into steps of `chunk` tokens."""
    total_s = 0.0
    for start in range(0, prompt, chunk):
        num_new = min(chunk, prompt - start)
        total_s += (cost.linear_s(num_new) + cost.prefill_attention_s(((num_new, start),))
                    + cost.eff.step_overhead_s + cost.eff.per_seq_overhead_s)
    return total_s + cost.logits_s(1)


def results_table(results: list[RunResult], num_decodes: int) -> Table:
    table = Table(title="six 25k-token prompts injected into 40 running decodes "
                        "(Qwen2.5-7B fp16, 1x A100-40GB)")
    table.add_column("metric")
    for r in results:
        table.add_column(r.spec.label, justify="right")
    ttfts = [long_prompt_ttft_s(r, num_decodes) for r in results]
    rows = [
        ("activation reserve, GiB", [f"{r.core.plan.activation_reserve_bytes / GIB:.2f}"
                                     for r in results]),
        ("KV capacity, tokens (always)", [f"{r.summary['kv_capacity_tokens']:,}" for r in results]),
        ("KV capacity with reserve lent", [f"{r.summary['kv_capacity_lent_tokens']:,}"
                                           for r in results]),
        ("KV peak used, tokens", [f"{peak_kv_tokens(r):,}" for r in results]),
        ("reserve lent, max tokens", [f"{r.summary['reserve_lent_tokens_max']:,}" for r in results]),
        ("reserve lent, time share", [f"{r.summary['reserve_lent_time_share']:.1%}"
                                      for r in results]),
        ("long-prompt TTFT median, s", [f"{np.median(t):.2f}" for t in ttfts]),
        ("long-prompt TTFT max, s", [f"{t.max():.2f}" for t in ttfts]),
        ("decode TPOT p50, ms", [f"{r.summary['tpot_s']['p50'] * 1e3:.2f}" for r in results]),
        ("preemptions", [f"{r.summary['num_preemptions']}" for r in results]),
        ("attach / detach", [f"{r.summary['num_attach']} / {r.summary['num_detach']}"
                             for r in results]),
        ("makespan, s", [f"{r.summary['makespan_s']:.1f}" for r in results]),
        ("finished / requests", [f"{r.summary['num_finished']} / {r.summary['num_requests']}"
                                 for r in results]),
    ]
    for label, cells in rows:
        table.add_row(label, *cells)
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-decodes", type=int, default=40)
    parser.add_argument("--decode-prompt", type=int, default=1024)
    parser.add_argument("--decode-output", type=int, default=6000)
    parser.add_argument("--num-long", type=int, default=6)
    parser.add_argument("--long-prompt", type=int, default=25_000)
    parser.add_argument("--long-output", type=int, default=256)
    parser.add_argument("--inject-s", type=float, default=5.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=120)
    trace = study_trace(args)
    try:  # plan_memory raises ValueError if max_model_len does not fit the KV pool
        results = [simulate(RunSpec(engine(p, c)), trace) for p, c in CONFIGS]
    except ValueError as exc:
        print(f"error: the study's setup does not fit: {exc}", file=sys.stderr)
        return 2
    plan = results[0].core.plan
    console.print(f"setup: {trace.source}; weights {plan.weights_bytes / GIB:.2f} GiB, "
                  f"KV {plan.kv_bytes_per_token // 1024} KiB per token", highlight=False)
    console.print(f"max_model_len {MAX_MODEL_LEN:,} fits at every chunk size (plan_memory "
                  "checks it)", highlight=False)
    cost = CostModel(results[0].spec.engine.model, results[0].spec.engine.gpu)
    alone = {c: isolated_prefill_s(cost, args.long_prompt, c) for c in (8192, 32768)}
    console.print(f"one {args.long_prompt:,}-token prompt alone: {alone[8192]:.3f} s in chunks "
                  f"of 8,192, {alone[32768]:.3f} s in one step "
                  f"({alone[8192] / alone[32768] - 1:+.1%}): prefill is compute-bound",
                  highlight=False)
    console.print(results_table(results, args.num_decodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
