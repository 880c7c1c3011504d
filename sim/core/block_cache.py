"""The prefix cache's side of the block pool: content keys of full blocks, and the LRU of
cached blocks that no request holds (they count as free until an allocation evicts them).

A Mooncake-style run names, frees and evicts millions of blocks, and at that count the LRU's
cost per block is most of the run. So the LRU is a deque of block ids with lazy removal, not
an OrderedDict: a block leaves the middle of it (a prefix hit takes it back) by counting one
more stale entry for that block (`_stale`), and the oldest entries are popped at eviction,
each stale one skipped and uncounted. A block has at most one live entry, its newest, so the
first `_stale[b]` entries of `b` met from the front are the stale ones. Stale entries are
swept out once there are SWEEP_FACTOR times as many as blocks.

A block is in the LRU exactly when it is named and no request references it.

`block_of` (key -> block) is cleaned lazily too: evicting a block only clears `key_of`, and an
entry of `block_of` counts only while `key_of` of its block still names its key (`lookup`).
A dict delete at every eviction missed the CPU's caches on a table of millions of keys; stale
entries are swept once there are SWEEP_FACTOR times as many as blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

MIN_SWEEP_ENTRIES = 1 << 12
SWEEP_FACTOR = 4  # stale entries allowed per block before a sweep (each sweep is O(blocks))


class BlockCache:
    def __init__(self, num_blocks: int, num_base_blocks: int) -> None:
        self.num_base_blocks = num_base_blocks
        self.key_of: list[Hashable | None] = [None] * num_blocks
        self.block_of: dict[Hashable, int] = {}  # may hold stale entries: see lookup()
        self._num_stale_names = 0
        self._lru: deque[int] = deque()
        self._stale = [0] * num_blocks
        self.num_free_base = 0  # cached base blocks no request holds
        self.free_elastic: set[int] = set()  # cached elastic blocks no request holds

    @property
    def num_free(self) -> int:
        """Live LRU entries: cached blocks no request holds."""
        return self.num_free_base + len(self.free_elastic)

    # ------------------------------------------------------------------ names
    @property
    def in_use(self) -> bool:
        """Has any block ever been named (is prefix caching at work)?"""
        return bool(self.block_of)

    def lookup(self, key: Hashable) -> int | None:
        """The block named `key`, if one is."""
        block_id = self.block_of.get(key)
        if block_id is None or self.key_of[block_id] != key:
            return None
        return block_id

    def name(self, block_ids: list[int], keys: Sequence[Hashable]) -> None:
        """Name full, used blocks by their content keys. A key already cached elsewhere, or
        a block already named, is left as it is."""
        key_of, block_of = self.key_of, self.block_of
        for block_id, key in zip(block_ids, keys):
            if key_of[block_id] is not None:
                continue
            holder = block_of.get(key)
            if holder is None:
                block_of[key] = block_id
            elif key_of[holder] != key:  # a stale entry: take it over
                block_of[key] = block_id
                self._num_stale_names -= 1
            else:
                continue
            key_of[block_id] = key

    def _unname(self, block_id: int) -> Hashable:
        key = self.key_of[block_id]
        self.key_of[block_id] = None
        self._num_stale_names += 1
        return key

    def maybe_sweep_names(self) -> None:
        """Drop `block_of`'s stale entries once they outnumber the blocks."""
        if self._num_stale_names > SWEEP_FACTOR * len(self.key_of) + MIN_SWEEP_ENTRIES:
            self.block_of = {key: block_id for block_id, key in enumerate(self.key_of)
                             if key is not None}
            self._num_stale_names = 0

    # -------------------------------------------------------------------- LRU
    def push(self, block_ids: list[int], num_base: int) -> None:
        """Named blocks came free, in this order (`num_base` of them base blocks): they
        become the newest cached blocks."""
        self._lru.extend(block_ids)
        self.num_free_base += num_base
        if num_base < len(block_ids):
            self.free_elastic.update(b for b in block_ids if b >= self.num_base_blocks)

    def take(self, block_ids: list[int], num_base: int) -> None:
        """Cached free blocks are referenced again (prefix hits): out of the LRU."""
        stale = self._stale
        for block_id in block_ids:
            stale[block_id] += 1
        self.num_free_base -= num_base
        if num_base < len(block_ids):
            self.free_elastic.difference_update(block_ids)

    def evict_oldest(self, num_blocks: int) -> tuple[list[int], list[Hashable]]:
        """Evict the `num_blocks` oldest cached blocks (the caller knows there are as many):
        their ids and their keys, now forgotten."""
        popleft, stale, key_of = self._lru.popleft, self._stale, self.key_of
        evicted: list[int] = []
        for _ in range(num_blocks):
            block_id = popleft()
            while stale[block_id]:  # entries of blocks taken back since: skip them
                stale[block_id] -= 1
                block_id = popleft()
            evicted.append(block_id)
        keys = [key_of[block_id] for block_id in evicted]
        for block_id in evicted:
            key_of[block_id] = None
        self._num_stale_names += num_blocks
        if self._num_stale_names > SWEEP_FACTOR * len(key_of):
            self.maybe_sweep_names()
        if self.free_elastic:
            self.free_elastic.difference_update(evicted)
            self.num_free_base -= sum(1 for b in evicted if b < self.num_base_blocks)
        else:
            self.num_free_base -= num_blocks
        return evicted, keys

    def evict_oldest_base(self, num_blocks: int) -> tuple[list[int], list[Hashable]]:
        """As `evict_oldest`, skipping elastic blocks (the region is not lendable)."""
        order = self.live_order()
        evicted = [b for b in order if b < self.num_base_blocks][:num_blocks]
        self.take(evicted, len(evicted))
        keys = [self._unname(block_id) for block_id in evicted]
        self._sweep()
        return evicted, keys

    def drop_elastic(self) -> list[Hashable]:
        """Forget every cached elastic block (the region is unmapped: content undefined)."""
        if not self.free_elastic:
            return []
        elastic = sorted(self.free_elastic)
        self.take(elastic, 0)
        keys = [self._unname(block_id) for block_id in elastic]
        self._sweep()
        return keys

    def live_order(self) -> list[int]:
        """The live entries, oldest first."""
        stale = list(self._stale)
        live = []
        for block_id in self._lru:
            if stale[block_id]:
                stale[block_id] -= 1
            else:
                live.append(block_id)
        return live

    def maybe_sweep(self) -> None:
        """Sweep stale entries out once they outnumber the pool's blocks several times over
        (evictions skip them anyway: this only bounds the deque while none happen)."""
        if len(self._lru) > self.num_free + SWEEP_FACTOR * len(self._stale) + MIN_SWEEP_ENTRIES:
            self._sweep()

    def _sweep(self) -> None:
        """Rebuild the deque from its live entries; every stale count goes back to 0."""
        self._lru = deque(self.live_order())
        self._stale = [0] * len(self._stale)
