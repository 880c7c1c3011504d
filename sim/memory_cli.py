"""``python -m sim memory``: print the per-GPU memory plan for a model, GPU and chunk sizes."""

from __future__ import annotations

import argparse
import json
import sys

from sim.core.catalog import GIB, GPUS, MODELS, get_gpu, get_model, with_dtype
from sim.core.memory_plan import BLOCK_SIZES, MemoryConfig, MemoryPlan, plan_memory


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so main() returns 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgumentError(message)


def _chunk_list(text: str) -> list[int]:
    try:
        chunks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None
    if not chunks:
        raise argparse.ArgumentTypeError("give at least one chunk size")
    return chunks


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m sim memory",
        description="Per-GPU memory plan (weights, activation reserve, KV pool).",
    )
    parser.add_argument(
        "--model", required=True, help=f"preset ({', '.join(MODELS)}) or path to a HF config.json"
    )
    parser.add_argument("--gpu", required=True, help=f"preset ({', '.join(GPUS)}, or h200)")
    parser.add_argument("--tensor-parallel-size", "--tp", dest="tp", type=int, default=1)
    parser.add_argument(
        "--max-num-batched-tokens",
        "--chunk",
        dest="chunks",
        type=_chunk_list,
        default=[8192],
        help="one or more chunk sizes, comma-separated",
    )
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=16, choices=BLOCK_SIZES)
    parser.add_argument(
        "--dtype", choices=("bf16", "fp16", "fp32"), default=None, help="override the model's dtype"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _plans(args: argparse.Namespace) -> list[tuple[int, MemoryPlan]]:
    model = get_model(args.model)
    if args.dtype is not None:
        model = with_dtype(model, args.dtype)
    gpu = get_gpu(args.gpu)
    plans = []
    for chunk in args.chunks:
        cfg = MemoryConfig(
            model=model,
            gpu=gpu,
            tensor_parallel_size=args.tp,
            max_num_batched_tokens=chunk,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
            block_size=args.block_size,
        )
        plans.append((chunk, plan_memory(cfg)))
    return plans


def _print_table(args: argparse.Namespace, plans: list[tuple[int, MemoryPlan]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.model} on {args.gpu}, TP {args.tp} (per GPU)")
    table.add_column("max_num_batched_tokens")
    for chunk, _ in plans:
        table.add_column(str(chunk), justify="right")

    def gib(n: int) -> str:
        return f"{n / GIB:.2f} GiB"

    rows = [
        ("total", lambda p: gib(p.total_bytes)),
        ("usable (x utilization)", lambda p: gib(p.usable_bytes)),
        ("weights", lambda p: gib(p.weights_bytes)),
        ("activation reserve", lambda p: gib(p.activation_reserve_bytes)),
        ("non-torch", lambda p: gib(p.non_torch_bytes)),
        ("KV pool", lambda p: gib(p.kv_pool_bytes)),
        ("KV blocks", lambda p: f"{p.num_kv_blocks:,}"),
        ("KV capacity (tokens)", lambda p: f"{p.kv_capacity_tokens:,}"),
        ("reserve share of KV", lambda p: f"{p.reserve_share:.1%}"),
        ("reserve blocks (whole handles)", lambda p: f"{p.reserve_blocks:,}"),
        ("decode-step activations", lambda p: gib(p.decode_activation_bytes)),
        ("lendable blocks", lambda p: f"{p.lendable_blocks:,}"),
    ]
    for label, cell in rows:
        table.add_row(label, *(cell(plan) for _, plan in plans))
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        plans = _plans(args)
    except (_ArgumentError, ValueError) as exc:
        print(f"sim memory: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        payload = [{"max_num_batched_tokens": chunk, **plan.to_dict()} for chunk, plan in plans]
        print(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2))
    else:
        _print_table(args, plans)
    return 0


if __name__ == "__main__":
    sys.exit(main())
