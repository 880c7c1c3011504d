"""Elastic controller, block pool invariants and policy behaviour in the pure core."""

from __future__ import annotations

import pytest
from core_helpers import make_scheduler, request
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.block_pool import BlockPool, ElasticBusyError, ElasticState
from sim.core.catalog import GIB
from sim.core.elastic import DrainStrategy, Policy, VmmCostModel, VmmCosts, plan_reserve
from sim.core.request import RequestStatus
from sim.core.step import ElasticActionKind


def test_pool_prefers_base_and_refuses_detach_with_live_elastic_blocks():
    pool = BlockPool(4, 4)
    pool.attach_elastic()
    first = pool.allocate(4)
    assert all(not pool.is_elastic(b) for b in first)
    extra = pool.allocate(2)
    assert all(pool.is_elastic(b) for b in extra)
    with pytest.raises(ElasticBusyError, match="2 of its blocks"):
        pool.detach_elastic()
    pool.free(extra)
    pool.detach_elastic()
    assert pool.num_free_blocks == 0 and pool.allocate(1) is None
    pool.check_invariants()


def test_pool_free_twice_is_an_error():
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(ValueError, match="freed but not allocated"):
        pool.free([b])


def test_plan_reserve_rounds_to_granules_and_keeps_decode_headroom():
    mib = 1024**2
    layout = plan_reserve(Policy.ELASTIC, 1000 * mib, 3 * mib, 512 * mib, 101 * mib)
    assert layout.lent_bytes == 898 * mib  # 899 MiB rounded down to 2 MiB granules
    assert layout.num_elastic_blocks == 898 // 3
    assert layout.num_handles == 2  # 512 MiB + a 386 MiB last handle
    assert plan_reserve(Policy.STATIC, 1000 * mib, 3 * mib, 512 * mib, 0).num_elastic_blocks == 0
    assert plan_reserve(Policy.OVERCOMMIT, 1000 * mib, 4 * mib, 512 * mib, 0).lent_bytes == 1000 * mib


def test_vmm_cost_model_matches_the_committed_h200_measurement():
    """Every remap transition of benchmarks/results/vmm_latency_nvidia-h200.json within 30%."""
    import json
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks/results/vmm_latency_nvidia-h200.json"
    rows = [r for r in json.loads(path.read_text())["transitions"] if r["reclaim"] == "remap"]
    assert len(rows) >= 15
    for row in rows:
        model = VmmCostModel(handle_bytes=int(row["handle_mib"] * 1024**2))
        num_bytes = int(row["reserve_gib"] * 1024**3)
        assert model.num_handles(num_bytes) == row["num_handles"]
        for predicted, measured in ((model.attach_s(num_bytes), row["attach"]["median_ms"]),
                                    (model.detach_s(num_bytes), row["detach"]["median_ms"])):
            assert abs(predicted * 1e3 / measured - 1) < 0.3, row


def test_vmm_cost_is_per_handle():
    gib = 1024**3
    small = VmmCostModel(handle_bytes=2 * 1024**2)
    large = VmmCostModel(handle_bytes=512 * 1024**2)
    assert small.attach_s(8 * gib) > 100 * large.attach_s(8 * gib)
    with pytest.raises(ValueError, match="2 MiB granularity"):
        VmmCostModel(handle_bytes=3 * 1024**2)


@settings(max_examples=200, deadline=None)
@given(num_bytes=st.integers(1, 64 * GIB), cached_bytes=st.integers(0, 8 * GIB),
       reclaim=st.sampled_from(["remap", "release"]),
       handle_mib=st.sampled_from([2, 64, 512, 2048]))
