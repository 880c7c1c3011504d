"""``python -m sim memory``: print the per-GPU memory plan for a model, GPU and chunk sizes.

The plan is `plan_memory(config.memory_config())` of the same `EngineConfig` a simulation
builds, so its KV capacity is the one `python -m sim` reports for the same settings.
"""

from __future__ import annotations

import argparse
import json
import sys

from sim.core.catalog import GIB
from sim.core.config_flags import CommandParser, add_engine_flags, engine_configs
from sim.core.engine_config import EngineConfig
from sim.core.memory_plan import MemoryPlan, plan_memory

# The settings a memory plan reads (the rest only change how a run schedules or lends).
MEMORY_SETTINGS = ("model", "gpu", "tensor_parallel_size", "max_num_batched_tokens",
                   "max_num_seqs", "gpu_memory_utilization", "max_model_len", "block_size",
                   "vmm_handle_bytes", "dtype", "kv_cache_dtype", "quantization",
                   "enable_chunked_prefill")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m sim memory",
        description="Per-GPU memory plan (weights, activation reserve, KV pool), as vLLM "
                    "sizes it, for one or more chunk sizes.",
    )
    add_engine_flags(parser, multi=("max_num_batched_tokens",), include=MEMORY_SETTINGS)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def plans(args: argparse.Namespace) -> list[tuple[EngineConfig, MemoryPlan]]:
    return [(config, plan_memory(config.memory_config())) for config in engine_configs(args)]


def _print_table(plans: list[tuple[EngineConfig, MemoryPlan]]) -> None:
    from rich.console import Console
    from rich.table import Table

    first = plans[0][0]
    table = Table(title=f"{first.model.name} on {first.gpu.name}, TP "
                        f"{first.tensor_parallel_size} (per GPU)")
    table.add_column("max_num_batched_tokens")
    for config, _ in plans:
        table.add_column(str(config.chunk_tokens), justify="right")

    def gib(n: int) -> str:
        return f"{n / GIB:.2f} GiB"

    rows = [
        ("max_num_seqs", lambda c, p: f"{c.num_seqs:,}"),
        ("max_model_len", lambda c, p: f"{c.effective_max_model_len:,}"),
        ("total", lambda c, p: gib(p.total_bytes)),
        ("usable (x utilization)", lambda c, p: gib(p.usable_bytes)),
        ("weights", lambda c, p: gib(p.weights_bytes)),
        ("activation reserve", lambda c, p: gib(p.activation_reserve_bytes)),
        ("non-torch", lambda c, p: gib(p.non_torch_bytes)),
        ("KV pool", lambda c, p: gib(p.kv_pool_bytes)),
        ("KV blocks", lambda c, p: f"{p.num_kv_blocks:,}"),
        ("KV capacity (tokens)", lambda c, p: f"{p.kv_capacity_tokens:,}"),
        ("reserve share of KV", lambda c, p: f"{p.reserve_share:.1%}"),
        ("reserve blocks (whole handles)", lambda c, p: f"{p.reserve_blocks:,}"),
        ("decode-step activations", lambda c, p: gib(p.decode_activation_bytes)),
        ("lendable blocks", lambda c, p: f"{p.lendable_blocks:,}"),
    ]
    for label, cell in rows:
        table.add_row(label, *(cell(config, plan) for config, plan in plans))
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        found = plans(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        payload = [{"max_num_batched_tokens": config.chunk_tokens,
                    "max_num_seqs": config.num_seqs,
                    "max_model_len": config.effective_max_model_len, **plan.to_dict()}
                   for config, plan in found]
        print(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2))
    else:
        _print_table(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
