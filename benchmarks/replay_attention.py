"""A replay's own attention launches, timed alone on the GPU, against the cost model.

Decode steps of the Mooncake replays ran 6-16% slower than predicted where 17-22 rows held
200-250k keys (Llama-3.2-3B: 7.7 ms at 16 rows and 173k keys, 9.1 ms at 17 rows and the same
keys), and their chunk-2048 mixed steps ~10%. This takes a replay folder, rebuilds each step's decode
rows (validation.decode_rows), picks steps spread over the decode-only and mixed ones, and
times one layer's attention of each as the engine launches it (decode: a CUDA graph of the
split plan and merge; mixed: decode rows first, then the chunk, eager), with the model's
heads, on shuffled blocks. Beside it: the replay's measured step (device span) and the
cost model's attention for one layer (with --calibration). Decode steps are timed on their own
rows and padded as the engine pads them to its decode graph's size (rows of one key: before the
split plan stopped counting those, 17 rows padded to 32 took a second wave); the plan is also
timed at other programs per SM and the rows in reverse order, to tell the plan's balance from
the order programs start in.

Usage: python benchmarks/replay_attention.py RUN_DIR [RUN_DIR ...] [--calibration CAL]
       [--decode-steps 24] [--mixed-steps 12] [--out PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_backend.engine.attention_profile import PagedLayer, device_ms, launch_ms  # noqa: E402
from gpu_backend.engine.shapes import StepShape, scheduler_output  # noqa: E402
from gpu_backend.env import device_environment, write_result  # noqa: E402
from gpu_backend.kernels import paged_attention  # noqa: E402
from gpu_backend.kernels.attention import plan_decode_splits  # noqa: E402
from sim.core.calibration import load_efficiency  # noqa: E402
from sim.core.cost_model import CostModel, padded_batch  # noqa: E402
from validation.decode_rows import decode_rows, rebuilt_share  # noqa: E402
from validation.runs import engine_config, load_run  # noqa: E402
from validation.step_table import StepTable  # noqa: E402

DTYPE = torch.bfloat16
WAVES = (2, 8)  # the plan's programs per SM beside the default (DECODE_TARGET_WAVES, 4)


def spread(indices: np.ndarray, key: np.ndarray, count: int) -> np.ndarray:
    """`count` of `indices` evenly spaced in the order of `key` (all when fewer)."""
    if len(indices) <= count:
        return indices
    ordered = indices[np.argsort(key[indices], kind="stable")]
    return ordered[np.linspace(0, len(ordered) - 1, count).round().astype(int)]


def decode_graph_ms(seq: list[int], heads: int, kv_heads: int, head_dim: int,
                    waves: int | None) -> float:
    """Milliseconds of one decode attention (plan, attention, merge) over rows of `seq`
    keys, replayed as a CUDA graph; `waves`: the plan's programs per SM (None: default)."""
    layer = PagedLayer(seq, kv_heads, head_dim)
    q = torch.randn(len(seq), heads, head_dim, device="cuda", dtype=DTYPE)
    seq_lens = torch.tensor(seq, dtype=torch.int32, device="cuda")
    qsl = torch.arange(len(seq) + 1, dtype=torch.int32, device="cuda")

    def step() -> None:
        plan = plan_decode_splits(seq_lens, kv_heads, target_waves=waves)
        paged_attention(q, layer.k, layer.v, layer.tables, seq_lens, qsl, head_dim ** -0.5,
                        max_query_len=1, plan=plan)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return device_ms(graph.replay, reps=30)


def time_decode(lengths: np.ndarray, heads: int, kv_heads: int, head_dim: int,
                graph_rows: int | None) -> dict:
    """One decode step's attention on its rows, padded as the engine pads it to its decode
    graph's `graph_rows` (rows of one key; None: no graph holds it), at other plan targets,
    and with the rows in reverse order."""
    seq = [int(n) for n in lengths]  # steps.csv's contexts: the sequence after the step
    padded = seq + [1] * ((graph_rows or len(seq)) - len(seq))
    out = {"ms": decode_graph_ms(seq, heads, kv_heads, head_dim, None),
           "padded_ms": decode_graph_ms(padded, heads, kv_heads, head_dim, None),
           "graph_rows": len(padded),
           "reversed_ms": decode_graph_ms(seq[::-1], heads, kv_heads, head_dim, None)}
    for w in WAVES:
        out[f"waves{w}_ms"] = decode_graph_ms(seq, heads, kv_heads, head_dim, w)
    return out


def time_mixed(lengths: np.ndarray, chunks: list[tuple[int, int]], heads: int, kv_heads: int,
               head_dim: int) -> dict:
    """One mixed step's attention: decode rows first, then each chunk, one eager launch
    (as the profile times its grid's, gpu_backend.engine.attention_profile.launch_ms)."""
    shape = StepShape("mixed", tuple(chunks), tuple(int(n) for n in lengths))
    return {"ms": launch_ms(shape, heads, kv_heads, head_dim)}


