"""The GPU TP path (per-rank measurement, agreed plan, launch's rank function and rank 0's
outputs) on CPU: gloo, 2 processes, torch.cuda's memory queries stubbed to zero use."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from test_engine_helpers import toy_config
from test_engine_smoke import REQUESTS

from gpu_backend.tp.group import TpGroup, spawn_ranks
from sim.core.elastic import Policy

pytestmark = pytest.mark.skipif(not torch.distributed.is_gloo_available(),
                                reason="torch.distributed has no gloo backend in this build")
TOTAL_BYTES = 8 << 30


def stub_cuda() -> None:
    """Only in the spawned ranks: CPU stand-ins for the CUDA memory calls setup makes."""
    import gpu_backend.tp.setup as setup
    from gpu_backend.tp.shard import build_tp_model

    cuda = torch.cuda
    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        setattr(cuda, name, lambda *a, **k: None)
    for name in ("memory_reserved", "memory_allocated", "max_memory_allocated"):
        setattr(cuda, name, lambda *a, **k: 0)
    cuda.mem_get_info = lambda *a, **k: (TOTAL_BYTES, TOTAL_BYTES)
    cuda.get_device_name = lambda *a, **k: "cpu-stub"
    setup.device_used_bytes = lambda device: 0

    def cpu_model(*args, **kwargs):
        kwargs.update(dtype=torch.float32, attention_backend="torch", max_position=256)
        return build_tp_model(*args, **kwargs)

    setup.build_tp_model = cpu_model


def launch_rank(group: TpGroup, out_dir: str) -> None:
    torch.set_num_threads(1)
    stub_cuda()
    from gpu_backend.tp.launch import replay_rank

    args = argparse.Namespace(seed=0, no_graphs=True, max_kv_blocks=40, out=out_dir,
                              trace="unit", format=None, limit=None, window=None,
                              rate_scale=1.0)
    replay_rank(group, args, toy_config(Policy.STATIC), REQUESTS, "unit")


def test_launch_rank_writes_tp2_outputs(tmp_path):
    spawn_ranks(launch_rank, 2, str(tmp_path), backend="gloo")
    run = json.loads((tmp_path / "summary.json").read_text())["runs"][0]
    assert run["tensor_parallel_size"] == 2 and run["num_finished"] == len(REQUESTS)
    ranks = run["measured"]["tp_ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["kv_blocks"] == ranks[1]["kv_blocks"] == run["measured"]["kv_blocks"]
    # TINY at TP 2 holds one of its two KV heads per GPU: a 16-token block is half the bytes
    assert ranks[0]["kv_block_bytes"] == 16 * 2 * 2 * 1 * 16 * 2
    assert run["measured"]["total_bytes"] == TOTAL_BYTES
    assert (tmp_path / "steps.csv").exists()
