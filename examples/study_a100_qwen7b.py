"""The study's controlled experiment (arXiv 2608.23658), simulated: chunk size versus elastic.

    .venv/bin/python examples/study_a100_qwen7b.py > examples/study_a100_qwen7b.txt

Setup as the study describes it: one A100-40GB, Qwen2.5-7B in FP16, gpu_memory_utilization
0.9, max_model_len 32,768, vLLM's other defaults for a 40 GB card; 40 long-running decodes
are on the engine when six ~25,000-token prompts arrive, seconds apart. What the study does
not give, and this example assumes (each a flag): the decodes' prompt and output lengths
(1,024 and 4,096 tokens, all arriving at t = 0), the long prompts' exact lengths (24,000 to
26,000) and outputs (256 tokens), and their spacing (the first at 5 s, then one every 3 s).

Six engines: chunks 2,048, 8,192 and 32,768 (max_num_batched_tokens), each static and
elastic (the activation reserve lent to the KV pool while only decodes run, migrated back
before a prefill). Printed: each long prompt's TTFT, KV capacity, preemptions, lent tokens.
docs/study.md reads the numbers against the study's findings.
"""

from __future__ import annotations

import argparse
import json
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
CHUNKS = (2048, 8192, 32768)
CONFIGS = tuple((policy, chunk) for chunk in CHUNKS for policy in (Policy.STATIC, Policy.ELASTIC))
LONG_PROMPTS = (25_000, 24_000, 26_000, 25_500, 24_500, 25_000)


def study_trace(args: argparse.Namespace) -> Trace:
    """`num_decodes` decodes at t = 0, then the long prompts `spacing_s` apart from `first_s`."""
    n, longs = args.num_decodes, args.long_prompts
    arrivals = [0.0] * n + [args.first_s + i * args.spacing_s for i in range(len(longs))]
    return Trace(
        arrival_s=np.array(arrivals),
        prompt_tokens=np.array([args.decode_prompt] * n + list(longs), dtype=np.int64),
        output_tokens=np.array([args.decode_output] * n + [args.long_output] * len(longs),
                               dtype=np.int64),
        source=f"{n} decodes ({args.decode_prompt:,}-token prompts, {args.decode_output:,} "
               f"outputs) at 0 s + {len(longs)} prompts of {min(longs):,}-{max(longs):,} "
               f"tokens from {args.first_s:g} s, every {args.spacing_s:g} s",
        format="synthetic",
    )


def write_trace(trace: Trace, path: Path) -> None:
    """The scenario as a Mooncake JSON-lines trace (no hash ids), for the GPU engine's replay
    (`python -m gpu_backend replay --trace PATH`)."""
    rows = zip(trace.arrival_s.tolist(), trace.prompt_tokens.tolist(),
               trace.output_tokens.tolist())
    path.write_text("".join(
        json.dumps({"timestamp": round(arrival_s * 1000), "input_length": prompt,
                    "output_length": output}) + "\n" for arrival_s, prompt, output in rows))


def engine(policy: Policy, chunk: int) -> EngineConfig:
    return EngineConfig(
        model=with_dtype(get_model("qwen2.5-7b"), "fp16"), gpu=get_gpu("a100-40gb"),
        max_num_batched_tokens=chunk, gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        max_model_len=MAX_MODEL_LEN, policy=policy,
    )


def long_prompt_ttfts_s(result: RunResult, num_decodes: int) -> list[float | None]:
    """TTFT of each long prompt in arrival order (None: it never got a first token)."""
    requests = sorted((r for rec in result.recorders for r in rec.requests),
                      key=lambda r: r.request_id)
    return [None if r.first_token_s is None else r.first_token_s - r.arrival_s
            for r in requests[num_decodes:]]


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


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def ttft_table(results: list[RunResult], args: argparse.Namespace) -> Table:
    table = Table(title="time to first token of each long prompt, s")
    table.add_column("prompt (arrival)")
    for r in results:
        table.add_column(r.spec.label, justify="right")
    ttfts = [long_prompt_ttfts_s(r, args.num_decodes) for r in results]
    for i, tokens in enumerate(args.long_prompts):
        arrival_s = args.first_s + i * args.spacing_s
        table.add_row(f"{tokens:,} ({arrival_s:g} s)", *[_seconds(t[i]) for t in ttfts])
    for name, fn in (("median", np.median), ("max", np.max)):
        table.add_row(name, *[_seconds(float(fn(t))) if None not in t else "-" for t in ttfts])
    return table


