"""attention_options' sections, run in order on one Bench: the one passes, the chunked
prompt (with SPLIT's steps one by one) and the mixed steps, each section's tensors freed
before the next allocates."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from attention_options_bench import Bench, measure_chunks, measure_mixed
from attention_options_builders import Builder, Option, ours
from attention_options_cases import (
    Chunk,
    Prompt,
    chunk_starts,
    make_decodes,
    make_prompt,
    tile_name,
)
from attention_options_catalog import chunked_options, lse_ops, mixed_options, one_pass_options
from attention_options_split import LseOp, split_parts
from attention_options_vendors import FLASHINFER_BACKENDS, cudnn_graph, flashinfer_plan_ms


def run_one_pass(bench: Bench, tokens_: int, tiles: bool) -> None:
    prompt = make_prompt(bench.heads, tokens_)
    chunk = Chunk(prompt, 0, tokens_)
    base = {"section": "one_pass", "prompt": tokens_, "chunk": tokens_}
    for option in one_pass_options(bench, tiles):
        bench.attempt(base, option, lambda o=option: measure_chunks(bench, o, [chunk]))
    release()


def pick_lse_op(bench: Bench, prompt: int) -> LseOp:
    """The fastest correct SDPA op with LSE on the one pass (SPLIT's square and prefix)."""
    ops = {op.name: op for op in lse_ops(bench)}
    timed = [r for r in bench.rows if r["section"] == "one_pass" and r["prompt"] == prompt
             and r["option"] in ops and r.get("correct")]
    if not timed:
        return lse_ops(bench)[0]
    return ops[min(timed, key=lambda r: r["ms"])["option"]]


def run_chunked(bench: Bench, prompt_tokens: int) -> dict[str, Builder]:
    """Every chunked option over each chunk size and the whole prompt as one chunk; the
    tiles at the first chunk size. Returns the builders by name (for the mixed steps)."""
    prompt = make_prompt(bench.heads, prompt_tokens)
    sizes = list(bench.sizes.chunks) + [prompt_tokens]
    options = chunked_options(bench, prompt_tokens)
    tiles = [Option(f"ours {tile_name(t)}", ours(t), needs_cuda=False)
             for t in bench.sizes.tiles]
    runs = [(o, sizes) for o in options] + [(t, sizes[:1]) for t in tiles]
    for option, option_sizes in runs:
        for size in option_sizes:
            chunks = [Chunk(prompt, p, n) for p, n in chunk_starts(prompt_tokens, size)]
            base = {"section": "chunked", "prompt": prompt_tokens, "chunk": size}
            bench.attempt(base, option,
                          lambda o=option, c=chunks: measure_chunks(bench, o, c))
    run_split_parts(bench, prompt, sizes[:-1])
    release()
    return {o.name: o.build for o in options}


def run_split_parts(bench: Bench, prompt: Prompt, sizes: Sequence[int]) -> None:
    """SPLIT's steps timed one by one, summed over the chunks of each size."""
    op = bench.lse_op or lse_ops(bench)[0]
    option = Option(f"split parts ({op.name}, gathered prefix)", split_parts,
                    needs_cuda=op.kernel != "cpu")

    def work(size: int) -> dict:
        parts_ms: dict[str, float] = {}
        for p, n in chunk_starts(prompt.keys.shape[0], size):
            for name, fn in split_parts(op, Chunk(prompt, p, n)).items():
                parts_ms[name] = parts_ms.get(name, 0.0) + bench.timer(fn)
        return {"ms": sum(parts_ms.values()), "parts_ms": parts_ms}
    for size in sizes:
        base = {"section": "split_parts", "prompt": prompt.keys.shape[0], "chunk": size}
        bench.attempt(base, option, lambda s=size: work(s))


def run_mixed(bench: Bench, builders: dict[str, Builder]) -> None:
    s = bench.sizes
    for prefix in s.mixed_prefixes:
        prompt = make_prompt(bench.heads, prefix + s.mixed_chunk,
                             [s.decode_context] * s.num_decodes)
        chunk = Chunk(prompt, prefix, s.mixed_chunk)
        decodes = make_decodes(bench.heads, prompt, s.num_decodes, s.decode_context)
        base = {"section": "mixed", "prompt": prefix + s.mixed_chunk, "chunk": s.mixed_chunk,
                "prefix": prefix, "decodes": f"{s.num_decodes}x{s.decode_context}"}
        for option in mixed_options(bench, builders):
            bench.attempt(base, option,
                          lambda o=option, c=chunk, d=decodes: measure_mixed(bench, o, c, d))
        for backend in FLASHINFER_BACKENDS:
            option = Option(f"flashinfer {backend} plan (host, once per step)", None,
                            flashinfer=backend, note="host_ms: the plan of this mixed step")
            bench.attempt(base, option, lambda c=chunk, d=decodes, b=backend:
                          {"host_ms": flashinfer_plan_ms(c, d, b)})
        release()


def release() -> None:
    """Free the finished section's tensors before the next allocates."""
    cudnn_graph.cache_clear()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_all(bench: Bench) -> None:
    """The chunked prompt's one pass first (its rows pick SPLIT's op and the baseline),
    then chunked, mixed, and the shorter prompts' one passes last."""
    *shorter, prompt = bench.sizes.prompts
    run_one_pass(bench, prompt, tiles=True)
    bench.lse_op = pick_lse_op(bench, prompt)
    builders = run_chunked(bench, prompt)
    run_mixed(bench, builders)
    for tokens_ in shorter:
        run_one_pass(bench, tokens_, tiles=False)
