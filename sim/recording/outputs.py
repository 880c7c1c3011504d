"""Output pieces shared by the simulator, the GPU engine and validation (imports no simpy).

Both executors record with `sim.recording.metrics.ReplicaRecorder`; these helpers turn a run into the
same labels, configuration fields and CSV files whichever executor produced it.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sim.core.elastic import Policy
from sim.core.engine_config import EngineConfig, EngineCore
from sim.core.request import RequestState
from sim.recording.folder import atomic_path
from sim.recording.metrics import TIMELINE_COLUMNS, ReplicaRecorder, request_table, timeline_array


def run_label(config: EngineConfig) -> str:
    return f"{config.policy.value}/chunk={config.chunk_tokens}"


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")


def config_fields(core: EngineCore, num_replicas: int = 1) -> dict:
    """The configuration columns every summary carries, next to its metrics."""
    e, plan = core.config, core.plan
    return {
        "policy": e.policy.value, "drain": e.drain.value, "chunk": e.chunk_tokens,
        "model": e.model.name, "gpu": e.gpu.name, "tensor_parallel_size": e.tensor_parallel_size,
        "num_replicas": num_replicas, "max_num_seqs": e.num_seqs,
        "block_size": e.block_size, "vmm_handle_bytes": e.vmm_handle_bytes,
        "kv_capacity_tokens": plan.kv_capacity_tokens,
        "kv_capacity_lent_tokens": core.kv_capacity_tokens,
        "activation_reserve_bytes": plan.activation_reserve_bytes,
        "reserve_share": plan.reserve_share,
    }


def write_request_csv(path: Path, requests: Sequence[RequestState]) -> None:
    """One row per request (REQUEST_COLUMNS), written whole or not at all."""
    table = request_table(requests)
    columns = list(table)
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(zip(*(table[c].tolist() for c in columns)))


def write_timeline_csv(path: Path, recorders: Sequence[ReplicaRecorder],
                       extra: dict[str, np.ndarray] | None = None) -> None:
    """One row per recorded step (or decode run): replica, TIMELINE_COLUMNS, then `extra`;
    written whole or not at all."""
    rows = [np.column_stack([np.full(len(rec.timeline), rec.replica_id), timeline_array(rec)])
            for rec in recorders]
    data = np.concatenate(rows) if rows else np.zeros((0, len(TIMELINE_COLUMNS) + 1))
    names: tuple[str, ...] = ("replica", *TIMELINE_COLUMNS)
    for name, column in (extra or {}).items():
        data = np.column_stack([data, np.asarray(column, dtype=np.float64)[:len(data)]])
        names += (name,)
    with atomic_path(path) as tmp:
        np.savetxt(tmp, data, delimiter=",", header=",".join(names), comments="", fmt="%.9g")


def parse_policies(text: str) -> list[Policy]:
    """`static,elastic` or `all` -> policies, with a clear error for unknown names."""
    if text.strip().lower() == "all":
        return list(Policy)
    return [Policy.parse(name) for name in text.split(",") if name.strip()]


def parse_int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} values must be positive integers, got {text!r}")
    return values
