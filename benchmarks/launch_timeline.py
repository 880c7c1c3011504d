"""The prefill kernel's launches on a timeline: where a chunk launch's fixed cost goes.

Every program of the Triton paged kernel can record its SM and its start and end on the GPU's
global nanosecond timer (`paged_attention(..., timeline=...)`). This runs one layer of a
16,384-token prompt (Llama-3.1-8B heads: 32 query, 8 KV, head_dim 128, bf16; 16-token blocks
shuffled over the pool) in one pass and in chunks of 2,048 over its cached prefix, in each
launch order of the engine's prefill tile (`TileConfig.longest_first`, `heads_inner`), the
last also with each tile's keys split over 2 and 3 programs, and reports for every launch:

- `device_ms`: its time by CUDA events (median, no timeline written);
- from one more run with the timeline: `span_us`, the first program's start to the last one's
  end; `work_us`, the programs' summed time over the SMs' slots (SMs x the most programs seen
  on one SM at once), the span a perfectly packed launch would take; `ramp_us`, the SMs' mean
  wait for their first program; `tail_us`, their mean idle time after their last;
- per order, the chunk times as a fixed cost per launch plus the (query, key) pairs at a rate
  (`attention_options.launch_split`), beside the one pass's rate.

The chunks' device time less the one pass's is the kernel's chunking cost; `span - work` is
what each launch loses to starting and draining its waves.

`python benchmarks/launch_timeline.py [--out FILE]`; `--report RESULT` prints a saved result.

Measured (H100 80GB HBM3, torch 2.11+cu130, triton 3.6, 2026-12-07; docs/engine.md, "The chunk
launch's tail, on a timeline"): one program per SM; in the engine's order the SMs idle 63 us
after their last program per chunk launch, against a fitted fixed cost of 62 us; longest first
with heads inner 26 us, the chunks' sum 6.66 -> 6.44 ms, the one pass 6.00 -> 6.13 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attention_options import causal_pairs, chunk_starts, launch_split  # noqa: E402

PROMPT = 16384
CHUNK = 2048
HEADS = (32, 8, 128)  # query heads, KV heads, head_dim
LPT = {"longest_first": True, "heads_inner": True}
# name: (TileConfig fields over prefill_config's, num_splits forced or None)
VARIANTS = {"tiles in order": ({}, None), "longest first": ({"longest_first": True}, None),
            "heads inner": ({"heads_inner": True}, None),
            "longest first, heads inner": (LPT, None),
            "longest first, heads inner, 2 splits": (LPT, 2),
            "longest first, heads inner, 3 splits": (LPT, 3)}


def launch_stats(timeline: np.ndarray, num_sms: int) -> dict:
    """Span, packed work, ramp and tail (us) of one launch's timeline: rows of (SM, start
    ns, end ns), rows of zeros for programs that exited before doing work."""
    rows = timeline[timeline[:, 1] > 0]
    if not len(rows):
        return {"programs": 0}
    sm, start, end = rows[:, 0], rows[:, 1].astype(np.float64), rows[:, 2].astype(np.float64)
    t0, t1 = start.min(), end.max()
    used = np.unique(sm)
    first, last, slots = np.empty(len(used)), np.empty(len(used)), 1
    for i, s in enumerate(used):
        mine = sm == s
        first[i], last[i] = start[mine].min(), end[mine].max()
        # the most programs it ran at once: events swept in time order, ends before starts
        events = sorted([(t, 1) for t in start[mine]] + [(t, -1) for t in end[mine]])
        slots = max(slots, int(np.cumsum([delta for _, delta in events]).max()))
    idle_sms = num_sms - len(used)  # SMs that ran nothing wait the whole span
    span = t1 - t0
    return {"programs": int(len(rows)), "slots_per_sm": slots,
            "span_us": span / 1e3,
            "work_us": float((end - start).sum()) / (num_sms * slots) / 1e3,
            "ramp_us": float((first - t0).sum() + idle_sms * span) / num_sms / 1e3,
            "tail_us": float((t1 - last).sum() + idle_sms * span) / num_sms / 1e3}


def order_summary(rows: Sequence[dict], prompt: int, chunk: int) -> list[dict]:
    """Per order: the chunks' summed device time against the one pass, the fixed cost per
    launch and the rate (launch_split), and the chunks' mean span, work, ramp and tail."""
    out = []
    for order in dict.fromkeys(r["order"] for r in rows):
        mine = [r for r in rows if r["order"] == order]
        one = next((r for r in mine if r["length"] == prompt), None)
        chunks = sorted((r for r in mine if r["length"] == chunk and r["prompt"] == prompt),
                        key=lambda r: r["prefix"])
        if one is None or not chunks:
            continue
        chunk_ms = [r["device_ms"] for r in chunks]
        mean = {k: float(np.mean([r[k] for r in chunks if k in r]))
                for k in ("span_us", "work_us", "ramp_us", "tail_us")}
        out.append({"order": order, "one_pass_ms": one["device_ms"], "chunks_ms": sum(chunk_ms),
                    "chunks_over_one_pass": sum(chunk_ms) / one["device_ms"],
                    **launch_split(prompt, chunk, chunk_ms, one["device_ms"]),
                    **{f"chunk_mean_{k}": v for k, v in mean.items()},
                    **{f"one_pass_{k}": one.get(k) for k in mean}})
    return out


