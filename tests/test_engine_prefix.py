"""Prefix caching on the GPU engine, on CPU: the tiny model (torch attention) over a tensor
KV store. A request whose prefix another request cached must sample what it samples with
prefix caching off (same logits, same tokens) while the engine computes only its uncached
tokens, synchronously and under async scheduling; preemption, migration and finishing must
leave shared blocks intact."""

from __future__ import annotations

import pytest
import torch
from test_engine_async import run as run_async_engine
from test_engine_helpers import TickTimer, tiny_cpu_model, toy_config, toy_core

from gpu_backend.engine.clocks import VirtualClock
from gpu_backend.engine.replay import engine_summary, replay
from gpu_backend.engine.setup import assemble_engine, plain_store
from sim.core.elastic import DrainStrategy, Policy
from sim.core.request import RequestState
from traces import Request

HASH = 32  # prompt tokens per trace hash: two KV blocks of 16
# Request 0 caches hashes 1-3 (six full blocks of its 100 tokens); 1 and 2 arrive while it
# decodes, 3 after it finished (its blocks wait in the cache, free). Expected hits, by hand:
#   1: 90 tokens, hashes 1 2 3 -> full blocks 0-4 all cached by request 0  -> 80 tokens
#   2: 70 tokens, hashes 1 9 10 -> blocks 0-1 under hash 1                  -> 32 tokens
#   3: 120 tokens, hashes 1 2 3 4 -> blocks 0-5 (block 6 was partial in 0)  -> 96 tokens
#   4: 40 tokens, no hashes                                                  ->  0 tokens
SHARED = [Request(0, 0.0, 100, 12, (1, 2, 3, 4)), Request(4, 0.0, 40, 8),
          Request(1, 4.0, 90, 9, (1, 2, 3)), Request(2, 4.0, 70, 7, (1, 9, 10)),
          Request(3, 40.0, 120, 6, (1, 2, 3, 4))]  # in arrival order, as replay() takes them
EXPECTED_CACHED = {0: 0, 1: 80, 2: 32, 3: 96, 4: 0}
# Two shared stems (hash 0 or 1: the first 32 tokens). Four decodes outgrow a pool of 12
# blocks: the static pool preempts, the elastic one lends blocks; when request 0 finishes,
# 4 and 5 (hitting the stems) make the reserve come back, by migration or preemption.
CROWD = [Request(0, 0.0, 48, 8, (0, 10)), Request(1, 0.0, 48, 30, (0, 11)),
         Request(2, 0.0, 48, 30, (1, 12)), Request(3, 0.0, 48, 30, (1, 13)),
         Request(4, 20.0, 40, 6, (0, 14)), Request(5, 20.0, 40, 6, (1, 15))]


@pytest.fixture(scope="module")
def model():
    yield from tiny_cpu_model()


class LogitsTap:
    """Stands in for the model in the runner: the same forward, keeping each sampled row's
    logits by (request, tokens known before it); also notes how many requests shared a block."""

    def __init__(self, model, mirror) -> None:
        self.model, self.mirror = model, mirror
        self.logits: dict[tuple[int, int], torch.Tensor] = {}
        self.request_ids: list[int] = []
        self.max_ref_count = 0  # most requests sharing one block at any step

    def __call__(self, batch, kv_caches):
        logits = self.model.compute_logits(batch, kv_caches)  # [R, vocab]
        for request_id, row in zip(self.request_ids, logits, strict=True):
            self.logits[(request_id, len(self.mirror.tokens[request_id]))] = row.clone()
        return logits.argmax(dim=-1)


def run(model, requests, caching: bool, policy=Policy.STATIC, drain=DrainStrategy.PREEMPT,
        num_kv_blocks=200):
    config = toy_config(policy, drain, enable_prefix_caching=caching, hash_block_tokens=HASH)
    core = toy_core(config, num_kv_blocks)
    engine = assemble_engine(core, model, plain_store(core, "cpu", torch.float32),
                             torch.device("cpu"), None, seed=3)
    engine.mirror.keep_outputs = True
    engine.timer = TickTimer(1.0)
    tap = LogitsTap(model, engine.mirror)
    engine.runner.model = tap
    execute, pool = engine.runner.execute, core.scheduler.pool

    def tapped(batch):
        tap.request_ids = batch.sample_request_ids
        shared = max(pool.ref_count(b) for b in range(pool.num_usable_blocks))
        tap.max_ref_count = max(tap.max_ref_count, shared)
        return execute(batch)

    engine.runner.execute = tapped
    replay(engine, requests, wait=False)
    pool.check_invariants()
    assert pool.num_used_blocks == 0  # every reference dropped, shared ones included
    return engine, tap


def tokens_run(engine) -> int:
    """Tokens the engine fed to the model, over all steps."""
    return sum(step[2] + step[3] for step in engine.steps)


