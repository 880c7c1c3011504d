"""The prefix cache's side of the block pool: content keys of full blocks, and the LRU of
cached blocks that no request holds (they count as free until an allocation evicts them).

A Mooncake-style run names, frees and evicts millions of blocks, and at that count the LRU's
cost per block is most of the run. So the LRU is a deque of block ids with lazy removal, not
an OrderedDict: a block leaves the middle of it (a prefix hit takes it back) by counting one
more stale entry for that block (`_stale`), and the oldest entries are popped at eviction,
each stale one skipped and uncounted. A block has at most one live entry, its newest, so the
first `_stale[b]` entries of `b` met from the front are the stale ones. Stale entries are
swept out once they outnumber the live ones.

A block is in the LRU exactly when it is named and no request references it; `in_lru` says
so from the pool's reference count.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

MIN_SWEEP_ENTRIES = 1 << 12


class BlockCache:
    def __init__(self, num_blocks: int, num_base_blocks: int) -> None:
        self.num_base_blocks = num_base_blocks
        self.key_of: list[Hashable | None] = [None] * num_blocks
        self.block_of: dict[Hashable, int] = {}
        self._lru: deque[int] = deque()
        self._stale = [0] * num_blocks
        self.num_free_base = 0  # cached base blocks no request holds
        self.free_elastic: set[int] = set()  # cached elastic blocks no request holds

    @property
    def num_free(self) -> int:
        """Live LRU entries: cached blocks no request holds."""
        return self.num_free_base + len(self.free_elastic)

    # ------------------------------------------------------------------ names
    def name(self, block_ids: list[int], keys: list[Hashable]) -> None:
        """Name full, used blocks by their content keys. A key already cached elsewhere, or
        a block already named, is left as it is."""
        key_of, block_of = self.key_of, self.block_of
        for block_id, key in zip(block_ids, keys):
            if key not in block_of and key_of[block_id] is None:
                key_of[block_id] = key
                block_of[key] = block_id

    def _unname(self, block_id: int) -> Hashable:
        key = self.key_of[block_id]
        self.key_of[block_id] = None
        del self.block_of[key]
        return key

    # -------------------------------------------------------------------- LRU
    def push(self, block_id: int) -> None:
        """A named block came free: it becomes the newest cached block."""
        self._lru.append(block_id)
        if block_id < self.num_base_blocks:
            self.num_free_base += 1
        else:
            self.free_elastic.add(block_id)

    def take(self, block_id: int) -> None:
        """A cached free block is referenced again (a prefix hit): out of the LRU."""
        self._stale[block_id] += 1
        if block_id < self.num_base_blocks:
            self.num_free_base -= 1
        else:
            self.free_elastic.discard(block_id)

    def evict_oldest(self, num_blocks: int) -> tuple[list[int], list[Hashable]]:
        """Evict the `num_blocks` oldest cached blocks (the caller knows there are as many):
        their ids and their keys, now forgotten."""
        lru, stale = self._lru, self._stale
        evicted: list[int] = []
        keys: list[Hashable] = []
        while len(evicted) < num_blocks:
            block_id = lru.popleft()
            if stale[block_id]:
                stale[block_id] -= 1
                continue
            evicted.append(block_id)
            keys.append(self._unname(block_id))
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
        keys = []
        for block_id in evicted:
            self.take(block_id)
            keys.append(self._unname(block_id))
        self._sweep()
        return evicted, keys

    def drop_elastic(self) -> list[Hashable]:
        """Forget every cached elastic block (the region is unmapped: content undefined)."""
        if not self.free_elastic:
            return []
        keys = []
        for block_id in sorted(self.free_elastic):
            self.take(block_id)
            keys.append(self._unname(block_id))
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
        if len(self._lru) > 2 * self.num_free + MIN_SWEEP_ENTRIES:
            self._sweep()

    def _sweep(self) -> None:
        """Rebuild the deque from its live entries; every stale count goes back to 0."""
        self._lru = deque(self.live_order())
        self._stale = [0] * len(self._stale)
