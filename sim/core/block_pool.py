"""Paged KV block pool with a base region, an elastic region and an optional prefix cache.

Block ids are laid out as in the GPU allocator's virtual range::

    [0 ........ num_base_blocks) [num_base_blocks ........ num_blocks)
     base: always mapped          elastic: the activation reserve, mapped only while lent

Allocation prefers base blocks, so the elastic region fills last and drains first. While the
elastic region is detached (or draining) no block in it is handed out; it may be detached only
when none of its blocks is referenced (`sim.core.elastic_region`).

Prefix caching follows vLLM: a full block can be registered under a hash key; a block whose
reference count drops to zero keeps its key and sits in an LRU of evictable blocks, counted
as free, until an allocation evicts it or a new request hits it (`sim.core.block_cache`). A
caller may keep a prefix lookup: `num_evicted` counts the evictions (a kept hit may be gone
only if it moved), `num_named` the blocks named (a lookup that missed may hit only if it
moved), and `cache_epoch` moves on the other events that take a cached block out of
reach (an elastic state change, an elastic cached block freed while the region is not
lendable).

Every operation takes a request's blocks at once (a long prompt holds thousands), as numpy
array operations, except the small allocations of decode steps, which stay on Python lists.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sim.core.block_cache import EMPTY, NONE, BlockCache, Blocks, as_blocks
from sim.core.elastic_region import ElasticBusyError, ElasticRegion, ElasticState

__all__ = ["BlockPool", "ElasticBusyError", "ElasticState"]

FIRST_RUN = 64  # keys a cached run looks up first


class BlockPool:
    def __init__(self, num_base_blocks: int, num_elastic_blocks: int = 0, *,
                 elastic_attached: bool = False) -> None:
        if num_base_blocks < 1:
            raise ValueError(f"num_base_blocks must be >= 1, got {num_base_blocks}")
        if num_elastic_blocks < 0:
            raise ValueError(f"num_elastic_blocks must be >= 0, got {num_elastic_blocks}")
        self.num_base_blocks = num_base_blocks
        self.num_elastic_blocks = num_elastic_blocks
        self.num_blocks = num_base_blocks + num_elastic_blocks
        # Free base blocks not cached: a stack popped from the end, reversed so low ids go
        # out first; an array whose first `_num_stacked` entries live (a request's blocks go
        # on and off it as one slice). Free elastic ones are the region's.
        self._stack = np.arange(num_base_blocks - 1, -1, -1, dtype=np.int64)
        self._num_stacked = num_base_blocks
        self._elastic = ElasticRegion(num_base_blocks, num_elastic_blocks)
        self._ref_count = np.zeros(self.num_blocks, dtype=np.int32)
        self._cache = BlockCache(self.num_blocks, num_base_blocks)
        self.num_evicted = 0  # cached blocks evicted so far (a count to compare)
        self.cache_epoch = 0
        self.num_freed_blocks = 0  # blocks that came free so far (a count to compare)
        self.num_used_base = 0
        self.num_used_elastic = 0
        if elastic_attached and num_elastic_blocks:
            self.attach_elastic()

    # ------------------------------------------------------------------ counts
    @property
    def num_used_blocks(self) -> int:
        return self.num_used_base + self.num_used_elastic

    @property
    def elastic_state(self) -> ElasticState:
        return self._elastic.state

    @property
    def num_attached_elastic(self) -> int:
        return self._elastic.num_attached

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now (evictable cached blocks included)."""
        free = self._num_stacked + self._cache.num_free_base
        if self._elastic.state is ElasticState.ATTACHED:
            free += self._elastic.num_free + self._cache.num_free_elastic
        return free

    @property
    def num_free_base_blocks(self) -> int:
        return self._num_stacked + self._cache.num_free_base

    @property
    def num_usable_blocks(self) -> int:
        """Blocks the pool holds right now: base plus the attached part of the elastic region."""
        return self.num_base_blocks + self.num_attached_elastic

    def is_elastic(self, block_id: int) -> bool:
        return block_id >= self.num_base_blocks

    def ref_count(self, block_id: int) -> int:
        return int(self._ref_count[block_id])

    # --------------------------------------------------------------- allocate
    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self._num_stacked or num_blocks <= self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` free blocks, base first; None (and no change) if too few."""
        ref_count, stacked = self._ref_count, self._num_stacked
        if num_blocks <= stacked:  # fast path, no cache or elastic involved
            if num_blocks <= 0:
                return []
            left = stacked - num_blocks
            self._num_stacked = left
            if num_blocks == 1:
                block_id = int(self._stack[left])
                ref_count[block_id] = 1
                self.num_used_base += 1
                return [block_id]
            taken = self._stack[left:stacked]
            ref_count[taken] = 1
            self.num_used_base += num_blocks
            return taken.tolist()
        if num_blocks == 1 and self._only_base_free():  # a decode step's, from the cache
            oldest = self._cache.evict_one() if self._cache.num_free_base else None
            if oldest is not None:
                ref_count[oldest] = 1
                self.num_used_base += 1
                self.num_evicted += 1
                return [oldest]
        blocks = self.allocate_blocks(num_blocks)
        return None if blocks is None else blocks.tolist()

    def allocate_blocks(self, num_blocks: int) -> Blocks | None:
        """`allocate` as an array, the same blocks in the same order: for a prompt's chunk,
        which the prefix cache names as it is once computed."""
        stacked = self._num_stacked
        if num_blocks <= stacked:
            if num_blocks <= 0:
                return EMPTY
            left = stacked - num_blocks
            taken = self._stack[left:stacked].copy()  # the stack's slots are reused
            self._num_stacked = left
            self._ref_count[taken] = 1
            self.num_used_base += num_blocks
            return taken
        if self._only_base_free():
            if num_blocks - stacked > self._cache.num_free_base:
                return None
            return self._take_stack_and_evict(num_blocks)
        if num_blocks > self.num_free_blocks:
            return None
        return self._allocate_beyond_stack(num_blocks)

    def _only_base_free(self) -> bool:
        """Is every free block on the stack or a cached base block (no elastic one free or
        reachable)?"""
        return not self.num_elastic_blocks or not self._cache.num_free_elastic \
            and self.elastic_state is not ElasticState.ATTACHED

    def _take_stack_and_evict(self, num_blocks: int) -> Blocks:
        """`allocate_blocks` when only base blocks are free: all of the stack (in pop order),
        then the oldest cached blocks (the caller checked there are enough)."""
        stacked = self._num_stacked
        taken = as_blocks(self._cache.evict_oldest(num_blocks - stacked))
        if stacked:
            taken = np.concatenate((self._stack[stacked - 1::-1], taken))
            self._num_stacked = 0
        self._ref_count[taken] = 1
        self.num_evicted += num_blocks - stacked
        self.num_used_base += num_blocks
        return taken

    def _allocate_beyond_stack(self, num_blocks: int) -> Blocks:
        """`allocate_blocks` when the base stack holds too few: all of it, then attached free
        elastic blocks, then evicted cached ones (the caller checked there are enough)."""
        stacked = self._num_stacked
        parts = [self._stack[stacked - 1::-1]] if stacked else []  # the pop order
        self._num_stacked = 0
        num_taken, num_elastic = stacked, 0
        if self.elastic_state is ElasticState.ATTACHED:
            elastic = self._elastic.take(num_blocks - num_taken)
            if elastic:
                parts.append(as_blocks(elastic))
            num_taken += len(elastic)
            num_elastic = len(elastic)
        if num_taken < num_blocks:
            free_elastic = self._cache.num_free_elastic
            parts.append(as_blocks(self._evict(num_blocks - num_taken)))
            num_elastic += free_elastic - self._cache.num_free_elastic  # those it evicted
        taken = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self._ref_count[taken] = 1
        self.num_used_base += num_blocks - num_elastic
        self.num_used_elastic += num_elastic
        return taken

    def _evict(self, num_blocks: int) -> Blocks | list[int]:
        """Take `num_blocks` evictable cached blocks, least recently freed first."""
        cache = self._cache
        evicted: Blocks | list[int]
        if cache.num_free_elastic and self.elastic_state is not ElasticState.ATTACHED:
            evicted = cache.evict_oldest_base(num_blocks)  # elastic ones out of reach
        else:
            evicted = cache.evict_oldest(num_blocks)
        if len(evicted) < num_blocks:
            raise AssertionError("no evictable block although can_allocate said yes")
        self.num_evicted += num_blocks
        return evicted

    # -------------------------------------------------------------------- free
    def free(self, block_ids: Sequence[int] | Blocks) -> None:
        """Drop one reference to each block (distinct blocks). Pass a request's blocks tail
        first, as vLLM does, so that its last blocks are the first to be evicted from the
        prefix cache: a block that comes free keeps its content key in the cache's LRU
        (oldest first), one without a key goes back onto its free stack."""
        ids = np.asarray(block_ids, dtype=np.int64)
        if not len(ids):
            return
        freed = self._unref(ids)
        if not len(freed):
            return
        # only while some elastic block is used can a freed one be elastic
        num_base, has_elastic = self.num_base_blocks, self.num_used_elastic > 0
        freed_base = int(np.count_nonzero(freed < num_base)) if has_elastic else len(freed)
        self.num_used_base -= freed_base
        self.num_used_elastic -= len(freed) - freed_base
        self.num_freed_blocks += len(freed)
        cache = self._cache
        named = cache.key_of[freed] != NONE if cache.in_use else None
        num_named = int(np.count_nonzero(named)) if named is not None else 0
        if num_named:
            assert named is not None
            kept = freed[named] if num_named < len(freed) else freed
            kept_base = int(np.count_nonzero(kept < num_base)) if has_elastic else num_named
            cache.push(kept, kept_base)
            cache.maybe_sweep()
            if kept_base < num_named and self.elastic_state is not ElasticState.ATTACHED:
                self.cache_epoch += 1  # a hit on those blocks is no longer usable
            if num_named == len(freed):
                return
            freed = freed[~named]
            freed_base -= kept_base
        if freed_base < len(freed):
            base = freed < num_base
            self._elastic.freed += freed[~base].tolist()
            freed = freed[base]
        self._stack_free(freed)

    def free_table(self, own: Blocks, named: Blocks) -> None:
        """`free` of a request's blocks split in two, each last first: `own`, which no other
        request holds and no key names (the blocks past its named ones), then `named`, its
        hits and the blocks it named, every one of them named. The caller vouches for that
        split (the prefix cache, which keeps the table), so no key is looked up and only the
        named ones' references are counted; the blocks go where `free` would send them, in
        the same order."""
        if self.num_used_elastic:  # elastic blocks go elsewhere: counted the general way
            self.free(np.concatenate((own, named)))
            return
        kept = self._unref(named)
        num_freed = len(own) + len(kept)
        self.num_used_base -= num_freed
        self.num_freed_blocks += num_freed
        if len(kept):
            self._cache.push(kept, len(kept))
            self._cache.maybe_sweep()
        if len(own):
            self._ref_count[own] = 0
            self._stack_free(own)

    def _unref(self, ids: Blocks) -> Blocks:
        """Drop one reference to each of `ids` (distinct, all allocated); the blocks no
        request holds now."""
        ref_count = self._ref_count
        counts = ref_count[ids]
        if np.count_nonzero(counts) < len(ids):  # (count_nonzero: a fraction of all()'s cost)
            raise ValueError(f"block {int(ids[np.argmin(counts)])} freed but not allocated")
        counts -= 1
        ref_count[ids] = counts
        return ids[counts == 0] if np.count_nonzero(counts) else ids

    def _stack_free(self, blocks: Blocks) -> None:
        """Unnamed free base blocks onto the free stack (taken last in, first out)."""
        stacked = self._num_stacked
        self._stack[stacked:stacked + len(blocks)] = blocks
        self._num_stacked = stacked + len(blocks)

    # ------------------------------------------------------------ prefix cache
    def cached_block(self, key: int) -> int | None:
        """The block holding the content named `key`, if cached and usable right now."""
        block_id = self._cache.lookup(key)
        if block_id is None:
            return None
        if block_id >= self.num_base_blocks and self.elastic_state is not ElasticState.ATTACHED:
            if self._ref_count[block_id] == 0:
                return None
        return block_id

    def cached_run(self, keys: np.ndarray, start: int, stop: int) -> Blocks:
        """The blocks `cached_block` gives for keys[start], keys[start + 1], ... up to
        keys[stop - 1] (keys covered), stopping at the first key it gives none for. Looked
        up FIRST_RUN keys at a time, then 4x as many: a run often stops at once."""
        block_of, key_of = self._cache.block_of, self._cache.key_of
        parts = []
        window = FIRST_RUN
        while start < stop:
            end = min(stop, start + window)
            some = keys[start:end]
            blocks = block_of[some]
            usable = key_of[blocks] == some
            if self._cache.num_free_elastic and self.elastic_state is not ElasticState.ATTACHED:
                # a named elastic block no request holds is a free cached one
                unreachable = usable & (blocks >= self.num_base_blocks)
                unreachable[unreachable] = self._ref_count[blocks[unreachable]] == 0
                usable &= ~unreachable
            first_miss = int(usable.argmin())  # 0 also when none misses
            if not usable[first_miss]:
                parts.append(blocks[:first_miss])
                break
            parts.append(blocks)
            start, window = end, window * 4
        if not parts:
            return np.empty(0, dtype=np.int64)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def cover_keys(self, key_limit: int) -> None:
        """Make room for the keys below `key_limit` (keys are non-negative ints) before any of
        them is looked up or named."""
        self._cache.cover(key_limit)

    @property
    def num_named(self) -> int:
        """Blocks named so far: a key can only be found anew after this count moves."""
        return self._cache.num_named

    def num_still_named(self, block_ids: Blocks, keys: np.ndarray) -> int:
        """How many of `block_ids`, from the first, still hold the matching keys."""
        moved = self._cache.key_of[block_ids] != keys
        return int(np.argmax(moved)) if np.count_nonzero(moved) else len(block_ids)

    def num_unreferenced(self, block_ids: Blocks) -> int:
        """How many of `block_ids` no request references (cached but free)."""
        return len(block_ids) - int(np.count_nonzero(self._ref_count[block_ids]))

    def touch(self, block_ids: Blocks) -> None:
        """Take a reference to each cached block (prefix-cache hits; distinct blocks)."""
        ref_count = self._ref_count
        counts = ref_count[block_ids]
        ref_count[block_ids] = counts + 1
        idle = block_ids[counts == 0]  # cached but free: they leave the LRU, now used
        if len(idle):
            idle_base = (int(np.count_nonzero(idle < self.num_base_blocks))
                         if self.num_elastic_blocks else len(idle))
            self._cache.take(idle, idle_base)
            self.num_used_base += idle_base
            self.num_used_elastic += len(idle) - idle_base

    def register(self, block_ids: list[int] | Blocks, keys: np.ndarray) -> int:
        """Name full, used blocks that have no name yet (a request's own computed blocks,
        not its hits) by their content keys (distinct, covered: `cover_keys`) so later
        requests can share them. A key already cached elsewhere is left as it is. How many
        were named."""
        return self._cache.name(as_blocks(block_ids), keys)

    # ----------------------------------------------------------------- elastic
    def attach_elastic(self, num_blocks: int | None = None) -> None:
        """Map the first `num_blocks` elastic blocks (all when None) into the pool."""
        self._elastic.attach(num_blocks)
        self.cache_epoch += 1

    def resume_lending(self) -> None:
        """Undo `start_draining`: the prefill that asked for the reserve went away."""
        if self._elastic.resume_lending():
            self.cache_epoch += 1

    def start_draining(self) -> None:
        if self._elastic.start_draining():
            self.cache_epoch += 1

    def detach_elastic(self) -> None:
        self._elastic.detach(self.num_used_elastic)
        self._cache.drop_elastic()  # unmapped content is undefined: forget their keys
        self.cache_epoch += 1

    def elastic_blocks_in_use(self) -> list[int]:
        return [
            b for b in range(self.num_base_blocks, self.num_blocks) if self._ref_count[b] > 0
        ]

    def check_invariants(self) -> None:
        """Free + used = total, every block in exactly one place. For tests and debugging."""
        cache = self._cache
        fresh = list(self._elastic.fresh_blocks())
        cached = cache.live_order().tolist()
        free = self._stack[:self._num_stacked].tolist() + self._elastic.freed + fresh + cached
        if len(free) != len(set(free)):
            raise AssertionError("a block is on two free lists")
        used = [b for b in range(self.num_blocks) if self._ref_count[b] > 0]
        if set(used) & set(free):
            raise AssertionError("a block is both used and free")
        unmapped = self.num_elastic_blocks - self.num_attached_elastic
        if len(used) + len(free) + unmapped != self.num_blocks:
            raise AssertionError(
                f"used {len(used)} + free {len(free)} + unmapped {unmapped} != {self.num_blocks}")
        if any(b >= self.num_base_blocks + self.num_attached_elastic for b in free + used):
            raise AssertionError("a block beyond the attached elastic range is in use or free")
        if len(used) != self.num_used_blocks:
            raise AssertionError("used counters out of step with reference counts")
        if len(cached) != cache.num_free or \
                cache.num_free_base != sum(1 for b in cached if b < self.num_base_blocks):
            raise AssertionError("cached-free counters out of step")
        if any(cache.key_of[b] == NONE for b in cached):
            raise AssertionError("an unnamed block sits in the cache's LRU")
        if self.elastic_state is ElasticState.DETACHED and self.num_used_elastic:
            raise AssertionError("elastic blocks in use while detached")
