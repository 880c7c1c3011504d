"""The prefix cache's side of the block pool: content keys of full blocks, and the LRU of
cached blocks that no request holds (they count as free until an allocation evicts them).

A Mooncake-style run names, frees, hits and evicts millions of blocks, a request's hundreds
at a time. So every operation takes a request's blocks as one numpy array: a Python loop per
block would be most of such a run.

Keys are non-negative ints, and sim.core.prefix_cache makes them dense (chain id x blocks
per hash + sub-block), so both directions are arrays: `key_of[block]` (NONE: unnamed) and
`block_of[key]`, grown by `cover` before any key past its end is used. An entry of
`block_of` counts only while `key_of` of its block still names its key, so naming and
evicting touch `key_of` alone where they can, and `key_of[block_of[keys]] == keys` is the
whole lookup. So `block_of` needs no "no block" value: a key never named reads block 0, whose
name is not that key, and the array grows as zeros, which the allocator hands out untouched. A
key is held by at most one block: `name` leaves a key alone that another block holds.

The LRU is a queue of pushed arrays (one per `push`, oldest first) with lazy removal. Each
push gets the next stamp (a push count) and records it per block, `pushed_at[block]`; a hit
that takes a block out of the LRU sets it to NONE, so an entry not yet consumed is live
exactly when `pushed_at[block] == stamp`. (A block is pushed again only once referenced
again, by a hit, which kills its older entry, or by an eviction, which consumed it.) A take
also marks the pushes whose entries it killed (`_stale`, by stamp): a push never marked is
live throughout, and most are (nine evictions in ten on a Mooncake run), so eviction takes a
slice of it without looking. Eviction consumes entries from the oldest, skipping dead ones
for good (a dead entry never lives again); the queue is compacted to its live entries once
dead ones outnumber the blocks SWEEP_FACTOR times.

A block is in the LRU exactly when it is named and no request references it.
"""

from __future__ import annotations

import mmap
import struct
from collections import deque
from dataclasses import dataclass

import numpy as np

NONE = -1
MIN_SWEEP_ENTRIES = 1 << 12
SWEEP_FACTOR = 4  # dead entries allowed per block before a compaction (each is O(blocks))
FIRST_SCAN = 64  # entries an eviction looks at first in a pushed array (then 4x as many)
FEW_BLOCKS = 8  # evictions of at most this many blocks try a plain loop first
FEW_SCAN = 32  # entries that loop looks at

Blocks = np.ndarray  # int64 block ids
EMPTY: Blocks = np.empty(0, dtype=np.int64)


PACKED_FROM = 32  # lists this long are converted through struct (numpy's own way is slower)


def as_blocks(block_ids: list[int] | Blocks) -> Blocks:
    """Block ids as an int64 array, read-only when converted from a list. A long list goes
    through `struct.pack`, about twice as fast as numpy's conversion, which checks each item
    for nesting before it converts it."""
    if isinstance(block_ids, list) and len(block_ids) >= PACKED_FROM:
        return np.frombuffer(struct.pack(f"{len(block_ids)}q", *block_ids), dtype=np.int64)
    return np.asarray(block_ids, dtype=np.int64)


def zeroed(num_entries: int) -> Blocks:
    """`num_entries` (> 0) int64 zeros in an anonymous memory map, whose pages the kernel
    zeroes on first touch, 4 KiB at a time. `block_of` is indexed by key, tens of MB on a
    Mooncake trace, and filled as keys come: numpy would ask for transparent huge pages for
    an array that large, whose first touch cost ~4x as much per MB on the 2-core VMs the
    simulator's speed is measured on."""
    return np.frombuffer(mmap.mmap(-1, num_entries * 8), dtype=np.int64)


@dataclass
class _Pushed:
    """One push's entries; those before `start` were consumed by evictions. `ahead`: the
    entries from `ahead_start` on, FEW_SCAN at most, as a list, and `ahead_live` which of
    them were live when it was made, made when small evictions reach them (a decode step's
    block at a time: one small conversion per run of them, not one numpy read per entry,
    nor a conversion of the whole push that bulk evictions would consume anyway). Only a
    `take` kills an entry, so it drops the window."""

    blocks: Blocks
    stamp: int
    start: int = 0
    ahead: list[int] | None = None
    ahead_live: list[bool] | None = None
    ahead_start: int = 0