def test_vmm_attach_time_is_its_terms_added_in_order(num_bytes, cached_bytes, reclaim,
                                                     handle_mib):
    """attach_s: fixed cost, handles, bytes, then the cache handed back, added left to
    right (the controller adds the cached mapping time and the cache term apart: the same
    float only in this order)."""
    model = VmmCostModel(handle_bytes=handle_mib * 1024**2, reclaim=reclaim)
    c = model.measured
    handles = -(-num_bytes // (handle_mib * 1024**2))
    expected = (c.attach_fixed_s + handles * c.attach_handle_s + num_bytes / GIB * c.attach_gib_s
                + cached_bytes / GIB * c.attach_cache_gib_s)
    assert model.attach_s(num_bytes, cached_bytes) == expected
    assert model.map_s(num_bytes) + model.cache_release_s(cached_bytes) == expected


def test_each_attach_and_detach_takes_what_the_vmm_model_says():
    """Attaches lend what each decode batch leaves (sizes repeat and differ): every action's
    time is the VMM model's for the bytes it maps or unmaps, to the bit."""
    costs = VmmCosts(attach_handle_s=59.0e-6, attach_gib_s=0.055e-3, detach_handle_s=58.7e-6,
                     detach_gib_s=0.057e-3, attach_fixed_s=1e-4, detach_fixed_s=2e-4)
    vmm = VmmCostModel(handle_bytes=2 * 1024**2, costs=costs)
    sched = make_scheduler(64, policy=Policy.ELASTIC, num_elastic_blocks=10, block_bytes=63,
                           block_size=4, max_num_batched_tokens=64, max_num_seqs=4, vmm=vmm)
    for i in range(12):  # arrivals every few steps: batches of 1-4 decodes between prefills
        sched.add_request(request(i, prompt=4 + i % 3, output=6 + 3 * (i % 4),
                                  arrival_s=2.0 * i))
    lent_bytes, sizes, num_detaches, now = 0, set(), 0, 0.0
    pending = sorted(sched.waiting, key=lambda r: r.arrival_s)
    sched.waiting.clear()
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival_s <= now:
            sched.add_request(pending.pop(0))
        out = sched.schedule()
        if out.elastic is not None and out.elastic.kind is ElasticActionKind.ATTACH:
            lent_bytes = out.elastic.num_blocks * 63
            sizes.add(lent_bytes)
            assert out.elastic.duration_s == vmm.attach_s(lent_bytes)  # nothing cached priced
        elif out.elastic is not None and out.elastic.kind is ElasticActionKind.DETACH:
            assert out.elastic.duration_s == vmm.detach_s(lent_bytes)
            assert out.elastic.num_handles == vmm.num_handles(lent_bytes)
            num_detaches += 1
        now += 1.0
        sched.update(out, now)
    assert len(sizes) > 1 and num_detaches > 1


def run_with_stats(sched, max_steps: int = 100_000):
    """Drive the scheduler to completion (every step 1 s); (output, stats) per step."""
    steps = []
    now = 0.0
    while sched.has_unfinished():
        out = sched.schedule()
        steps.append((out, sched.make_stats()))
        now += out.num_steps
        sched.update(out, now)
        sched.pool.check_invariants()
        assert len(steps) < max_steps, "scheduler made no progress"
    return steps


def _elastic(drain=DrainStrategy.PREEMPT, base=20, elastic=10, **kw):
    kw.setdefault("max_num_batched_tokens", 64)
    kw.setdefault("max_num_seqs", 4)
    return make_scheduler(base, policy=Policy.ELASTIC, num_elastic_blocks=elastic,
                          drain=drain, block_size=4, **kw)


def test_elastic_attaches_for_decode_and_detaches_before_prefill():
    sched = _elastic()
    sched.add_request(request(0, prompt=8, output=40))
    out = sched.schedule()  # prefill: stays detached
    assert out.elastic is None and sched.pool.elastic_state is ElasticState.DETACHED
    sched.update(out, 1.0)
    out = sched.schedule()  # decode-only: attach
    assert out.elastic.kind is ElasticActionKind.ATTACH and out.is_decode_only
    # reserve 644 B less one decode row's 11 B leaves 633 B: all 10 blocks of 50 B fit
    assert out.elastic.num_blocks == sched.make_stats().num_lent_blocks == 10
    sched.update(out, 2.0)
    sched.add_request(request(1, prompt=8, output=4))
    out = sched.schedule()  # a prefill is admissible: detach first, then admit
    assert out.elastic.kind is ElasticActionKind.DETACH
    assert any(s.request_id == 1 for s in out.scheduled)
    stats = sched.make_stats()
    assert stats.activation_bytes <= stats.activation_available_bytes
    assert stats.num_lent_blocks == 0 and stats.step_id == out.step_id


@pytest.mark.parametrize("drain", list(DrainStrategy))
def test_drain_strategies_finish_everything_and_never_detach_live_blocks(drain):
    sched = _elastic(drain, base=24, elastic=12)
    reqs = [request(i, prompt=6 + i, output=30 + 3 * i, arrival_s=i) for i in range(8)]
    for req in reqs:
        sched.add_request(req)
    steps = run_with_stats(sched)
    outputs = [out for out, _ in steps]
    assert all(r.status is RequestStatus.FINISHED for r in reqs)
    kinds = [o.elastic.kind for o in outputs if o.elastic]
    assert ElasticActionKind.ATTACH in kinds
    for out, stats in steps:
        assert out.oom is None
        assert stats.activation_bytes <= stats.activation_available_bytes
        if out.num_prefill_tokens:
            assert stats.num_lent_blocks == 0  # no prefill while the reserve is lent
    if drain is DrainStrategy.MIGRATE:
        assert any(o.elastic and o.elastic.migrations for o in outputs)


def test_overcommit_reports_oom_when_kv_uses_the_reserve_and_a_prefill_arrives():
    # Activations cost 10 B per token + 1 B per sampled row: the reserve for a 64-token step
    # with 4 rows is 644 B, lent as 16 blocks of 40 B (4 tokens of 10 B KV each). Request 0
    # fills the 8 base blocks and decodes into the reserve. At step 40 request 1's 40-token
    # prompt arrives: with request 0's decode the step needs 10 x 41 + 2 = 412 B, but its own
    # 10 new blocks land in the reserve too, leaving 644 - 16 x 40 = 4 B.
    sched = make_scheduler(8, policy=Policy.OVERCOMMIT, num_elastic_blocks=16, block_size=4,
                           block_bytes=40, max_num_batched_tokens=64, max_num_seqs=4)
    early, late = request(0, prompt=16, output=60), request(1, prompt=40, output=2)
    sched.add_request(early)
    outputs, ended = [], []
    for step in range(45):
        if step == 40:
            sched.add_request(late)
        out = sched.schedule()
        ended += sched.update(out, float(step))
        sched.pool.check_invariants()
        outputs.append(out)
    ooms = [(i, o.oom) for i, o in enumerate(outputs) if o.oom]
    assert len(ooms) == 1
    step, oom = ooms[0]
    assert step == 40 and (oom.needed_bytes, oom.available_bytes) == (412, 4)
    # the step held both requests: both fail, and update() reports each once, in that step
    assert early.status is late.status is RequestStatus.FAILED_OOM
    assert ended == [early, late] and sched.requests == {}
    assert all(o.oom is None for o in outputs[:40])


def test_static_never_lends_and_never_ooms():
    sched = make_scheduler(30, block_size=4, max_num_batched_tokens=32, max_num_seqs=8)
    for i in range(10):
        sched.add_request(request(i, prompt=5 + 3 * i, output=10 + i))
    steps = run_with_stats(sched)
    assert all(stats.num_lent_blocks == 0 and out.oom is None for out, stats in steps)


trace_strategy = st.lists(
    st.tuples(st.integers(1, 60), st.integers(1, 40), st.integers(0, 3)), min_size=1, max_size=25
)


@settings(max_examples=60, deadline=None)
@given(trace=trace_strategy,
       policy=st.sampled_from([Policy.STATIC, Policy.ELASTIC]),
       drain=st.sampled_from(list(DrainStrategy)),
       decode_run=st.booleans())
def test_random_traces_conserve_requests_tokens_and_memory(trace, policy, drain, decode_run):
    elastic = 8 if policy is Policy.ELASTIC else 0
    sched = make_scheduler(32, policy=policy, num_elastic_blocks=elastic, drain=drain,
                           block_size=4, max_num_batched_tokens=48, max_num_seqs=6)
    accepted: list = []
    pending = list(enumerate(trace))
    now = 0.0
    steps = 0
    ended: list = []
    limit = (lambda b, c, k, attach: k) if decode_run else None
    while pending or sched.has_unfinished():
        while pending and pending[0][1][2] <= now:  # arrivals due by now
            i, (prompt, output, _) = pending.pop(0)
            req = request(i, prompt, output, arrival_s=now)
            if sched.add_request(req):
                accepted.append(req)
        if not sched.has_unfinished():
            now = float(pending[0][1][2]) if pending else now
            continue
        out = sched.schedule(decode_run_limit=limit)
        stats = sched.make_stats()
        assert out.num_scheduled_tokens <= 48
        assert stats.num_used_blocks <= stats.num_usable_blocks
        assert stats.activation_bytes <= stats.activation_available_bytes
        now += out.num_steps
        ended += sched.update(out, now)
        sched.pool.check_invariants()
        steps += 1
        assert steps < 20_000
    assert sched.requests == {}
    finished = [r for r in accepted if r.status is RequestStatus.FINISHED]
    assert len(finished) == len(accepted)  # every accepted request finishes exactly once
    assert sorted(r.request_id for r in ended) == sorted(r.request_id for r in accepted)
    for r in finished:
        assert r.num_output_tokens == r.max_output_tokens
        assert r.first_token_s is not None and r.finish_s >= r.first_token_s
    assert sched.pool.num_used_blocks == 0


def test_attach_lends_what_the_current_decode_batch_leaves_free():
    # reserve 644 B; blocks of 63 B; region of 10 blocks (630 B). One decoding request keeps
    # 10 + 1 = 11 B back (633 B left: 10 blocks); four keep 44 B back (600 B: 9 blocks).
    def lent_with(num_requests: int) -> int:
        sched = make_scheduler(64, policy=Policy.ELASTIC, num_elastic_blocks=10, block_bytes=63,
                               block_size=4, max_num_batched_tokens=64, max_num_seqs=4)
        for i in range(num_requests):
            sched.add_request(request(i, prompt=4, output=50))
        sched.update(sched.schedule(), 1.0)
        out = sched.schedule()
        stats = sched.make_stats()
        assert out.elastic.kind is ElasticActionKind.ATTACH
        assert stats.activation_bytes <= stats.activation_available_bytes
        assert out.elastic.num_blocks == stats.num_lent_blocks
        return stats.num_lent_blocks

    assert lent_with(1) == 10
    assert lent_with(4) == 9


def test_an_attach_pays_for_the_activations_the_allocator_still_caches():
    """A release-mode attach hands the allocator's cache back first: the largest step's
    activations since the last attach (toy model: 10 B a token + 1 B a sampled row), priced
    at attach_cache_gib_s."""
    per_byte = 1e-3  # seconds per cached byte
    costs = VmmCosts(attach_handle_s=0.0, attach_gib_s=0.0, detach_handle_s=0.0,
                     detach_gib_s=0.0, attach_fixed_s=2e-3, attach_cache_gib_s=per_byte * GIB)
    sched = make_scheduler(policy=Policy.ELASTIC, num_elastic_blocks=10,
                           vmm=VmmCostModel(costs=costs))
    sched.add_request(request(0, prompt=8, output=40))
    sched.update(sched.schedule(), 1.0)  # the prefill: 8 tokens, 1 row = 81 B
    out = sched.schedule()
    assert out.elastic.kind is ElasticActionKind.ATTACH
    assert out.elastic.duration_s == pytest.approx(2e-3 + 81 * per_byte)
    sched.update(out, 2.0)  # a decode step of one row: 11 B
    sched.add_request(request(1, prompt=8, output=4))
    out = sched.schedule()  # detach, then 8 prefill tokens beside 1 decode, 2 rows: 92 B
    assert out.elastic.kind is ElasticActionKind.DETACH
    assert sched.make_stats().activation_bytes == 92
    sched.update(out, 3.0)
    out = sched.schedule()
    while out.elastic is None or out.elastic.kind is not ElasticActionKind.ATTACH:
        sched.update(out, 4.0)
        out = sched.schedule()
    assert out.elastic.duration_s == pytest.approx(2e-3 + 92 * per_byte)




def _spilling(drain=DrainStrategy.PREEMPT, outputs=(4, 8)) -> tuple:
    """Two requests of 8 prompt tokens on 5 base blocks of 4 tokens: their prefills take 4,
    and their first decodes need a block each, so the one the reserve lends is elastic.
    Steps (1 s each) run until the pool holds no base-only request: by default request 0
    has finished and request 1 holds an elastic block. Returns (scheduler, time)."""
    sched = _elastic(drain, base=5)
    for i, output in enumerate(outputs):
        assert sched.add_request(request(i, prompt=8, output=output))
    now = 0.0
    while len(sched.running) != 2 or sched.running[0].num_output_tokens < outputs[0] - 1:
        now += 1.0
        sched.update(sched.schedule(), now)
        assert now < 20
    now += 1.0
    sched.update(sched.schedule(), now)  # request 0's last step
    assert sched.pool.elastic_state is ElasticState.ATTACHED
    return sched, now


def test_a_detach_waits_for_the_step_in_flight_only_if_that_step_held_elastic_blocks():
    """Under async scheduling the step before a detach may still be running: its kernels
    touch the reserve only if its tables hold elastic blocks. An attach always waits (it
    hands torch's cache back)."""
    sched = _elastic(base=20)
    sched.add_request(request(0, prompt=8, output=40))
    sched.update(sched.schedule(), 1.0)
    out = sched.schedule()
    assert out.elastic.kind is ElasticActionKind.ATTACH and out.elastic.needs_idle_device
    sched.update(out, 2.0)
    assert sched.pool.num_used_elastic == 0  # 20 base blocks hold the one decode
    sched.add_request(request(1, prompt=8, output=4))
    out = sched.schedule()
    assert out.elastic.kind is ElasticActionKind.DETACH
    assert not out.elastic.needs_idle_device

    spills, _ = _spilling()
    assert [r.request_id for r in spills.running] == [1] and spills.pool.num_used_elastic == 1
    spills.add_request(request(2, prompt=8, output=4))
    out = spills.schedule()
    assert out.elastic.kind is ElasticActionKind.DETACH and out.elastic.preempted_ids == (1,)
    assert out.elastic.needs_idle_device


def test_with_detach_behind_step_off_every_detach_waits():
    """EngineConfig.detach_behind_step off (how every replay recorded before the setting
    ran): the engine waits for the step in flight before any elastic action."""
    from sim.core.engine_config import EngineConfig
    sched = _elastic(base=20)
    sched.controller.detach_behind_step = False
    sched.add_request(request(0, prompt=8, output=40))
    sched.update(sched.schedule(), 1.0)
    sched.update(sched.schedule(), 2.0)  # the attach
    sched.add_request(request(1, prompt=8, output=4))
    out = sched.schedule()
    assert out.elastic.kind is ElasticActionKind.DETACH and out.elastic.needs_idle_device
    assert EngineConfig().detach_behind_step
    assert not EngineConfig.from_dict({}, recorded=True).detach_behind_step
    assert EngineConfig.from_dict({}).detach_behind_step


def test_a_drain_wait_has_nothing_to_wait_for():
    sched, _ = _spilling(DrainStrategy.WAIT)
    sched.add_request(request(2, prompt=8, output=4))
    out = sched.schedule()
    assert out.elastic.kind is ElasticActionKind.DRAIN_WAIT
    assert not out.elastic.needs_idle_device


def test_a_detach_waits_when_the_step_before_held_elastic_blocks_its_close_freed():
    """The scheduler frees a finished request's blocks as it closes the step, while that step
    may still run on the device: the pool then holds no elastic block, yet the detach must
    wait for that step all the same."""
    sched, now = _spilling(outputs=(4, 4))  # both finish in the same step
    assert not sched.running and sched.pool.num_used_elastic == 0
    sched.add_request(request(2, prompt=8, output=4))
    out = sched.schedule()
    assert out.elastic.kind is ElasticActionKind.DETACH and not out.elastic.preempted_ids
    assert out.elastic.needs_idle_device
