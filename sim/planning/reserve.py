"""The activation reserve as a share of the KV pool, per model, TP degree and chunk size.

Pure memory planning, no simulation. ``reserve_share`` is what `plan_memory` reserves
(forward peak or vLLM's sampler peak, whichever is larger); ``forward_only_share`` is what
it would be if only the forward pass were profiled. The sampler peak (max_num_seqs logit
rows x the full vocabulary, ~36 B per logit) does not shrink with TP, which is why our
share stays near flat across TP while the forward-only share falls roughly as 1/TP.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from sim.core.catalog import GIB, get_gpu, get_model
from sim.core.engine_config import vllm_default_max_num_seqs
from sim.core.memory_plan import MemoryConfig, activation_bytes, plan_memory
from sim.planning.sweep import fit_status

# The published study's figures for a 7B model (chunk and GPU as in its setup).
PUBLISHED_SHARE = {1: 0.16, 4: 0.027}
PUBLISHED_NOTE = ("published: 16% for a 7B model at TP 1, 2.7% at TP 4. Ours counts vLLM's "
                  "sampler peak for max_num_seqs rows (flat in TP), so it shrinks far less; "
                  "the forward-only column is the part that scales like the published one.")


def reserve_rows(models: Sequence[str], gpu: str, tps: Sequence[int], chunks: Sequence[int],
                 max_num_seqs: int | None = None) -> list[dict]:
    """One row per (model, tp, chunk); rows that do not fit have ``fits=False``."""
    gpu_spec = get_gpu(gpu)
    num_seqs = max_num_seqs or vllm_default_max_num_seqs(gpu_spec)
    rows = []
    for name, tp, chunk in itertools.product(models, tps, chunks):
        model = get_model(name)
        row = {"model": model.name, "gpu": gpu_spec.name, "tensor_parallel_size": tp,
               "chunk": chunk, "max_num_seqs": num_seqs}
        try:
            plan = plan_memory(MemoryConfig(model, gpu_spec, tp, chunk, max_num_seqs=num_seqs))
        except ValueError as exc:
            rows.append({**row, "fits": False, "fit_error": str(exc),
                         "status": fit_status(str(exc))})
            continue
        forward = activation_bytes(model, chunk, tp=tp)
        # The KV pool the forward-only reserve would leave: the same bytes, reserve swapped.
        forward_pool = plan.kv_pool_bytes + plan.activation_reserve_bytes - forward
        rows.append({**row, "fits": True, "fit_error": "",
                     "reserve_gib": plan.activation_reserve_bytes / GIB,
                     "kv_pool_gib": plan.kv_pool_bytes / GIB,
                     "reserve_share": plan.reserve_share,
                     "forward_only_share": forward / forward_pool,
                     "published_share": PUBLISHED_SHARE.get(tp) if _is_7b(name) else None})
    return rows


def _is_7b(name: str) -> bool:
    return name.lower() in ("qwen2.5-7b", "mistral-7b", "mistral-7b-v0.3")
