"""Builders for the GPU engine's CPU tests (no tests here): a toy core, a tiny model, fakes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpu_backend.engine.inputs import HostBatch
from sim.core.catalog import MIB, GpuSpec, ModelSpec
from sim.core.elastic import DrainStrategy, Policy
from sim.core.engine_config import EngineConfig, EngineCore, build_core
from sim.core.memory_plan import ActivationProfile, plan_memory

TINY = ModelSpec("tiny", num_layers=2, hidden_size=64, intermediate_size=128,
                 num_attention_heads=4, num_kv_heads=2, head_dim=16, vocab_size=256)
TOY_GPU = GpuSpec("toy", memory_bytes=8 * 1024 * MIB, peak_bf16_flops=1e12,
                  memory_bandwidth_bytes_s=1e11, interconnect_bytes_s=1e10,
                  vmm_granularity_bytes=2 * MIB)
# reserve at 64 tokens = 0.5 + 64 x 256 KiB = 16.5 MiB; lent in 2 MiB handles of 4 KiB blocks
PROFILE = ActivationProfile(bytes_per_token=256 * 1024, fixed_bytes=MIB // 2, non_torch_bytes=0)


def toy_config(policy: Policy = Policy.STATIC, drain: DrainStrategy = DrainStrategy.PREEMPT,
               **changes) -> EngineConfig:
    base = EngineConfig(TINY, TOY_GPU, max_num_batched_tokens=64, max_num_seqs=8,
                        gpu_memory_utilization=0.9, max_model_len=256, block_size=16,
                        policy=policy, drain=drain, vmm_handle_bytes=2 * MIB,
                        reclaim="release", async_scheduling=False)
    # the fake runners' clocks in these tests are worked for synchronous steps; the async
    # cases (tests/test_engine_async.py) pass async_scheduling=True
    return replace(base, **changes)


def toy_core(config: EngineConfig, num_kv_blocks: int = 48) -> EngineCore:
    plan = plan_memory(config.memory_config(), PROFILE)
    plan = replace(plan, num_kv_blocks=num_kv_blocks,
                   kv_capacity_tokens=num_kv_blocks * config.block_size)
    return build_core(config, profile=PROFILE, plan=plan)


class FakeTimer:
    """A clock the fake runner advances: every executed step takes `step_s`."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class TickTimer:
    """Each call moves time on by `tick_s`, so every engine step lasts exactly `tick_s`."""

    def __init__(self, tick_s: float = 1.0) -> None:
        self.t, self.tick_s = 0.0, tick_s

    def __call__(self) -> float:
        self.t += self.tick_s
        return self.t


def prefill_of_request_one(batch: HostBatch) -> bool:
    """A FakeRunner `fail_when`: the steps that prefill request 1."""
    return 1 in batch.request_ids and batch.max_query_len > 1


class FakeRunner:
    """Samples (last input id + 1) % vocab for each sampled row; can raise on chosen steps.

    `execute` takes `step_s` of the timer. `launch` models a device queue: the host spends
    `host_s` launching, the device runs each step for `step_s` once the host has launched it
    and the step before has ended, and `collect` waits until then; a launched step's `done_t`
    is that end, as the device's timer dates it. `slow_launch(batch)` says which launches take
    `host_s` (None: all of them). A launched step's pending input ids come from the ids of the
    step given as `after` (as the device gather does)."""

    graphs = None

    def __init__(self, timer: FakeTimer | None = None, step_s: float = 1.0,
                 fail_when=None, host_s: float = 0.0, slow_launch=None) -> None:
        self.timer, self.step_s, self.fail_when, self.host_s = timer, step_s, fail_when, host_s
        self.slow_launch = slow_launch
        self.batches: list[HostBatch] = []
        self._device_free_t = 0.0

    def _ids(self, batch: HostBatch) -> np.ndarray:
        self.batches.append(batch)
        if self.fail_when is not None and self.fail_when(batch):
            raise MemoryError("fake out of memory")
        return (batch.input_ids[batch.logits_indices] + 1) % TINY.vocab_size

    def execute(self, batch: HostBatch) -> np.ndarray:
        if self.timer is not None:
            self.timer.t += self.step_s
        return self._ids(batch)

    def launch(self, batch: HostBatch, after: FakeLaunched | None = None) -> FakeLaunched:
        if batch.pending_rows.size:
            assert after is not None, "pending input ids need the step launched before"
            batch = replace(batch, input_ids=batch.input_ids.copy())
            batch.input_ids[batch.pending_rows] = after.ids[batch.pending_sources]
        ids = self._ids(batch)
        now = 0.0
        if self.timer is not None:
            if self.slow_launch is None or self.slow_launch(batch):
                self.timer.t += self.host_s
            now = self.timer.t
        self._device_free_t = max(now, self._device_free_t) + self.step_s
        return FakeLaunched(ids, self._device_free_t, self.timer)


class FakeLaunched:
    def __init__(self, ids: np.ndarray, done_t: float, timer: FakeTimer | None) -> None:
        self.ids, self.done_t, self.timer = ids, done_t, timer
        self.phases = None

    def collect(self) -> np.ndarray:
        if self.timer is not None:
            self.timer.t = max(self.timer.t, self.done_t)
        return self.ids


def tiny_cpu_model():
    """The tiny model on CPU (torch attention), built on one thread: its matmuls are too small
    to share, and on a busy 2-core machine two threads made each of them 10x slower. A
    generator for a fixture: the thread count comes back after."""
    import torch

    from gpu_backend.model import build_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield build_model(TINY, "cpu", torch.float32, attention_backend="torch", max_position=256,
                      seed=1)
    torch.set_num_threads(threads)