def predicted_ms(cost: CostModel | None, lengths: np.ndarray, chunks: list[tuple[int, int]],
                 layers: int) -> float | None:
    """The cost model's attention of one layer for these rows (None without a calibration):
    CostModel.step on the step's SchedulerOutput."""
    if cost is None:
        return None
    kind = "mixed" if chunks else "decode"
    out = scheduler_output(StepShape(kind, tuple(chunks), tuple(int(n) for n in lengths)))
    return 1e3 * cost.step(out).attention_s / layers


def bench_run(folder: Path, calibration: Path | None, decode_steps: int,
              mixed_steps: int) -> dict:
    run = load_run(folder)
    config = engine_config(run.summary)
    model = config.model
    heads, kv_heads, head_dim = model.num_attention_heads, model.num_kv_heads, model.head_dim
    cost = None
    if calibration is not None:
        cost = CostModel(config.model, config.gpu, 1, load_efficiency(calibration))
    steps = run.steps
    if run.requests is None:
        raise ValueError(f"{folder}: no requests CSV; the decode rows cannot be rebuilt")
    rows = decode_rows(steps, run.requests)
    rebuilt = np.array([r is not None for r in rows])
    decode_only = np.nonzero(rebuilt & (steps.num_prefill_tokens == 0)
                             & (steps.num_decode_tokens > 0))[0]
    mixed = np.nonzero(rebuilt & (steps.num_prefill_tokens > 0) & (steps.num_decode_tokens > 0))[0]
    device = steps.extra.get("device_s", steps.duration_s)
    cases = []
    for kind, picked in (("decode", spread(decode_only, steps.decode_context_tokens, decode_steps)),
                         ("mixed", spread(mixed, steps.decode_context_tokens, mixed_steps))):
        for i in picked:
            lengths = rows[i]
            assert lengths is not None  # picked among the rebuilt
            chunks = _chunks(steps, i)
            timed = (time_decode(lengths, heads, kv_heads, head_dim,
                                 padded_batch(len(lengths), config.cuda_graph_sizes))
                     if kind == "decode"
                     else time_mixed(lengths, chunks, heads, kv_heads, head_dim))
            cases.append({
                "kind": kind, "step": int(i), "decode_rows": len(lengths),
                "decode_keys": int(lengths.sum()), "longest": int(lengths.max()),
                "chunks": chunks, "measured_step_ms": 1e3 * float(device[i]),
                "predicted_layer_ms": predicted_ms(cost, lengths, chunks, model.num_layers),
                "layers": model.num_layers, **timed,
            })
            torch.cuda.empty_cache()
    return {"run": str(folder), "model": config.model.name,
            "rebuilt_share": rebuilt_share(rows, steps), "cases": cases}


def _chunks(steps: StepTable, i: int) -> list[tuple[int, int]]:
    """Step i's prefill chunks (new tokens, prefix) as steps.csv recorded them; one chunk
    without a prefix when the replay did not record them."""
    if not steps.num_prefill_tokens[i]:
        return []
    if steps.prefill_chunks is None:
        return [(int(steps.num_prefill_tokens[i]), 0)]
    return list(steps.prefill_chunks[i])


def print_report(res: dict) -> None:
    for run in res["runs"]:
        print(f"{run['run']} ({run['model']}), rows rebuilt for {run['rebuilt_share']:.1%} of steps")
        print(f"{'kind':>6} {'rows':>5} {'keys':>8} {'longest':>7} {'chunk':>12} {'layer ms':>9} "
              f"{'x layers':>9} {'step ms':>8} {'pred ms':>8} {'err':>6} "
              + " ".join(f"{f'w{w} ms':>8}" for w in WAVES) + f" {'rev ms':>7} {'padded':>7} {'rows':>4}")
        for c in run["cases"]:
            pred = c["predicted_layer_ms"]
            err = f"{pred / c['ms'] - 1:+.0%}" if pred else "-"
            chunk = ";".join(f"{n}:{p}" for n, p in c["chunks"]) or "-"
            extra = " ".join(f"{c.get(f'waves{w}_ms', float('nan')):>8.4f}" for w in WAVES)
            print(f"{c['kind']:>6} {c['decode_rows']:>5} {c['decode_keys']:>8} {c['longest']:>7} "
                  f"{chunk:>12} {c['ms']:>9.4f} {c['ms'] * c['layers']:>9.2f} "
                  f"{c['measured_step_ms']:>8.2f} {pred or float('nan'):>8.4f} {err:>6} {extra} "
                  f"{c.get('reversed_ms', float('nan')):>7.4f} "
                  f"{c.get('padded_ms', float('nan')):>7.4f} {c.get('graph_rows', 0):>4}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="replay folders (summary.json, "
                        "steps.csv, requests CSV)")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="calibration JSON: adds the cost model's attention per layer")
    parser.add_argument("--decode-steps", type=int, default=24)
    parser.add_argument("--mixed-steps", type=int, default=12)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("replay_attention needs a CUDA GPU")
    torch.manual_seed(0)
    res = {"env": device_environment(),
           "runs": [bench_run(f, args.calibration, args.decode_steps, args.mixed_steps)
                    for f in args.runs]}
    print_report(res)
    print(f"wrote {write_result(res, args.out, 'replay_attention', res['env']['gpu'])}")


if __name__ == "__main__":
    main()
