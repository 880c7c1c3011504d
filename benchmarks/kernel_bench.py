"""Paged-attention kernel benchmark on one GPU (Llama-3.1-8B attention shapes).

* decode: time per step (CUDA-graph replay, as the engine runs decode) against the
  memory roofline, KV bytes / bandwidth of a large device-to-device copy, for batches of
  one context and skewed ones (one long sequence among short ones), with the per-step split
  plan and with the earlier even split (only when the batch leaves SMs idle) for comparison;
* prefill: a 16,384-token prompt in one pass, and in chunks of 512..8192 tokens each
  attending over the cached prefix; the sum over chunks / one pass should be ~1.0-1.1
  (chunking must not inflate attention cost). torch SDPA causal is the reference. The
  tile candidates (PREFILL_TILES) are timed on the one pass and on two chunk sizes.

Usage: python benchmarks/kernel_bench.py [--out PATH] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_backend.engine.attention_profile import device_ms as time_ms  # noqa: E402
from gpu_backend.env import (  # noqa: E402
    copy_bandwidth_bytes_s,
    device_environment,
    write_result,
)
from gpu_backend.kernels import paged_attention  # noqa: E402
from gpu_backend.kernels.attention import (  # noqa: E402
    DecodePlan,
    TileConfig,
    choose_num_splits,
    plan_decode_splits,
)

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
DTYPE = torch.bfloat16
# (label, contexts): uniform batches, then one long sequence among short ones
DECODE_CASES = [
    ("64x1024", [1024] * 64),
    ("32x4096", [4096] * 32),
    ("128x4096", [4096] * 128),
    ("8x4096", [4096] * 8),
    ("31x1024+1x16384", [1024] * 31 + [16384]),
    ("20x12000", [12000] * 20),
    ("63x512+1x32768", [512] * 63 + [32768]),
    ("128x1024+1x8192", [1024] * 128 + [8192]),
    # contexts spread as in a replay's decode steps (200..3000 keys)
    ("40x200..3000", [200 + i * 2800 // 39 for i in range(40)]),
]
PREFILL_TOKENS = 16384
CHUNK_SIZES = [512, 1024, 2048, 4096, 8192]
# prefill tile candidates against the default (prefill_config): the default spills registers
# on sm_90 (benchmarks/kernel_sass.py); these compile without spills
PREFILL_TILES = [TileConfig(128, 128, 8, 3), TileConfig(128, 64, 8, 3),
                 TileConfig(128, 64, 4, 3), TileConfig(64, 64, 4, 3)]
TILE_CHUNKS = [512, 2048]
PLAN_WAVES = [2, 3, 4, 6]  # decode plan targets timed beside the default
def copy_bandwidth_gbps() -> float:
    return copy_bandwidth_bytes_s() / 1e9


def make_cache(num_tokens_per_seq: list[int]) -> tuple[torch.Tensor, ...]:
    """Random paged K/V (strided views of a 2-layer pool) with shuffled block tables."""
    blocks = [triton.cdiv(n, BLOCK_SIZE) for n in num_tokens_per_seq]
    num_blocks = sum(blocks)
    # pool: [num_blocks, layers=2, k/v, block_size, KVH, D]
    pool = torch.randn(num_blocks, 2, 2, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device="cuda",
                       dtype=DTYPE)
    perm = torch.randperm(num_blocks, device="cuda").int()
    block_tables = torch.zeros(len(blocks), max(blocks), dtype=torch.int32, device="cuda")
    used = 0
    for i, n in enumerate(blocks):
        block_tables[i, :n] = perm[used:used + n]
        used += n
    return pool[:, 1, 0], pool[:, 1, 1], block_tables


def bench_decode(label: str, contexts: list[int], bandwidth_gbps: float) -> dict:
    batch = len(contexts)
    k_cache, v_cache, block_tables = make_cache(contexts)
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    seq_lens = torch.tensor(contexts, dtype=torch.int32, device="cuda")
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    # As the engine's graphs: captured with max_seq_len = max_model_len (32k here).
    even = choose_num_splits(batch * NUM_KV_HEADS, 32768, q.device)

    def graph_ms(step) -> float:
        step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return time_ms(graph.replay, reps=50)

    def make_plan(waves: int | None = None) -> DecodePlan:
        return plan_decode_splits(seq_lens, NUM_KV_HEADS, target_waves=waves)

    def attention(num_splits: int | None = None, plan: DecodePlan | None = None,
                  waves: int | None = None):
        return lambda: paged_attention(
            q, k_cache, v_cache, block_tables, seq_lens, qsl, HEAD_DIM ** -0.5,
            max_query_len=1, max_seq_len=32768, num_splits=num_splits,
            plan=plan if plan is not None or waves is None else make_plan(waves))

    ms, even_ms = graph_ms(attention()), graph_ms(attention(even))
    # the plan's target programs per SM (default DECODE_TARGET_WAVES) against others
    waves_ms = {w: graph_ms(attention(waves=w)) for w in PLAN_WAVES}
    # Where the plan's time goes (the engine makes the plan once per step, not per layer):
    # attention + merge with a plan made outside the graph, and the plan kernel alone.
    outside_ms, plan_ms = graph_ms(attention(plan=make_plan())), graph_ms(make_plan)
    kv_bytes = 2 * sum(contexts) * NUM_KV_HEADS * HEAD_DIM * DTYPE.itemsize
    roofline_ms = kv_bytes / bandwidth_gbps / 1e6
    return {"case": label, "batch": batch, "context": sum(contexts) // batch,
            "longest": max(contexts), "ms": ms, "roofline_ms": roofline_ms,
            "achieved_gbps": kv_bytes / ms / 1e6, "fraction_of_roofline": roofline_ms / ms,
            "even_split": even, "even_split_ms": even_ms,
            "even_split_fraction_of_roofline": roofline_ms / even_ms,
            "plan_made_outside_ms": outside_ms, "plan_kernel_ms": plan_ms,
            "plan_waves_ms": {str(w): t for w, t in waves_ms.items()}}


def causal_tflops(num_new: int, prefix: int, ms: float) -> float:
    visible_pairs = num_new * prefix + num_new * (num_new + 1) / 2
    return 4 * HEAD_DIM * NUM_HEADS * visible_pairs / ms / 1e9


def bench_prefill(total: int) -> dict:
    k_cache, v_cache, block_tables = make_cache([total])
    q_all = torch.randn(total, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)

    def chunk_ms(prefix: int, num_new: int, tile: TileConfig | None = None) -> float:
        q = q_all[prefix:prefix + num_new]
        seq_lens = torch.tensor([prefix + num_new], dtype=torch.int32, device="cuda")
        qsl = torch.tensor([0, num_new], dtype=torch.int32, device="cuda")
        return time_ms(lambda: paged_attention(
            q, k_cache, v_cache, block_tables, seq_lens, qsl, HEAD_DIM ** -0.5,
            max_query_len=num_new, max_seq_len=prefix + num_new, tile_config=tile), reps=7)

    def chunked_ms(chunk: int, tile: TileConfig | None = None) -> float:
        return sum(chunk_ms(p, min(chunk, total - p), tile) for p in range(0, total, chunk))

    one_pass_ms = chunk_ms(0, total)
    result = {"tokens": total, "one_pass_ms": one_pass_ms,
              "one_pass_tflops": causal_tflops(total, 0, one_pass_ms), "chunked": []}
    for chunk in CHUNK_SIZES:
        sum_ms = chunked_ms(chunk)
        result["chunked"].append({"chunk": chunk, "sum_ms": sum_ms,
                                  "ratio_to_one_pass": sum_ms / one_pass_ms})
    result["tiles"] = [
        {"tile": f"{t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages}",
         "one_pass_ms": chunk_ms(0, total, t),
         **{f"chunk{c}_sum_ms": chunked_ms(c, t) for c in TILE_CHUNKS}}
        for t in PREFILL_TILES]
    # torch SDPA (flash backend) on the same prompt, K/V expanded to all heads.
    q = q_all.transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
    k = torch.randn(1, NUM_HEADS, total, HEAD_DIM, device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    result["sdpa_causal_ms"] = time_ms(lambda: sdpa(q, k, v, is_causal=True), reps=10)
    return result


def environment() -> dict:
    return {**device_environment(), "shapes": {
        "num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM,
        "block_size": BLOCK_SIZE, "dtype": str(DTYPE)}}


def print_report(res: dict) -> None:
    print(f"{res['env']['gpu']}  torch {res['env']['torch']}  triton {res['env']['triton']}")
    print(f"copy bandwidth: {res['copy_bandwidth_gbps']:.0f} GB/s")
    print(f"{'decode batch':>18} {'ms':>8} {'roofline':>9} {'GB/s':>7} {'frac':>5} "
          f"{'even split ms':>14} {'frac':>5} {'plan outside':>12} {'plan alone':>10} "
          + " ".join(f"{f'{w}/SM ms':>8}" for w in PLAN_WAVES))
    for d in res["decode"]:
        print(f"{d['case']:>18} {d['ms']:>8.4f} {d['roofline_ms']:>9.4f} "
              f"{d['achieved_gbps']:>7.0f} {d['fraction_of_roofline']:>5.2f} "
              f"{d['even_split_ms']:>14.4f} {d['even_split_fraction_of_roofline']:>5.2f} "
              f"{d['plan_made_outside_ms']:>12.4f} {d['plan_kernel_ms']:>10.4f} "
              + " ".join(f"{d['plan_waves_ms'][str(w)]:>8.4f}" for w in PLAN_WAVES))
    p = res["prefill"]
    print(f"prefill {p['tokens']} tokens: one pass {p['one_pass_ms']:.2f} ms "
          f"({p['one_pass_tflops']:.0f} TFLOP/s), torch SDPA causal {p['sdpa_causal_ms']:.2f} ms")
    print(f"{'chunk':>8} {'sum ms':>9} {'ratio':>6}")
    for c in p["chunked"]:
        print(f"{c['chunk']:>8} {c['sum_ms']:>9.2f} {c['ratio_to_one_pass']:>6.2f}")
    print(f"{'prefill tile':>16} {'one pass ms':>12} "
          + " ".join(f"{f'chunk {c} ms':>14}" for c in TILE_CHUNKS))
    for t in p["tiles"]:
        print(f"{t['tile']:>16} {t['one_pass_ms']:>12.2f} "
              + " ".join(f"{t[f'chunk{c}_sum_ms']:>14.2f}" for c in TILE_CHUNKS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="prefill 4096 tokens only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kernel_bench needs a CUDA GPU")
    torch.manual_seed(0)
    bandwidth = copy_bandwidth_gbps()
    res = {"env": environment(), "copy_bandwidth_gbps": bandwidth,
           "decode": [bench_decode(label, c, bandwidth) for label, c in DECODE_CASES],
           "prefill": bench_prefill(4096 if args.quick else PREFILL_TOKENS)}
    print_report(res)
    print(f"wrote {write_result(res, args.out, 'kernels', res['env']['gpu'])}")


if __name__ == "__main__":
    main()
