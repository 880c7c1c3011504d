"""engine_bench's report: the excess chunk penalty of each chunk-size point and the
attention's part of it, and the printed report of a result."""

from __future__ import annotations

from engine_bench_cases import DECODE_CONTEXT

PENALTY_CHUNK, PENALTY_TARGET = 2048, 0.02  # the excess chunk penalty at this chunk, at most


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
    """The other backends' prefills, each backend's new-shape steps and activation profile,
    and SPLIT's plans built up front."""
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


def print_steps(res: dict, backends: list[str]) -> None:
    """The rates the rooflines divide by, the decode step and the 16k prefill."""
    d, p = res["decode"], res["prefill"]
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


def print_curves(res: dict, backends: list[str]) -> None:
    """Each chunk-size curve the result holds, every backend's beside the first's."""
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


def print_penalties(res: dict) -> None:
    """The excess chunk penalties against their target, then the attention's part of them."""
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


def print_fusion(res: dict) -> None:
    """The fusion A/B: each step with the torch layers and with the fused kernels."""
    f = res.get("fusion", {})
    for key, label in (("decode_s", "decode step"), ("chunk512_prefix8192_s", "512-token chunk")):
        if not f:
            break
        print(f"{label}: torch layers {f['unfused'][key] * 1e3:.2f} ms, fused "
              f"{f['fused'][key] * 1e3:.2f} ms ({f[key.removesuffix('_s') + '_speedup']:.2f}x)")


def print_report(res: dict) -> None:
    """The report of a result, in the order engine_bench times its stages."""
    backends = res.get("attention_backends", ["triton"])
    print_steps(res, backends)
    if backends != ["triton"]:
        print_backends(res)
    print_curves(res, backends)
    print_penalties(res)
    print_fusion(res)
