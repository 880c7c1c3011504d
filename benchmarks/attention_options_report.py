"""attention_options' report: each row's line, the ratios to SDPA cuDNN's one pass, the chunk
penalties with each launch's fixed cost, and the report of a saved result."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from attention_options_cases import chunk_penalties


def sdpa_cudnn_ms(rows: Sequence[dict], prompt: int) -> float | None:
    """SDPA cuDNN's one pass of `prompt` tokens (its faster correct variant)."""
    times = [r["ms"] for r in rows if r["section"] == "one_pass" and r["prompt"] == prompt
             and r["option"].startswith("sdpa cudnn") and r.get("correct")]
    return min(times) if times else None


def add_ratios(rows: list[dict]) -> None:
    for row in rows:
        base = sdpa_cudnn_ms(rows, row["prompt"])
        if row["section"] != "mixed" and row.get("ms") is not None and base:
            row["ratio_to_sdpa_cudnn"] = row["ms"] / base


def shape_label(row: dict) -> str:
    if row["section"] == "one_pass":
        return f"{row['prompt']}"
    if row["section"] in ("chunked", "split_parts"):
        return f"{row['prompt']} / {row['chunk']}"
    return f"{row['chunk']} @{row['prefix']} + {row['decodes']}"


def format_row(row: dict) -> str:
    def num(key: str, fmt: str) -> str:
        value = row.get(key)
        return format(value, fmt) if value is not None else "-"
    status = ("ok" if row.get("correct") else "WRONG") if "correct" in row else ""
    tail = row.get("error") or status
    return (f"{row['section']:>8} {row['option'][:52]:<52} {shape_label(row):>22} "
            f"{num('ms', '9.3f')} {num('tflops', '7.0f')} {num('ratio_to_sdpa_cudnn', '6.2f')} "
            f"{num('max_abs_err', '8.1e')} {num('host_ms', '7.3f')} {tail}")


def print_report(res: dict) -> None:
    print(f"\n{res['env'].get('gpu')}  torch {res['env'].get('torch')}  "
          f"triton {res['env'].get('triton')}  SPLIT op: {res['lse_op']}  "
          f"cuDNN frontend: {res['cudnn_probe']}")
    print(f"{'section':>8} {'option':<52} {'shape':>22} {'ms':>9} {'TFLOP/s':>7} "
          f"{'x cuDNN':>6} {'max err':>8} {'host ms':>7} status")
    for row in res["rows"]:
        print(format_row(row))
        if row.get("parts_ms"):
            print(" " * 9 + "  ".join(f"{k} {v:.3f}" for k, v in row["parts_ms"].items()))
    print(f"\nchunk penalty ({res['sizes']['prompts'][-1]}-token prompt): sum over chunks / "
          "the option's own one pass, / SDPA cuDNN's one pass")
    for p in res["chunk_penalties"]:
        own, sdpa_ = p["vs_own_one_pass"], p["vs_sdpa_cudnn_one_pass"]
        print(f"  {p['option'][:56]:<56} chunk {p['chunk']:>6} {p['sum_ms']:9.3f} ms  "
              f"{own if own is not None else float('nan'):6.3f}  "
              f"{sdpa_ if sdpa_ is not None else float('nan'):6.3f}")
    split = [p for p in res["chunk_penalties"] if "launch_fixed_ms" in p]
    if split:
        print("\neach chunk's time = a fixed cost per launch + its (query, key) pairs at a rate "
              "(least squares over the chunks), beside the one pass's rate (pairs per head)")
        for p in split:
            one = p["one_pass_pairs_per_ms"]
            print(f"  {p['option'][:56]:<56} chunk {p['chunk']:>6} "
                  f"fixed {1e3 * p['launch_fixed_ms']:6.1f} us  "
                  f"{p['pairs_per_ms'] / 1e6:6.2f} M pairs/ms  one pass "
                  f"{one / 1e6 if one else float('nan'):6.2f}")


def print_saved_report(path: Path) -> None:
    """`print_report` of a result this script wrote, its chunk penalties computed again."""
    try:
        res = json.loads(path.read_text())
        prompt = res["sizes"]["prompts"][-1]
        res["chunk_penalties"] = chunk_penalties(res["rows"], prompt,
                                                 sdpa_cudnn_ms(res["rows"], prompt))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
        sys.exit(f"attention_options: {path}: not a result this script wrote ({error}); "
                 "give a benchmarks/results/attention_options_*.json file")
    print_report(res)
