"""Step-by-step scheduler tests with a fake executor (every step takes one second)."""

from __future__ import annotations

import pytest
from core_helpers import make_scheduler, request, run_to_completion

from sim.core.request import RejectReason, RequestStatus


def test_long_prompt_is_split_into_budget_sized_chunks():
    sched = make_scheduler(256, max_num_batched_tokens=1000, block_size=16)
    sched.add_request(request(0, prompt=2500, output=3))
    chunks = []
    for _ in range(3):
        out = sched.schedule()
        (item,) = out.scheduled
        chunks.append((item.num_computed_tokens, item.num_new_tokens, item.samples))
        sched.update(out, 1.0)
    assert chunks == [(0, 1000, False), (1000, 1000, False), (2000, 500, True)]
    req = sched.requests[0]
    assert req.num_output_tokens == 1
    # 2500 tokens need ceil(2500 / 16) = 157 blocks
    assert len(req.block_ids) == 157


def test_budget_is_shared_running_first_then_waiting_fcfs():
    sched = make_scheduler(512, max_num_batched_tokens=100, block_size=16)
    sched.add_request(request(0, prompt=60, output=5))
    out = sched.schedule()
    sched.update(out, 1.0)
    sched.add_request(request(1, prompt=300, output=5))
    sched.add_request(request(2, prompt=10, output=5))
    out = sched.schedule()
    got = [(s.request_id, s.num_new_tokens, s.is_decode) for s in out.scheduled]
    # request 0 decodes one token, then request 1 gets the remaining 99; request 2 waits.
    assert got == [(0, 1, True), (1, 99, False)]
    assert out.num_decode_tokens == 1 and out.num_prefill_tokens == 99
    assert out.num_scheduled_tokens <= 100


def test_max_num_seqs_caps_running_requests():
    sched = make_scheduler(512, max_num_seqs=2, max_num_batched_tokens=1000)
    for i in range(3):
        sched.add_request(request(i, prompt=10, output=4))
    out = sched.schedule()
    assert [s.request_id for s in out.scheduled] == [0, 1]
    assert len(sched.waiting) == 1


def test_preemption_takes_the_tail_and_recomputes():
    # 8 blocks of 4 tokens = 32 slots. Two requests of 12-token prompts use 3 blocks each;
    # decoding to 16 tokens each would need 8 blocks total, then more: the tail is preempted.
    sched = make_scheduler(8, block_size=4, max_num_batched_tokens=64)
    reqs = [request(0, prompt=12, output=10), request(1, prompt=12, output=10)]
    for req in reqs:
        sched.add_request(req)
    preempted = []
    now = 0.0
    while sched.has_unfinished():
        out = sched.schedule()
        preempted.extend(out.preempted_ids)
        now += 1
        sched.update(out, now)
        sched.pool.check_invariants()
        assert now < 1000
    assert preempted and preempted[0] == 1  # the tail of the running list goes first
    r1 = reqs[1]
    assert r1.num_preemptions >= 1 and r1.num_recomputed_tokens > 0
    assert all(r.status is RequestStatus.FINISHED for r in reqs)
    assert all(r.num_output_tokens == 10 for r in reqs)
    assert sched.requests == {}  # finished requests leave the scheduler


def test_no_admission_in_a_step_that_preempted():
    sched = make_scheduler(6, block_size=4, max_num_batched_tokens=64)
    # each request grows to 20 tokens = 5 blocks of 4; together they need 10 of 6 blocks.
    assert sched.add_request(request(0, prompt=8, output=12))
    assert sched.add_request(request(1, prompt=8, output=12))
    for _ in range(30):
        out = sched.schedule()
        if out.preempted_ids:
            admitted = [s for s in out.scheduled if s.num_computed_tokens == 0]
            assert admitted == []
            break
        sched.update(out, 0.0)
    else:
        pytest.fail("expected a preemption")


def test_decode_only_detection_and_samples_flag():
    sched = make_scheduler(64, max_num_batched_tokens=64)
    sched.add_request(request(0, prompt=20, output=3))
    out = sched.schedule()
    assert not out.is_decode_only and out.scheduled[0].samples
    sched.update(out, 1.0)
    out = sched.schedule()
    assert out.is_decode_only and out.decode_context_tokens == 21


def test_requests_that_can_never_run_are_rejected_with_a_reason():
    sched = make_scheduler(4, block_size=16, max_model_len=1000)
    too_long = request(0, prompt=990, output=20)  # 1010 tokens > max_model_len 1000
    assert not sched.add_request(too_long)
    assert too_long.status is RequestStatus.REJECTED
    assert too_long.reject_reason is RejectReason.EXCEEDS_MAX_MODEL_LEN
    too_big = request(1, prompt=100, output=10)  # ceil(110 / 16) = 7 blocks > pool of 4
    assert not sched.add_request(too_big)
    assert too_big.reject_reason is RejectReason.EXCEEDS_KV_POOL
    fits = request(2, prompt=50, output=14)  # 64 tokens = exactly the 4 blocks
    assert sched.add_request(fits) and fits.reject_reason is None
    assert list(sched.requests) == [2]