def memory_table(results: list[RunResult]) -> Table:
    table = Table(title="memory, preemption and the rest of the run")
    table.add_column("metric")
    for r in results:
        table.add_column(r.spec.label, justify="right")
    s = [r.summary for r in results]
    rows = [
        ("activation reserve, GiB", [f"{r.core.plan.activation_reserve_bytes / GIB:.2f}"
                                     for r in results]),
        ("KV capacity, tokens (always)", [f"{x['kv_capacity_tokens']:,}" for x in s]),
        ("KV capacity with reserve lent", [f"{x['kv_capacity_lent_tokens']:,}" for x in s]),
        ("reserve lent, max tokens", [f"{x['reserve_lent_tokens_max']:,}" for x in s]),
        ("reserve lent, time share", [f"{x['reserve_lent_time_share']:.1%}" for x in s]),
        ("KV peak used, tokens", [f"{peak_kv_tokens(r):,}" for r in results]),
        ("preemptions", [f"{x['num_preemptions']}" for x in s]),
        ("attach / detach", [f"{x['num_attach']} / {x['num_detach']}" for x in s]),
        ("migrated, MiB", [f"{x['migrated_bytes'] / 2**20:.1f}" for x in s]),
        ("decode TPOT p50, ms", [f"{x['tpot_s']['p50'] * 1e3:.2f}" for x in s]),
        ("makespan, s", [f"{x['makespan_s']:.1f}" for x in s]),
        ("finished / requests", [f"{x['num_finished']} / {x['num_requests']}" for x in s]),
    ]
    for label, cells in rows:
        table.add_row(label, *cells)
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-decodes", type=int, default=40)
    parser.add_argument("--decode-prompt", type=int, default=1024)
    parser.add_argument("--decode-output", type=int, default=4096)
    parser.add_argument("--long-prompts", type=int, nargs="+", default=list(LONG_PROMPTS),
                        metavar="TOKENS", help="the long prompts' lengths, in arrival order")
    parser.add_argument("--long-output", type=int, default=256)
    parser.add_argument("--first-s", type=float, default=5.0, help="first long prompt's arrival")
    parser.add_argument("--spacing-s", type=float, default=3.0, help="between long prompts")
    parser.add_argument("--write-trace", type=Path, default=None, metavar="PATH",
                        help="also write the scenario as a JSON-lines trace for the GPU replay")
    args = parser.parse_args(argv)
    if args.spacing_s < 0 or args.first_s < 0:
        parser.error("--first-s and --spacing-s must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=170)
    trace = study_trace(args)
    if args.write_trace is not None:
        write_trace(trace, args.write_trace)
    try:  # plan_memory raises ValueError if max_model_len does not fit the KV pool
        results = [simulate(RunSpec(engine(p, c)), trace) for p, c in CONFIGS]
    except ValueError as exc:
        print(f"error: the study's setup does not fit: {exc}", file=sys.stderr)
        return 2
    plan = results[0].core.plan
    console.print(f"setup: {trace.source}; weights {plan.weights_bytes / GIB:.2f} GiB, "
                  f"KV {plan.kv_bytes_per_token // 1024} KiB per token", highlight=False)
    cost = CostModel(results[0].spec.engine.model, results[0].spec.engine.gpu)
    prompt = args.long_prompts[0]
    alone = {c: isolated_prefill_s(cost, prompt, c) for c in CHUNKS}
    console.print(f"one {prompt:,}-token prompt alone: " + ", ".join(
        f"{alone[c]:.3f} s at chunk {c:,} ({alone[c] / alone[CHUNKS[-1]] - 1:+.1%})"
        for c in CHUNKS), highlight=False)
    console.print(ttft_table(results, args))
    console.print(memory_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
