"""The prefix cache's shortcuts change nothing: a scheduler that keeps a waiting request's hits
across steps (cut at evictions) and skips checks that must fail again schedules exactly as
one that looks every prefix up from scratch at every step."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from core_helpers import make_scheduler, request
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core import block_cache, block_pool
from sim.core.elastic import DrainStrategy, Policy
from sim.core.prefix_cache import ChainIds, PrefixCache
from sim.core.request import RequestState


class FromScratch(PrefixCache):
    """The reference: every lookup walks the prompt's keys from the first, nothing kept."""

    def hits(self, req: RequestState) -> np.ndarray:
        keys = self.keys(req)
        max_hits = min(len(keys), (req.num_prompt_tokens + req.num_output_tokens - 1)
                       // self.block_size)
        hits = []
        for key in keys[:max_hits].tolist():  # one key at a time, through cached_block
            block_id = self.pool.cached_block(key)
            if block_id is None:
                break
            hits.append(block_id)
        return np.array(hits, dtype=np.int64)

    def still_refused(self, req: RequestState, num_new_blocks: int) -> bool:
        return False

    def refused_before_lookup(self, req: RequestState, budget: int) -> bool:
        return False


def build(from_scratch: bool, elastic: bool = False):
    """A 24-block pool; `elastic`: beside 3 elastic blocks, lent while all decode and
    drained by migration before a prefill."""
    more = dict(policy=Policy.ELASTIC, num_elastic_blocks=3,
                drain=DrainStrategy.MIGRATE) if elastic else {}
    sched = make_scheduler(24, block_size=4, max_num_batched_tokens=16, max_num_seqs=4,
                           enable_prefix_caching=True, hash_block_tokens=8, **more)
    if from_scratch:
        sched.prefix = FromScratch(sched.pool, 4, 8)
    return sched


def drive(sched, trace, check=None) -> list:
    """Arrivals at whole seconds, every step 1 s; the outputs and stats of every step.
    `check()`: called once each step is scheduled and once it is closed."""
    pending = list(enumerate(trace))
    steps, now = [], 0.0
    while pending or sched.has_unfinished():
        while pending and pending[0][1][3] <= now:
            i, (prompt, output, hashes, _) = pending.pop(0)
            sched.add_request(request(i, prompt, output, arrival_s=now, hashes=hashes))
        if not sched.has_unfinished():
            now = float(pending[0][1][3])
            continue
        out = sched.schedule()
        if check is not None:
            check()
        steps.append((out, sched.make_stats()))
        now += 1.0
        sched.update(out, now)
        if check is not None:
            check()
        sched.pool.check_invariants()
        assert len(steps) < 5_000
    return steps


# prompts of 8-40 tokens named by 1-5 hashes from a small alphabet: prefixes are shared,
# the 24-block pool fills, requests wait at the head and cached blocks are evicted
request_strategy = st.tuples(
    st.integers(8, 40), st.integers(1, 8),
    st.lists(st.integers(0, 3), min_size=1, max_size=5).map(tuple), st.integers(0, 6))


@settings(max_examples=60, deadline=None)
@given(trace=st.lists(request_strategy, min_size=1, max_size=20)
       .map(lambda rows: sorted(rows, key=lambda r: r[3])))
def test_kept_hits_and_skipped_checks_schedule_as_lookups_from_scratch(trace):
    assert drive(build(False), trace) == drive(build(True), trace)


@contextmanager
def tiny_windows():
    """Evictions and cached runs scan one entry at a time, the LRU queue is compacted after a
    few dead entries and every list of blocks is packed by struct: every path that only
    exists for speed is taken."""
    names = [(block_cache, "FIRST_SCAN"), (block_cache, "FEW_SCAN"), (block_pool, "FIRST_RUN"),
             (block_cache, "MIN_SWEEP_ENTRIES"), (block_cache, "SWEEP_FACTOR"),
             (block_cache, "PACKED_FROM")]
    saved = [getattr(module, name) for module, name in names]
    for module, name in names:
        setattr(module, name, 1)
    try:
        yield
    finally:
        for (module, name), value in zip(names, saved):
            setattr(module, name, value)


@settings(max_examples=40, deadline=None)
@given(trace=st.lists(request_strategy, min_size=1, max_size=20)
       .map(lambda rows: sorted(rows, key=lambda r: r[3])))
def test_scan_windows_and_compaction_change_no_schedule(trace):
    expected = drive(build(False), trace)
    with tiny_windows():
        assert drive(build(False), trace) == expected
        assert drive(build(True), trace) == expected


def test_a_waiting_request_is_refused_while_nothing_frees_and_admitted_after():
    sched = build(False)
    sched.add_request(request(0, 40, 30, hashes=(1, 2, 3, 4, 5)))  # 10 blocks, long decode
    sched.add_request(request(1, 40, 30, hashes=(6, 7, 8, 9, 10)))
    sched.add_request(request(2, 40, 2, hashes=(1, 2, 3, 4, 11)))  # shares 8 of 10 blocks
    admitted_at = None
    for step in range(200):
        out = sched.schedule()
        if any(s.request_id == 2 and s.new_table for s in out.scheduled):
            admitted_at = step
            break
        sched.update(out, float(step))
    assert admitted_at is not None, "request 2 should be admitted once blocks come free"
    assert sched.requests[2].num_cached_tokens > 0  # it hit request 0's blocks


def test_a_table_rewritten_in_place_is_given_back_as_it_is_now():
    """A migration moves a request's blocks within its table: what the prefix cache kept of
    the table as arrays is dropped, and the request's blocks are freed from its list."""
    sched = build(False)
    sched.add_request(request(0, 16, 8, hashes=(1, 2)))
    sched.update(sched.schedule(), 1.0)  # the prompt in one chunk: its 4 blocks named
    req = sched.running[0]
    before = list(req.block_ids)
    assert sched.prefix.blocks_tail_first(req).tolist() == before[::-1]
    moved = sched.pool.allocate(len(before))
    req.block_ids[:] = moved  # as the elastic controller migrates blocks, in place
    sched.pool.free(before[::-1])
    sched.table_changed(req)
    assert sched.prefix.blocks_tail_first(req).tolist() == moved[::-1]
    sched.update(sched.schedule(), 2.0)
    sched.pool.check_invariants()


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=8).map(tuple),
                     min_size=1, max_size=12),
       extra_tokens=st.integers(0, 7))