def test_cached_prefix_gives_the_uncached_logits_and_tokens(model):
    off, off_tap = run(model, SHARED, caching=False)
    on, on_tap = run(model, SHARED, caching=True)
    assert on.mirror.outputs == off.mirror.outputs
    assert on_tap.logits.keys() == off_tap.logits.keys()
    for key, row in off_tap.logits.items():
        torch.testing.assert_close(on_tap.logits[key], row, rtol=1e-4, atol=1e-4)
    cached = {r.request_id: r.num_cached_tokens for r in on.recorder.requests}
    assert cached == EXPECTED_CACHED
    assert all(r.num_cached_tokens == 0 for r in off.recorder.requests)
    assert on_tap.max_ref_count == 3  # requests 0, 1 and 2 held hash 1's blocks at once
    # the engine ran exactly the uncached tokens: the hits are missing from its steps
    assert tokens_run(off) - tokens_run(on) == sum(EXPECTED_CACHED.values())
    prompts = sum(r.prompt_tokens for r in SHARED)
    assert sum(step[2] for step in on.steps) == prompts - sum(EXPECTED_CACHED.values())
    # requests sharing hashes share those prompt ids, as the cached KV assumes
    outputs = on.mirror.outputs
    assert outputs[1][:64] == outputs[0][:64] and outputs[3][:100] == outputs[0][:100]
    assert outputs[2][:32] == outputs[0][:32] and outputs[2][32:64] != outputs[0][32:64]
    # request 3 came alone after request 0 finished: its one chunk is its 24 uncached
    # tokens on top of the 96 cached ones (steps.csv's prefill_chunks, new:cached)
    assert [step[13] for step in on.steps if step[1] >= 40.0 and step[13]][0] == "24:96"


def queued_one_by_one(model, caching: bool):
    """Requests 0 and 1 of SHARED queued through GpuEngine.add_request alone (no replay, no
    prompt registered beside it): 1 arrives once 0's prompt is in the KV cache. Returns the
    engine, request 1, and the most requests holding one of request 0's blocks at 1's
    first step."""
    core = toy_core(toy_config(enable_prefix_caching=caching, hash_block_tokens=HASH), 200)
    engine = assemble_engine(core, model, plain_store(core, "cpu", torch.float32),
                             torch.device("cpu"), None, seed=3)
    engine.mirror.keep_outputs = True
    engine.timer = TickTimer(1.0)
    clock = VirtualClock()
    first = RequestState(0, 0.0, 100, 12, (1, 2, 3, 4))
    second = RequestState(1, 0.0, 90, 9, (1, 2, 3))
    assert engine.add_request(first)
    while first.num_computed_tokens < first.num_prompt_tokens:
        engine.step(clock)
    assert engine.add_request(second)
    engine.step(clock)
    pool = core.scheduler.pool
    shared = max(pool.ref_count(b) for b in first.block_ids)
    while engine.has_unfinished():
        engine.step(clock)
    pool.check_invariants()
    assert pool.num_used_blocks == 0
    return engine, second, shared


def test_add_request_alone_gives_hashed_prompts_their_ids_and_shared_blocks(model):
    off, off_second, off_shared = queued_one_by_one(model, caching=False)
    on, on_second, on_shared = queued_one_by_one(model, caching=True)
    assert (off_second.num_cached_tokens, off_shared) == (0, 1)
    assert (on_second.num_cached_tokens, on_shared) == (EXPECTED_CACHED[1], 2)
    # the cached KV was written for the same prompt ids: the same tokens come out
    assert on.mirror.outputs == off.mirror.outputs
    assert on.mirror.outputs[1][:64] == on.mirror.outputs[0][:64]  # hashes 1 and 2


@pytest.fixture(scope="module")
def crowd_reference(model):
    """The crowd's outputs with prefix caching off and room for everyone."""
    engine, _ = run(model, CROWD, caching=False, num_kv_blocks=400)
    return engine.mirror.outputs


@pytest.mark.parametrize("policy, drain, num_kv_blocks", [
    (Policy.STATIC, DrainStrategy.PREEMPT, 12),
    (Policy.ELASTIC, DrainStrategy.MIGRATE, 12),
    (Policy.ELASTIC, DrainStrategy.PREEMPT, 12),
])
def test_preemption_and_drains_keep_shared_blocks(model, crowd_reference, policy, drain,
                                                   num_kv_blocks):
    engine, tap = run(model, CROWD, caching=True, policy=policy, drain=drain,
                      num_kv_blocks=num_kv_blocks)
    assert sum(r.num_cached_tokens for r in engine.recorder.requests) > 0
    assert tap.max_ref_count >= 2
    summary = engine_summary(engine, {})
    if policy is Policy.STATIC:
        assert summary["num_preemptions"] > 0
    elif drain is DrainStrategy.MIGRATE:
        assert summary["migrated_bytes"] > 0 and summary["num_preemptions"] == 0
    else:
        assert summary["num_drain_victims"] > 0
    assert engine.mirror.outputs == crowd_reference


@pytest.mark.parametrize("graphs", [False, True])
def test_async_scheduling_keeps_the_hits_and_the_synchronous_tokens(model, graphs):
    reference, _ = run(model, SHARED, caching=False)
    off, on = (run_async_engine(model, asynchronous=True, num_kv_blocks=200, requests=SHARED,
                                graphs=graphs, enable_prefix_caching=caching,
                                hash_block_tokens=HASH)
               for caching in (False, True))
    for engine in (off, on):
        engine.scheduler.pool.check_invariants()
        assert engine.scheduler.pool.num_used_blocks == 0
    assert off.mirror.outputs == reference.mirror.outputs
    assert on.mirror.outputs == reference.mirror.outputs
    cached = {r.request_id: r.num_cached_tokens for r in on.recorder.requests}
    assert cached == EXPECTED_CACHED
    assert tokens_run(off) - tokens_run(on) == sum(EXPECTED_CACHED.values())