class BlockCache:
    def __init__(self, num_blocks: int, num_base_blocks: int) -> None:
        self.num_base_blocks = num_base_blocks
        self.key_of = np.full(num_blocks, NONE, dtype=np.int64)
        self.block_of = np.zeros(0, dtype=np.int64)
        self.pushed_at = np.full(num_blocks, NONE, dtype=np.int64)
        self._stale = np.zeros(64, dtype=np.bool_)  # by stamp: did a take kill an entry?
        self.num_named = 0  # blocks named so far (a count to compare)
        self._queue: deque[_Pushed] = deque()
        self._num_entries = 0  # entries in the queue from their starts, dead ones included
        self._last_stamp = NONE  # the newest push's
        self.num_free_base = 0  # cached base blocks no request holds
        self.num_free_elastic = 0  # cached elastic blocks no request holds

    @property
    def num_free(self) -> int:
        """Live LRU entries: cached blocks no request holds."""
        return self.num_free_base + self.num_free_elastic

    # ------------------------------------------------------------------ names
    @property
    def in_use(self) -> bool:
        """Has any block ever been named (is prefix caching at work)?"""
        return self.num_named > 0

    def lookup(self, key: int) -> int | None:
        """The block named `key`, if one is."""
        if not 0 <= key < len(self.block_of):
            return None
        block_id = int(self.block_of[key])
        return block_id if self.key_of[block_id] == key else None

    def cover(self, key_limit: int) -> None:
        """Make room in `block_of` for every key below `key_limit`."""
        if key_limit > len(self.block_of):
            grown = zeroed(max(key_limit, 4 * len(self.block_of)))
            grown[:len(self.block_of)] = self.block_of
            self.block_of = grown

    def name(self, block_ids: Blocks, keys: np.ndarray) -> int:
        """Name full, used, unnamed blocks by their content keys (distinct keys, covered).
        A key already held by another block is left as it is. How many were named."""
        if not len(block_ids):
            return 0
        key_of, block_of = self.key_of, self.block_of
        fresh = key_of[block_of[keys]] != keys
        num_fresh = int(np.count_nonzero(fresh))
        if num_fresh == len(block_ids):  # the usual case: no mask to apply
            block_of[keys] = block_ids
            key_of[block_ids] = keys
        elif num_fresh:
            blocks, named = block_ids[fresh], keys[fresh]
            block_of[named] = blocks
            key_of[blocks] = named
        self.num_named += num_fresh
        return num_fresh

    def _unname(self, block_ids: Blocks) -> None:
        self.key_of[block_ids] = NONE

    # -------------------------------------------------------------------- LRU
    def push(self, block_ids: Blocks, num_base: int) -> None:
        """Named blocks came free, in this order (`num_base` of them base blocks): they
        become the newest cached blocks."""
        n = len(block_ids)
        self._queue.append(_Pushed(block_ids, self._next_stamp(block_ids)))
        self._num_entries += n
        self.num_free_base += num_base
        self.num_free_elastic += n - num_base

    def _next_stamp(self, block_ids: Blocks) -> int:
        """A new push's stamp, recorded for `block_ids`, its entries."""
        self._last_stamp += 1
        stamp = self._last_stamp
        if stamp == len(self._stale):
            self._stale = np.concatenate((self._stale, np.zeros(stamp, dtype=np.bool_)))
        self.pushed_at[block_ids] = stamp
        return stamp

    def take(self, block_ids: Blocks, num_base: int) -> None:
        """Cached free blocks are referenced again (prefix hits): out of the LRU."""
        pushed_at = self.pushed_at
        self._stale[pushed_at[block_ids]] = True  # the pushes holding their entries
        pushed_at[block_ids] = NONE  # those entries are dead
        if self._queue:
            self._queue[0].ahead = None  # its liveness may be out of date
        self.num_free_base -= num_base
        self.num_free_elastic -= len(block_ids) - num_base

    def evict_oldest(self, num_blocks: int) -> Blocks | list[int]:
        """Evict the `num_blocks` oldest cached blocks (the caller knows there are as many):
        their ids, their keys now forgotten. A few (a decode step's) are looked for one entry
        at a time first: numpy's cost per call is more than a short loop's."""
        if num_blocks <= FEW_BLOCKS:
            few = self.evict_few(num_blocks)
            if few is not None:
                return few
        if not self._queue:
            raise AssertionError("the LRU ran out of cached blocks")
        evicted = self._pop_front(num_blocks)
        if len(evicted) < num_blocks:  # the front push ran out: on to the next ones
            parts = [evicted]
            need = num_blocks - len(evicted)
            while need:
                if not self._queue:
                    raise AssertionError("the LRU ran out of cached blocks")
                parts.append(self._pop_front(need))
                need -= len(parts[-1])
            evicted = np.concatenate(parts)
        self.key_of[evicted] = NONE
        num_elastic = int(np.count_nonzero(evicted >= self.num_base_blocks)) \
            if self.num_free_elastic else 0
        self.num_free_elastic -= num_elastic
        self.num_free_base -= num_blocks - num_elastic
        return evicted

    def evict_one(self) -> int | None:
        """`evict_oldest(1)` for a decode step's block: the front push's first live entry
        in the rest of its `ahead` window, or None (and no change) if all of those are dead."""
        front, ahead, live = self._ahead()
        offset, start = front.ahead_start, front.start
        for i in range(start - offset, len(ahead)):
            if live[i]:
                break
        else:
            return None
        block_id = ahead[i]
        self._consume_front(front, offset + i + 1)
        self.key_of[block_id] = NONE
        if block_id < self.num_base_blocks:
            self.num_free_base -= 1
        else:
            self.num_free_elastic -= 1
        return block_id

    def evict_few(self, num_blocks: int) -> list[int] | None:
        """`evict_oldest` by a loop over the front's `ahead` window, or None (and no change)
        when the rest of the window does not hold enough live entries."""
        front, ahead, live = self._ahead()
        offset, start = front.ahead_start, front.start
        evicted = []
        for i in range(start - offset, len(ahead)):
            if live[i]:
                evicted.append(ahead[i])
                if len(evicted) == num_blocks:
                    break
        else:
            return None
        self._consume_front(front, offset + i + 1)
        key_of, num_base = self.key_of, self.num_base_blocks
        for block_id in evicted:
            key_of[block_id] = NONE
            if block_id < num_base:
                self.num_free_base -= 1
            else:
                self.num_free_elastic -= 1
        return evicted

    def _ahead(self) -> tuple[_Pushed, list[int], list[bool]]:
        """The front push with its `ahead` window and the window's liveness, made anew
        when dropped or used up."""
        if not self._queue:
            raise AssertionError("the LRU ran out of cached blocks")
        front = self._queue[0]
        ahead, live, start = front.ahead, front.ahead_live, front.start
        if ahead is None or live is None or start - front.ahead_start >= len(ahead):
            window = front.blocks[start:start + FEW_SCAN]
            ahead = front.ahead = window.tolist()
            live = front.ahead_live = (self.pushed_at[window] == front.stamp).tolist() \
                if self._stale[front.stamp] else [True] * len(ahead)
            front.ahead_start = start
        return front, ahead, live

    def _consume_front(self, front: _Pushed, start: int) -> None:
        """The front push's entries before `start` are consumed."""
        self._num_entries -= start - front.start
        front.start = start
        if start == len(front.blocks):
            self._queue.popleft()

    def _pop_front(self, need: int) -> Blocks:
        """Up to `need` live entries from the oldest pushed array, consumed from the queue.
        From a push no take touched (the usual case), or where every entry scanned is live,
        they are a slice of the array."""
        front = self._queue[0]
        blocks, start = front.blocks, front.start
        size = len(blocks)
        if not self._stale[front.stamp]:  # every entry of it is live
            taken = blocks[start:start + need]
            self._consume_front(front, start + len(taken))
            return taken
        scan = max(FIRST_SCAN, need)
        while True:
            stop = min(size, start + scan)
            window = blocks[start:stop]
            live = self.pushed_at[window] == front.stamp
            num_live = np.count_nonzero(live)
            if num_live >= need or stop == size:
                break
            scan *= 4
        if num_live == len(window):
            taken = window[:need]
            self._consume_front(front, start + len(taken))
        elif num_live >= need:
            index = live.nonzero()[0][:need]
            taken = window[index]
            self._consume_front(front, start + int(index[-1]) + 1)
        else:
            taken = window[live]
            self._consume_front(front, stop)
        return taken

    def evict_oldest_base(self, num_blocks: int) -> Blocks:
        """As `evict_oldest`, skipping elastic blocks (the region is not lendable)."""
        order = self.live_order()
        evicted = order[order < self.num_base_blocks][:num_blocks]
        self.take(evicted, len(evicted))
        self._unname(evicted)
        self._compact()
        return evicted

    def drop_elastic(self) -> None:
        """Forget every cached elastic block (the region is unmapped: content undefined)."""
        if not self.num_free_elastic:
            return
        order = self.live_order()
        elastic = order[order >= self.num_base_blocks]
        self.take(elastic, 0)
        self._unname(elastic)
        self._compact()

    def live_order(self) -> Blocks:
        """The live entries, oldest first."""
        if not self._queue:
            return EMPTY
        pushed_at = self.pushed_at
        return np.concatenate([p.blocks[p.start:][pushed_at[p.blocks[p.start:]] == p.stamp]
                               for p in self._queue])

    def maybe_sweep(self) -> None:
        """Compact the queue once dead entries outnumber the pool's blocks several times over
        (evictions skip them anyway: this only bounds the queue while none happen)."""
        if self._num_entries > self.num_free + SWEEP_FACTOR * len(self.pushed_at) + MIN_SWEEP_ENTRIES:
            self._compact()

    def _compact(self) -> None:
        """The queue rebuilt from its live entries, in order, as one push."""
        live = self.live_order()
        self._queue.clear()
        self._num_entries = len(live)
        if len(live):
            self._queue.append(_Pushed(live, self._next_stamp(live)))