def test_keys_name_each_full_block_by_its_chain_and_place_in_it(rows, extra_tokens):
    """Block j of hash block i (8 tokens a hash, 4 a block: 2 blocks a hash) gets key
    chain x 2 + j, whichever runs of consecutive chain ids the prompt's chains make."""
    sched = build(False)
    reference = ChainIds()
    for i, row in enumerate(rows):
        num_prompt = 8 * len(row) - extra_tokens  # the last hash block may be cut short
        req = request(i, num_prompt, 1, hashes=row)
        num_full = num_prompt // 4
        chains = reference.of(row[:-(-num_full // 2)])  # the hashes of full blocks only
        expected = [chain * 2 + j for chain in chains for j in range(2)][:num_full]
        assert sched.prefix.keys(req).tolist() == expected


def interned_by_pair(rows: list[tuple[int, ...]]) -> list[list[int]]:
    """The reference: every chain (parent id, hash) looked up as a pair, ids in first-seen order."""
    interned: dict[tuple[int, int], int] = {}
    chains = []
    for row in rows:
        chain_id, chain = 0, []
        for block_hash in row:
            chain_id = interned.setdefault((chain_id, block_hash), len(interned) + 1)
            chain.append(chain_id)
        chains.append(chain)
    return chains


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.lists(st.integers(0, 4), max_size=8).map(tuple), max_size=12))
def test_chain_ids_are_those_of_pairs_interned_in_order(rows):
    """Hashes repeat within and across prompts under other parents: the by-hash shortcut
    must give every chain the id the pair would."""
    chain_ids = ChainIds()
    assert [chain_ids.of(row) for row in rows] == interned_by_pair(rows)
    assert len(chain_ids) == len({row[:i] for row in rows for i in range(1, len(row) + 1)})


def test_chain_ids_tell_a_hash_under_another_parent_apart():
    chain_ids = ChainIds()
    assert chain_ids.of((7, 8)) == [1, 2]
    assert chain_ids.of((9, 8, 8)) == [3, 4, 5]  # 8 after 9, then 8 after that 8
    assert chain_ids.of((7, 8, 8)) == [1, 2, 6]
    assert chain_ids.of((9, 8, 8, 7)) == [3, 4, 5, 7]


@pytest.mark.parametrize("elastic", [False, True])
@settings(max_examples=60, deadline=None)
@given(trace=st.lists(request_strategy, min_size=1, max_size=20)
       .map(lambda rows: sorted(rows, key=lambda r: r[3])))
def test_blocks_tail_first_are_each_running_tables_blocks_reversed(elastic, trace):
    """Hits, named blocks and the prompt's chunks kept as arrays, the rest from the table:
    once a step is scheduled (new blocks) and once it is closed (blocks named), for every
    running request, exactly its table, last block first."""
    sched = build(False, elastic)
    checked = []

    def check() -> None:
        for req in sched.running:
            assert sched.prefix.blocks_tail_first(req).tolist() == req.block_ids[::-1]
            checked.append(req.request_id)

    drive(sched, trace, check)
    assert checked
