"""The block pool against a from-scratch model of the same rules, operation by operation.

The pool keeps its free stack, LRU and names in numpy arrays with lazy removal and several
shortcuts (one-block evictions, scan windows, compaction). The model keeps plain lists, dicts
and an OrderedDict. Random sequences of allocations, frees, namings, prefix hits and elastic
state changes must give the same block ids, in the same order, and the same counts."""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core import block_cache, block_pool
from sim.core.block_pool import BlockPool, ElasticBusyError, ElasticState


class ModelPool:
    """Base free blocks on a stack (last freed first out), attached free elastic blocks
    freed ones last-freed-first then never-used ones lowest first, named free blocks in an
    LRU (oldest evicted first, elastic ones skipped while the region is not lendable)."""

    def __init__(self, num_base: int, num_elastic: int) -> None:
        self.num_base, self.num_elastic = num_base, num_elastic
        self.stack = list(range(num_base - 1, -1, -1))  # the end is the top
        self.free_elastic: list[int] = []
        self.fresh: list[int] = []  # never-used attached elastic blocks, lowest first
        self.ref = [0] * (num_base + num_elastic)
        self.key_of: dict[int, int] = {}
        self.block_of: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.state = ElasticState.DETACHED
        self.num_evicted = self.cache_epoch = self.num_freed_blocks = self.num_named = 0

    def attached(self) -> bool:
        return self.state is ElasticState.ATTACHED

    def counts(self) -> tuple:
        used = [b for b, r in enumerate(self.ref) if r]
        num_used_elastic = sum(1 for b in used if b >= self.num_base)
        free = len(self.stack) + sum(1 for b in self.lru if b < self.num_base)
        if self.attached():
            free += len(self.free_elastic) + len(self.fresh) + sum(
                1 for b in self.lru if b >= self.num_base)
        return (free, len(used) - num_used_elastic, num_used_elastic, self.num_evicted,
                self.cache_epoch, self.num_freed_blocks, self.num_named)

    def allocate(self, n: int) -> list[int] | None:
        if n <= len(self.stack):
            taken = self.stack[len(self.stack) - n:] if n > 0 else []
            del self.stack[len(self.stack) - len(taken):]
        elif n > self.counts()[0]:
            return None
        else:
            taken = self.stack[::-1]
            self.stack = []
            if self.attached():
                while len(taken) < n and self.free_elastic:
                    taken.append(self.free_elastic.pop())
                while len(taken) < n and self.fresh:
                    taken.append(self.fresh.pop(0))
            reachable = [b for b in self.lru if self.attached() or b < self.num_base]
            evicted = reachable[:n - len(taken)]
            for b in evicted:
                del self.lru[b]
                del self.key_of[b]
            self.num_evicted += len(evicted)
            taken += evicted
        for b in taken:
            self.ref[b] = 1
        return taken

    def free(self, ids: list[int]) -> None:
        if any(self.ref[b] == 0 for b in ids):
            raise ValueError("freed but not allocated")
        freed = []
        for b in ids:
            self.ref[b] -= 1
            if not self.ref[b]:
                freed.append(b)
        self.num_freed_blocks += len(freed)
        named_elastic = False
        for b in freed:
            if b in self.key_of:
                self.lru[b] = None
                named_elastic |= b >= self.num_base
            elif b >= self.num_base:
                self.free_elastic.append(b)
            else:
                self.stack.append(b)
        if named_elastic and not self.attached():
            self.cache_epoch += 1

    def register(self, ids: list[int], keys: list[int]) -> None:
        for b, k in zip(ids, keys):
            assert b not in self.key_of, "only blocks without a name are registered"
            if self.key_of.get(self.block_of.get(k, -1)) != k:  # nobody holds the key
                self.key_of[b] = k
                self.block_of[k] = b
                self.num_named += 1

    def cached_block(self, key: int) -> int | None:
        b = self.block_of.get(key)
        if b is None or self.key_of.get(b) != key:
            return None
        if b >= self.num_base and not self.attached() and self.ref[b] == 0:
            return None
        return b

    def cached_run(self, keys: list[int]) -> list[int]:
        run = []
        for key in keys:
            block_id = self.cached_block(key)
            if block_id is None:
                break
            run.append(block_id)
        return run

    def touch(self, ids: list[int]) -> None:
        for b in ids:
            if self.ref[b] == 0:
                del self.lru[b]
            self.ref[b] += 1

    def attach(self, n: int) -> None:
        self.fresh = list(range(self.num_base, self.num_base + n))
        self.free_elastic = []
        self.state = ElasticState.ATTACHED
        self.cache_epoch += 1

    def set_state(self, state: ElasticState) -> None:
        if self.state is not state:
            self.state = state
            self.cache_epoch += 1

    def detach(self) -> None:
        if any(self.ref[self.num_base:]):
            raise ElasticBusyError("busy")
        for b in [b for b in self.lru if b >= self.num_base]:
            del self.lru[b]
            del self.key_of[b]
        self.free_elastic, self.fresh = [], []
        self.state = ElasticState.DETACHED
        self.cache_epoch += 1  # even when it was detached already


