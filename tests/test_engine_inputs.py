"""Executor-side block tables and host arrays, checked against the real Scheduler."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import make_scheduler, request

from gpu_backend.engine.inputs import BlockTableError, RequestMirror
from gpu_backend.engine.prompts import PromptError, PromptSpec, prompt_token_ids
from sim.core.elastic import DrainStrategy, Policy
from sim.core.request import RequestStatus
from sim.core.step import ScheduledRequest, SchedulerOutput

BLOCK = 4


def output(items, **kw) -> SchedulerOutput:
    fields = dict(step_id=1, scheduled=tuple(items), num_steps=1, num_prefill_tokens=0,
                  num_decode_tokens=0, prefill_chunks=(), decode_context_tokens=0,
                  preempted_ids=(), elastic=None, oom=None)
    fields.update(kw)
    return SchedulerOutput(**fields)


def test_batch_arrays_for_a_chunk_and_a_decode():
    mirror = RequestMirror(vocab_size=1000, block_size=BLOCK, block_id_offset=1)
    first = output([ScheduledRequest(7, 0, 6, (3, 5), False, False, new_table=True),
                    ScheduledRequest(9, 0, 2, (8,), False, True, new_table=True)])
    mirror.apply(first, {7: 10, 9: 2})
    mirror.tokens[9].append(42)  # pretend step one sampled 42 for request 9
    second = output([ScheduledRequest(7, 6, 4, (11,), False, True),
                     ScheduledRequest(9, 2, 1, (), True, True)])
    mirror.apply(second, {})
    batch = mirror.build(second, 100)
    # the decode row (request 9) comes first, then request 7's chunk of 4
    assert batch.request_ids == [9, 7] and batch.num_decodes == 1
    assert batch.positions.tolist() == [2, 6, 7, 8, 9]
    # request 7: table [3, 5, 11] -> device [4, 6, 12]; positions 6, 7 in block 1, 8, 9 in block 2
    assert batch.slot_mapping.tolist() == [9 * 4 + 2, 6 * 4 + 2, 6 * 4 + 3, 12 * 4, 12 * 4 + 1]
    assert batch.block_tables.tolist() == [[9, 0, 0], [4, 6, 12]]
    assert batch.seq_lens.tolist() == [3, 10]
    assert batch.query_start_loc.tolist() == [0, 1, 5]
    assert batch.logits_indices.tolist() == [0, 4]
    assert batch.sample_request_ids == [9, 7]
    assert batch.input_ids[0] == 42
    assert batch.input_ids[1:].tolist() == mirror.tokens[7][6:10]
    assert (batch.max_query_len, batch.max_seq_len) == (4, 10)


def test_decode_rows_lead_and_are_counted():
    """Rows of one new token move to the front in their order; the rest keep theirs."""
    from gpu_backend.engine.inputs import decode_rows_first, leading_decodes

    assert decode_rows_first([5, 1, 7, 1, 1, 3], lambda n: n) == [1, 1, 1, 5, 7, 3]
    assert leading_decodes(np.array([1, 1, 1, 5, 7, 3])) == 3
    assert leading_decodes(np.array([1, 1])) == 2  # decode-only
    assert leading_decodes(np.array([4, 1])) == 0


def test_table_beyond_usable_blocks_is_refused():
    mirror = RequestMirror(vocab_size=10, block_size=BLOCK)
    out = output([ScheduledRequest(1, 0, 4, (0, 50), False, True, new_table=True)])
    mirror.apply(out, {1: 4})
    with pytest.raises(BlockTableError, match="block 50"):
        mirror.build(out, 50)
    assert mirror.build(out, 51).block_tables.tolist() == [[1, 51]]


def test_prompt_ids_are_seeded_per_request():
    ids = prompt_token_ids(PromptSpec(20), 5, vocab_size=100, seed=3)
    assert ids == prompt_token_ids(PromptSpec(20), 5, vocab_size=100, seed=3)
    assert ids != prompt_token_ids(PromptSpec(20), 6, vocab_size=100, seed=3)
    assert ids != prompt_token_ids(PromptSpec(20), 5, vocab_size=100, seed=4)
    assert len(ids) == 20 and 0 <= min(ids) and max(ids) < 100


def test_prompt_ids_follow_the_block_hashes():
    """Ids under a hash depend on the hash alone (any request, any prompt length); the ids
    past the hashed blocks, on the request."""
    def ids(request_id, num_tokens, hashes):
        return prompt_token_ids(PromptSpec(num_tokens, hashes, 8), request_id, 1000, seed=1)

    a = ids(1, 30, (7, 8, 9, 10))  # 3 full hash blocks of 8, then 6 of hash 10
    b = ids(2, 21, (7, 8, 11))  # shares hashes 7 and 8, then 5 tokens of hash 11
    c = ids(3, 40, (7, 8, 9))  # shares 7, 8, 9; 16 tokens past its hashes
    assert a[:16] == b[:16] and a[16:21] != b[16:21]
    assert a[:24] == c[:24] and a[24:30] != c[24:30]
    assert ids(4, 27, (7, 8, 9, 10)) == a[:27]  # a shorter prompt: a prefix of the ids
    # past the hashes: the request's own ids (the seed of a prompt without hashes)
    assert c[24:] == prompt_token_ids(PromptSpec(40), 3, 1000, seed=1)[:16]
    assert ids(5, 40, (7, 8, 9))[24:] != c[24:]
    assert ids(1, 30, (7, 8, 9, 10)) == a  # deterministic
    with pytest.raises(ValueError, match="hash_block_tokens"):
        PromptSpec(10, (1, 2))


def test_admitted_with_cached_blocks_computes_from_the_prefix_on():
    """Request 5 is admitted with two cached blocks (8 tokens) of a 11-token prompt: its
    step computes tokens 8-10 into its third block, attending over all 11."""
    mirror = RequestMirror(vocab_size=1000, block_size=BLOCK, block_id_offset=1)
    spec = PromptSpec(11, (21, 22, 23), BLOCK)
    mirror.add_prompt(5, spec)
    out = output([ScheduledRequest(5, 8, 3, (2, 6, 9), False, True, new_table=True)])
    mirror.apply(out, {})
    batch = mirror.build(out, 100)
    tokens = prompt_token_ids(spec, 5, 1000)
    assert mirror.tokens[5] == tokens
    assert batch.input_ids.tolist() == tokens[8:11]
    assert batch.positions.tolist() == [8, 9, 10]
    assert batch.slot_mapping.tolist() == [10 * BLOCK, 10 * BLOCK + 1, 10 * BLOCK + 2]
    assert batch.block_tables.tolist() == [[3, 7, 10]]
    assert batch.seq_lens.tolist() == [11] and batch.query_start_loc.tolist() == [0, 3]
    assert batch.logits_indices.tolist() == [2] and batch.max_query_len == 3


def test_a_cache_hit_without_hashed_prompt_ids_is_refused():
    mirror = RequestMirror(vocab_size=1000, block_size=BLOCK)
    out = output([ScheduledRequest(5, 8, 3, (2, 6, 9), False, True, new_table=True)])
    with pytest.raises(PromptError, match="request 5 was admitted with 8 prefix-cached"):
        mirror.apply(out, {5: 11})


def drive(sched, mirror: RequestMirror, prompt_len: dict[int, int]) -> dict[str, int]:
    """Run to completion with a fake executor, checking the mirror against the scheduler."""
    seen = {"new_table": 0, "preempted": 0, "migrations": 0}
    now = 0.0
    while sched.has_unfinished():
        out = sched.schedule()
        mirror.apply(out, prompt_len)
        seen["preempted"] += len(out.preempted_ids)
        seen["new_table"] += sum(s.new_table for s in out.scheduled)
        if out.elastic is not None:
            seen["migrations"] += len(out.elastic.migrations)
        batch = mirror.build(out, sched.make_stats().num_usable_blocks)
        for req in sched.running:
            if req.request_id in mirror.tables:
                assert list(mirror.tables[req.request_id]) == list(req.block_ids)
        assert batch.num_tokens == out.num_scheduled_tokens
        ids = np.zeros(len(batch.sample_request_ids), dtype=np.int64)
        mirror.append_sampled(batch.sample_request_ids, ids)
        now += 1.0
        for req in sched.update(out, now):
            mirror.finish([req.request_id])
        for req_id, tokens in mirror.tokens.items():
            req = sched.requests[req_id]
            assert len(tokens) == req.num_tokens
    return seen


@pytest.mark.parametrize("policy, drain", [
    (Policy.STATIC, DrainStrategy.PREEMPT),
    (Policy.ELASTIC, DrainStrategy.PREEMPT),
    (Policy.ELASTIC, DrainStrategy.MIGRATE),
    (Policy.OVERCOMMIT, DrainStrategy.PREEMPT),
])
def test_mirror_tracks_scheduler_tables(policy, drain):
    elastic = 0 if policy is Policy.STATIC else 24
    sched = make_scheduler(16, policy=policy, num_elastic_blocks=elastic, drain=drain,
                           block_bytes=10, max_num_batched_tokens=32, max_num_seqs=6, block_size=BLOCK,
                           hash_block_tokens=BLOCK)
    mirror = RequestMirror(vocab_size=50, block_size=BLOCK)
    requests = [request(i, prompt=6 + 5 * (i % 4), output=8 + 3 * (i % 3)) for i in range(10)]
    for req in requests:
        sched.add_request(req)
    seen = drive(sched, mirror, {r.request_id: r.num_prompt_tokens for r in requests})
    done = {RequestStatus.FINISHED, RequestStatus.FAILED_OOM}
    assert all(r.status in done for r in requests)
    if policy is not Policy.OVERCOMMIT:
        assert all(r.status is RequestStatus.FINISHED for r in requests)
    assert seen["new_table"] >= (1 if policy is Policy.OVERCOMMIT else 10)
    assert not mirror.tables and not mirror.tokens
    if policy is Policy.STATIC:
        assert seen["preempted"] > 0  # 16 blocks cannot hold six growing requests
    if drain is DrainStrategy.MIGRATE:
        assert seen["migrations"] > 0


@pytest.mark.parametrize("policy, drain", [
    (Policy.STATIC, DrainStrategy.PREEMPT),
    (Policy.ELASTIC, DrainStrategy.MIGRATE),
])
def test_mirror_tracks_scheduler_tables_with_prefix_hits(policy, drain):
    elastic = 0 if policy is Policy.STATIC else 24
    sched = make_scheduler(16, policy=policy, num_elastic_blocks=elastic, drain=drain,
                           block_bytes=10, max_num_batched_tokens=32, max_num_seqs=6,
                           block_size=BLOCK, hash_block_tokens=2 * BLOCK,
                           enable_prefix_caching=True)
    mirror = RequestMirror(vocab_size=50, block_size=BLOCK)
    # three stems of 8 tokens, then hashes of the request's own
    requests = [request(i, prompt=12 + 5 * (i % 4), output=8 + 3 * (i % 3),
                        hashes=(i % 3, 100 + i, 200 + i)) for i in range(10)]
    for req in requests:
        sched.add_request(req)
        mirror.add_prompt(req.request_id,
                          PromptSpec(req.num_prompt_tokens, req.block_hashes, 2 * BLOCK))
    drive(sched, mirror, {})
    assert all(r.status is RequestStatus.FINISHED for r in requests)
    assert sum(r.num_cached_tokens for r in requests) > 0
    assert not mirror.tables and not mirror.tokens


def test_scattered_tables_stay_distinct_and_usable():
    from gpu_backend.engine.shapes import decode_shape, engine_step, scatter_tables

    shape = decode_shape(6, 100)  # 6 sequences of 7 blocks: 42 blocks side by side
    mirror, out = engine_step(shape, 16, 1000, 128)
    before = {r: list(t) for r, t in mirror.tables.items()}
    assert sorted(b for t in before.values() for b in t) == list(range(42))
    scatter_tables(mirror, 1000, seed=5)
    blocks = [b for t in mirror.tables.values() for b in t]
    assert len(set(blocks)) == 42 and max(blocks) < 999  # a permutation of the usable blocks
    assert blocks != list(range(42)) and max(blocks) > 100  # spread over the pool
    assert [len(t) for t in mirror.tables.values()] == [len(t) for t in before.values()]
    mirror.check_usable(mirror.tables, 999)  # the device ids stay inside the pool
    batch = mirror.build(out, 1000)
    assert batch.block_tables.max() == max(blocks) + 1  # device id = core id + 1


def test_block_tables_grow_track_their_largest_id_and_remap():
    from gpu_backend.engine.block_tables import BlockTables

    tables = BlockTables()
    tables[7] = (4, 2)
    for start in range(10, 60, 5):  # many small appends: capacity grows past its first size
        tables.extend(7, list(range(start, start + 5)))
    tables.extend(7, [])
    assert list(tables[7]) == [4, 2, *range(10, 60)] and tables.max_id(7) == 59
    tables[8] = []
    assert tables.max_id(8) == -1 and tables.length(8) == 0
    with pytest.raises(ValueError):
        tables[7][0] = 1  # reads are read-only views; writes go through the table
    tables.remap({59: 3, 4: 1, 1000: 5})  # migrated elastic blocks move to base ids
    assert list(tables[7])[:2] == [1, 2] and tables[7][-1] == 3 and tables.max_id(7) == 58
    out = np.full((2, 60), -9, dtype=np.int32)
    tables.fill_rows(out, [8, 7], offset=1)
    assert (out[0] == -9).all() and list(out[1, :52]) == [x + 1 for x in tables[7]]
    assert (out[1, 52:] == -9).all()
    remapped = list(tables[7])
    assert list(tables.pop(7)) == remapped
    assert 7 not in tables and len(tables) == 1 and tables.pop(7) is None


def test_spread_decode_shape_is_seeded_and_within_its_bounds():
    from gpu_backend.engine.shapes import spread_decode_shape

    shape = spread_decode_shape(40, 200, 2000, seed=3)
    assert len(shape.decodes) == 40 and 200 <= min(shape.decodes) and max(shape.decodes) <= 2000
    assert shape == spread_decode_shape(40, 200, 2000, seed=3)
    assert shape != spread_decode_shape(40, 200, 2000, seed=4)
    assert max(shape.decodes) > 2 * min(shape.decodes)  # uneven: what the grid lacked