def test_first_token_and_finish_times_come_from_the_executor():
    sched = make_scheduler(64, max_num_batched_tokens=10)
    req = request(0, prompt=25, output=3)
    sched.add_request(req)
    run_to_completion(sched)
    # 3 prefill steps (10 + 10 + 5, the last samples) then 2 decode steps, 1 s each.
    assert req.first_token_s == 3.0
    assert req.finish_s == 5.0


def test_decode_run_matches_step_by_step():
    def build():
        s = make_scheduler(24, block_size=4, max_num_batched_tokens=32)
        reqs = [request(i, prompt=p, output=o)
                for i, (p, o) in enumerate([(10, 30), (7, 45), (20, 12), (3, 60)])]
        for req in reqs:
            s.add_request(req)
        return s, reqs

    (a, reqs_a), (b, reqs_b) = build(), build()
    steps_a = run_to_completion(a)
    steps_b = run_to_completion(b, decode_run=True)
    assert sum(o.num_steps for o in steps_b) == len(steps_a)
    assert len(steps_b) < len(steps_a)
    assert any(r.num_preemptions for r in reqs_a), "no preemption: the test proves less"
    for ra, rb in zip(reqs_a, reqs_b, strict=True):
        assert ra.status is rb.status is RequestStatus.FINISHED
        assert (ra.first_token_s, ra.finish_s, ra.num_preemptions) == (
            rb.first_token_s, rb.finish_s, rb.num_preemptions)


def test_a_decode_run_deals_its_blocks_as_one_allocation_per_request_would():
    """A run takes all its new blocks in one allocation; each request gets the ids that one
    allocation per request, in running order, would give it."""
    def build():
        s = make_scheduler(200, block_size=4, max_num_batched_tokens=64)
        for i, (p, o) in enumerate([(10, 40), (7, 45), (21, 42), (3, 60), (13, 41)]):
            s.add_request(request(i, prompt=p, output=o))
        now = 0.0
        while s.has_prefill_running() or s.waiting:  # every prompt computed, all decoding
            now += 1
            s.update(s.schedule(), now)
        return s

    a, b = build(), build()
    num_steps = 11  # 2 or 3 new 4-token blocks for every request
    run = a.schedule(decode_run_limit=lambda batch, ctx, k, attach: num_steps)
    assert run.num_steps == num_steps
    expected = {}
    for req in b.running:
        needed = -(-(req.num_computed_tokens + num_steps) // 4) - len(req.block_ids)
        expected[req.request_id] = b.pool.allocate(needed)
    assert {i.request_id: list(i.new_block_ids) for i in run.scheduled} == expected
    assert all(len(ids) >= 2 for ids in expected.values())
    assert len({len(ids) for ids in expected.values()}) > 1, "equal shares prove less"
    a.pool.check_invariants()


def test_prefix_cache_hits_shared_blocks():
    sched = make_scheduler(256, block_size=16, enable_prefix_caching=True,
                           hash_block_tokens=64, max_num_batched_tokens=512)
    sched.add_request(request(0, prompt=200, output=2, hashes=(7, 8, 9, 10)))
    run_to_completion(sched)
    sched.add_request(request(1, prompt=150, output=2, hashes=(7, 8, 11)))
    out = sched.schedule()
    (item,) = out.scheduled
    # hashes 7 and 8 name the first 128 tokens = 8 full blocks shared; 11 differs.
    assert item.num_computed_tokens == 128
    assert sched.requests[1].num_cached_tokens == 128
    sched.pool.check_invariants()


def test_executor_can_rebuild_block_tables_from_outputs_alone():
    """Replaying new_table / new_block_ids / preempted_ids reproduces the scheduler's tables."""
    sched = make_scheduler(10, block_size=4, max_num_batched_tokens=16)
    for i, (p, o) in enumerate([(9, 14), (6, 20), (13, 9)]):
        sched.add_request(request(i, prompt=p, output=o))
    tables: dict[int, list[int]] = {}
    now = 0.0
    saw_new_table_after_preemption = False
    while sched.has_unfinished():
        out = sched.schedule()
        for rid in out.preempted_ids:
            tables.pop(rid, None)
        for item in out.scheduled:
            if item.new_table:
                saw_new_table_after_preemption |= sched.requests[item.request_id].num_preemptions > 0
                tables[item.request_id] = list(item.new_block_ids)
            else:
                tables[item.request_id].extend(item.new_block_ids)
            assert tables[item.request_id] == sched.requests[item.request_id].block_ids
        now += 1
        for req in sched.update(out, now):
            tables.pop(req.request_id)
    assert saw_new_table_after_preemption