def pool_counts(pool: BlockPool) -> tuple:
    return (pool.num_free_blocks, pool.num_used_base, pool.num_used_elastic, pool.num_evicted,
            pool.cache_epoch, pool.num_freed_blocks, pool.num_named)


NUM_KEYS = 40

operation = st.one_of(
    st.tuples(st.just("prompt"), st.integers(1, 24), st.integers(0, NUM_KEYS - 1)),
    st.tuples(st.just("prompt"), st.integers(1, 4), st.integers(0, NUM_KEYS - 1)),
    st.tuples(st.just("grow"), st.integers(0, 50), st.integers(0, 3)),
    st.tuples(st.just("allocate"), st.integers(0, 30)),
    st.tuples(st.just("chunk"), st.integers(0, 30)),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.just("free_table"), st.integers(0, 50)),
    st.tuples(st.just("register"), st.integers(0, 50), st.integers(0, NUM_KEYS - 1)),
    st.tuples(st.just("hit"), st.integers(0, NUM_KEYS - 1), st.integers(1, 12)),
    st.tuples(st.just("elastic"), st.sampled_from(["attach", "drain", "resume", "detach"]),
              st.integers(1, 12)),
    st.tuples(st.just("elastic"), st.sampled_from(["attach", "drain", "resume"]),
              st.integers(1, 12)),
)


def replay(num_base: int, num_elastic: int, ops: list[tuple]) -> None:
    """Apply `ops` to a pool and the model; everything observable must agree after each."""
    pool, model = BlockPool(num_base, num_elastic), ModelPool(num_base, num_elastic)
    held: list[list[int]] = []  # blocks of live holders ("requests"), in table order
    chunks: list = []  # arrays allocate_blocks gave, with the lists they were then
    chunk_lists: list[list[int]] = []
    covered = 0
    for op in ops:
        kind = op[0]
        if kind == "prompt":  # as the scheduler admits a prompt: hits, new blocks, names
            keys = [(op[2] + i) % NUM_KEYS for i in range(op[1])]
            covered = _cover(pool, keys, covered)
            hits = pool.cached_run(_array(keys), 0, len(keys)).tolist()
            assert hits == model.cached_run(keys), op
            if pool.can_allocate(len(keys) - len(hits) + pool.num_unreferenced(_array(hits))):
                pool.touch(_array(hits))
                model.touch(hits)
                got, want = pool.allocate(len(keys) - len(hits)), model.allocate(len(keys) - len(hits))
                assert got == want, op
                pool.register(got, _array(keys[len(hits):]))
                model.register(got, keys[len(hits):])
                held.append(hits + got)
        elif kind == "grow" and held:  # a decode step's blocks
            blocks = held[op[1] % len(held)]
            got, want = pool.allocate(op[2]), model.allocate(op[2])
            assert got == want, op
            blocks += got or []
        elif kind == "allocate":
            got, want = pool.allocate(op[1]), model.allocate(op[1])
            assert got == want, op
            if got:
                held.append(got)
        elif kind == "chunk":  # as a prompt's chunk is allocated under prefix caching
            array, want = pool.allocate_blocks(op[1]), model.allocate(op[1])
            assert (None if array is None else array.tolist()) == want, op
            if want:
                chunks.append(array)  # kept as the array: it must not change under the pool
                held.append(want)
        elif kind == "free" and held:
            blocks = held.pop(op[1] % len(held))
            pool.free(blocks[::-1])
            model.free(blocks[::-1])
        elif kind == "free_table" and held:  # as the prefix cache frees a request's table
            tail_first = held.pop(op[1] % len(held))[::-1]
            own = [b for b in tail_first if b not in model.key_of]  # unnamed: never shared
            named = [b for b in tail_first if b in model.key_of]
            pool.free_table(_array(own), _array(named))
            model.free(tail_first)
        elif kind == "register" and held:  # a holder's blocks without a name yet
            blocks = [b for b in held[op[1] % len(held)] if b not in model.key_of][:NUM_KEYS]
            if not blocks:
                continue
            keys = [(op[2] + i) % NUM_KEYS for i in range(len(blocks))]
            covered = _cover(pool, keys, covered)
            pool.register(blocks[:len(keys)], _array(keys))
            model.register(blocks[:len(keys)], keys)
        elif kind == "hit":
            keys = [(op[1] + i) % NUM_KEYS for i in range(op[2])]
            covered = _cover(pool, keys, covered)
            hits = pool.cached_run(_array(keys), 0, len(keys)).tolist()
            assert hits == model.cached_run(keys), op
            assert [pool.cached_block(k) for k in keys] == [model.cached_block(k) for k in keys]
            assert pool.num_unreferenced(_array(hits)) == sum(1 for b in hits if not model.ref[b])
            if hits:
                pool.touch(_array(hits))
                model.touch(hits)
                held.append(hits)
        elif kind == "elastic" and num_elastic:
            _elastic(pool, model, op[1], min(op[2], num_elastic))
        assert pool_counts(pool) == model.counts(), op
        assert pool.can_allocate(3) == (3 <= model.counts()[0])
        chunk_lists += [array.tolist() for array in chunks[len(chunk_lists):]]
        assert [array.tolist() for array in chunks] == chunk_lists, op
        pool.check_invariants()