def report(result: dict) -> str:
    lines = [f"{result.get('env', {}).get('gpu', '?')}: one layer, {result['prompt']} tokens,"
             f" in one pass and in chunks of {result['chunk']} (us per launch)"]
    lines.append(f"{'order':<40}{'one pass':>10}{'chunks':>9}{'ratio':>7}{'fixed':>8}"
                 f"{'rate':>7}{'span':>8}{'work':>8}{'ramp':>7}{'tail':>7}  one pass span/work/ramp/tail")
    for s in result["summary"]:
        lines.append(
            f"{s['order']:<40}{s['one_pass_ms']:>8.3f}ms{s['chunks_ms']:>7.3f}ms"
            f"{s['chunks_over_one_pass']:>7.3f}{1e3 * s.get('launch_fixed_ms', float('nan')):>8.1f}"
            f"{s.get('pairs_per_ms', float('nan')) / 1e6:>7.2f}"
            f"{s['chunk_mean_span_us']:>8.1f}{s['chunk_mean_work_us']:>8.1f}"
            f"{s['chunk_mean_ramp_us']:>7.1f}{s['chunk_mean_tail_us']:>7.1f}  "
            + "/".join(f"{s[f'one_pass_{k}']:.0f}" for k in ("span_us", "work_us", "ramp_us",
                                                             "tail_us")))
    lines.append("rate: M (query, key) pairs per ms per head past the fixed cost; span - work:"
                 " what a launch loses to starting and draining its waves")
    return "\n".join(lines)


def measure(prompt: int, chunk: int, reps: int) -> tuple[list[dict], dict]:
    import torch

    from gpu_backend.engine.attention_profile import PagedLayer, device_ms
    from gpu_backend.env import device_environment
    from gpu_backend.kernels import paged_attention
    from gpu_backend.kernels.attention import prefill_config

    num_heads, num_kv_heads, head_dim = HEADS
    torch.manual_seed(0)
    layer = PagedLayer([prompt], num_kv_heads, head_dim)
    q = torch.randn(prompt, num_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    timeline = torch.zeros(3 * 3 * num_kv_heads * (prompt + 64), dtype=torch.int64,
                           device="cuda")  # 3 values x up to 3 splits x tiles x KV heads
    rows = []
    for order, (fields, splits) in VARIANTS.items():
        tile = dataclasses.replace(prefill_config(head_dim), **fields)
        for prefix, length in [(0, prompt)] + chunk_starts(prompt, chunk):
            seq_lens = torch.tensor([prefix + length], dtype=torch.int32, device="cuda")
            qsl = torch.tensor([0, length], dtype=torch.int32, device="cuda")

            def run(line=None, prefix=prefix, length=length, seq_lens=seq_lens, qsl=qsl,
                    tile=tile, splits=splits):
                return paged_attention(q[prefix:prefix + length], layer.k, layer.v, layer.tables,
                                       seq_lens, qsl, head_dim ** -0.5, max_query_len=length,
                                       max_seq_len=prefix + length, num_splits=splits,
                                       tile_config=tile, timeline=line)
            ms = device_ms(run, reps=reps)
            timeline.zero_()
            run(timeline)
            torch.cuda.synchronize()
            stats = launch_stats(timeline.view(-1, 3).cpu().numpy(), num_sms)
            rows.append({"order": order, "prompt": prompt, "prefix": prefix, "length": length,
                         "pairs": causal_pairs(length, prefix), "device_ms": ms, **stats})
            print(f"{order:<40} prefix {prefix:>6} + {length:>6}: {ms:.3f} ms, "
                  + ", ".join(f"{k} {v:.1f}" for k, v in stats.items() if k.endswith("_us")),
                  flush=True)
    return rows, {**device_environment(), "num_sms": num_sms}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--report", type=Path, default=None, metavar="RESULT",
                        help="print a saved result's report (no GPU needed)")
    args = parser.parse_args(argv)
    if args.report is not None:
        try:
            result = json.loads(args.report.read_text())
            print(report(result))
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"{args.report}: not a launch_timeline result ({exc})") from None
        return
    from gpu_backend.env import write_result

    rows, env = measure(PROMPT, CHUNK, args.reps)
    result = {"env": env, "prompt": PROMPT, "chunk": CHUNK, "heads": HEADS, "rows": rows,
              "summary": order_summary(rows, PROMPT, CHUNK)}
    path = write_result(result, args.out, "launch_timeline", env["gpu"])
    print(report(result))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