def _cover(pool: BlockPool, keys: list[int], covered: int) -> int:
    """Keys come into use a few at a time, as a trace's chains do."""
    if max(keys) >= covered:
        covered = max(keys) + 1
        pool.cover_keys(covered)
    return covered


def _elastic(pool: BlockPool, model: ModelPool, action: str, num: int) -> None:
    if action == "attach" and pool.elastic_state is ElasticState.DETACHED:
        pool.attach_elastic(num)
        model.attach(num)
    elif action == "drain":
        pool.start_draining()
        if model.state is ElasticState.ATTACHED:
            model.set_state(ElasticState.DRAINING)
    elif action == "resume":
        pool.resume_lending()
        if model.state is ElasticState.DRAINING:
            model.set_state(ElasticState.ATTACHED)
    elif action == "detach":
        busy = any(model.ref[model.num_base:])
        if busy:
            with pytest.raises(ElasticBusyError):
                pool.detach_elastic()
        else:
            pool.detach_elastic()
            model.detach()


def _array(values: list[int]):
    import numpy as np
    return np.array(values, dtype=np.int64)


@contextmanager
def tiny_windows():
    """Scan windows of one entry, compaction after a few dead entries and every list of
    blocks packed by struct: every path that only exists for speed is taken."""
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


pools = st.tuples(st.integers(1, 32), st.sampled_from([0, 0, 3, 12]))


@settings(max_examples=300, deadline=None)
@given(pool=pools, ops=st.lists(operation, min_size=10, max_size=100))
def test_pool_gives_the_models_blocks_in_the_models_order(pool, ops):
    replay(*pool, ops)


@settings(max_examples=150, deadline=None)
@given(pool=pools, ops=st.lists(operation, min_size=10, max_size=100))
def test_pool_with_one_entry_scan_windows_matches_the_model(pool, ops):
    with tiny_windows():
        replay(*pool, ops)


def test_model_replay_reaches_the_one_block_eviction_and_the_bulk_eviction():
    """A full cache of named blocks: a decode-sized allocation and a chunk-sized one both
    evict, oldest first."""
    ops = [("allocate", 20), ("register", 0, 0), ("free", 0),
           ("allocate", 1), ("allocate", 12), ("hit", 19, 3)]
    replay(20, 0, ops)
    pool = BlockPool(20)
    pool.cover_keys(NUM_KEYS)
    blocks = pool.allocate(20)
    pool.register(blocks, _array(list(range(20))))  # key i names the table's i-th block
    pool.free(blocks[::-1])  # tail first: the table's last block is the oldest
    assert pool.allocate(1) == [blocks[19]] and pool.num_evicted == 1
    assert pool.allocate(12) == blocks[18:6:-1] and pool.num_evicted == 13
    assert pool.cached_block(6) == blocks[6] and pool.cached_block(7) is None


def test_model_replay_evicts_base_blocks_only_while_the_elastic_region_drains():
    """Cached elastic blocks freed while draining are out of reach: an allocation evicts the
    oldest base blocks past them."""
    ops = [("elastic", "attach", 4), ("prompt", 8, 0), ("elastic", "drain", 1), ("free", 0),
           ("hit", 0, 8), ("free", 0), ("allocate", 3), ("elastic", "resume", 1),
           ("allocate", 3), ("hit", 0, 8)]
    replay(4, 4, ops)
    pool = BlockPool(4, 4)
    pool.cover_keys(NUM_KEYS)
    pool.attach_elastic()
    blocks = pool.allocate(8)
    pool.register(blocks, _array(list(range(8))))
    pool.start_draining()
    pool.free(blocks[::-1])  # the elastic tail first: the oldest cached blocks
    assert pool.allocate(3) == blocks[3:0:-1]
