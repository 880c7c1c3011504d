"""Paged KV block pool with a base region, an elastic region and an optional prefix cache.

Block ids are laid out as in the GPU allocator's virtual range::

    [0 ........ num_base_blocks) [num_base_blocks ........ num_blocks)
     base: always mapped          elastic: the activation reserve, mapped only while lent

Allocation prefers base blocks, so the elastic region fills last and drains first. While the
elastic region is detached (or draining) no block in it is handed out; it may be detached only
when none of its blocks is referenced, which is what keeps a block table from pointing at
unmapped memory.

Prefix caching follows vLLM: a full block can be registered under a hash key; a block whose
reference count drops to zero keeps its key and sits in an LRU of evictable blocks, counted
as free, until an allocation evicts it or a new request hits it. `cache_epoch` counts the
events that can take a cached block out of reach (an eviction, an elastic state change, an
elastic cached block freed while the region is not lendable), so a caller may keep a prefix
lookup while the epoch stands and only look further along it.

Every operation takes a list of blocks at once: a long prompt holds thousands of blocks, and
one call per block was most of a prefix-cached run's time.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Hashable, Iterable


class ElasticState(enum.Enum):
    DETACHED = "detached"
    ATTACHED = "attached"
    DRAINING = "draining"  # still mapped, but no new allocations land in it


class ElasticBusyError(RuntimeError):
    """Raised when the elastic region is detached while some of its blocks are in use."""


class BlockPool:
    def __init__(
        self,
        num_base_blocks: int,
        num_elastic_blocks: int = 0,
        *,
        elastic_attached: bool = False,
    ) -> None:
        if num_base_blocks < 1:
            raise ValueError(f"num_base_blocks must be >= 1, got {num_base_blocks}")
        if num_elastic_blocks < 0:
            raise ValueError(f"num_elastic_blocks must be >= 0, got {num_elastic_blocks}")
        self.num_base_blocks = num_base_blocks
        self.num_elastic_blocks = num_elastic_blocks
        self.num_blocks = num_base_blocks + num_elastic_blocks
        # Free lists are stacks popped from the end; reversed so low ids go out first.
        self._free_base = list(range(num_base_blocks - 1, -1, -1))
        self._free_elastic: list[int] = []  # attached and free; unattached blocks are nowhere
        self._cached_free: OrderedDict[int, Hashable] = OrderedDict()  # LRU, oldest first
        self._num_cached_free_base = 0  # how many of _cached_free are base blocks
        self._key_of: dict[int, Hashable] = {}
        self._block_of: dict[Hashable, int] = {}
        self._ref_count = [0] * self.num_blocks
        self.num_used_base = 0
        self.num_used_elastic = 0
        self.elastic_state = ElasticState.DETACHED
        self.num_attached_elastic = 0
        self.cache_epoch = 0
        if elastic_attached and num_elastic_blocks:
            self.attach_elastic()

    # ------------------------------------------------------------------ counts
    @property
    def num_used_blocks(self) -> int:
        return self.num_used_base + self.num_used_elastic

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now (evictable cached blocks included)."""
        return self.num_free_base_blocks + self._num_free_elastic_usable()

    @property
    def num_free_base_blocks(self) -> int:
        return len(self._free_base) + self._num_cached_free_base

    @property
    def num_usable_blocks(self) -> int:
        """Blocks the pool holds right now: base plus the attached part of the elastic region."""
        return self.num_base_blocks + self.num_attached_elastic

    def _num_free_elastic_usable(self) -> int:
        if self.elastic_state is not ElasticState.ATTACHED:
            return 0
        cached = len(self._cached_free) - self._num_cached_free_base
        return len(self._free_elastic) + cached

    def is_elastic(self, block_id: int) -> bool:
        return block_id >= self.num_base_blocks

    # --------------------------------------------------------------- allocate
    def can_allocate(self, num_blocks: int) -> bool:
        if num_blocks <= len(self._free_base):
            return True
        return num_blocks <= self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` free blocks, base first; None (and no change) if too few."""
        if num_blocks == 0:
            return []
        if num_blocks <= len(self._free_base):  # fast path, no cache or elastic involved
            taken = self._free_base[-num_blocks:]
            del self._free_base[-num_blocks:]
            for block_id in taken:
                self._ref_count[block_id] = 1
            self.num_used_base += num_blocks
            return taken
        if not self.can_allocate(num_blocks):
            return None
        taken = self._free_base[::-1]  # the stack's pop order
        self._free_base = []
        num_base = len(taken)
        if len(taken) < num_blocks and self._free_elastic and \
                self.elastic_state is ElasticState.ATTACHED:
            more = min(num_blocks - len(taken), len(self._free_elastic))
            taken += self._free_elastic[:-more - 1:-1]
            del self._free_elastic[-more:]
        num_elastic = len(taken) - num_base
        if len(taken) < num_blocks:
            evicted = self._evict_lru(num_blocks - len(taken))
            num_evicted_base = sum(1 for b in evicted if b < self.num_base_blocks)
            num_base += num_evicted_base
            num_elastic += len(evicted) - num_evicted_base
            taken += evicted
        ref_count = self._ref_count
        for block_id in taken:
            ref_count[block_id] = 1
        self.num_used_base += num_base
        self.num_used_elastic += num_elastic
        return taken

    def _evict_lru(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` evictable cached blocks, least recently freed first."""
        cached, key_of, block_of = self._cached_free, self._key_of, self._block_of
        num_base = self.num_base_blocks
        evicted: list[int] = []
        if self.elastic_state is ElasticState.ATTACHED or \
                self._num_cached_free_base == len(cached):
            for _ in range(num_blocks):  # every cached block is evictable: the oldest ones
                block_id, key = cached.popitem(last=False)
                evicted.append(block_id)
        else:  # elastic cached blocks are out of reach: skip them
            for block_id in cached:
                if block_id < num_base:
                    evicted.append(block_id)
                    if len(evicted) == num_blocks:
                        break
            for block_id in evicted:
                del cached[block_id]
        if len(evicted) < num_blocks:
            raise AssertionError("no evictable block although can_allocate said yes")
        for block_id in evicted:
            del block_of[key_of.pop(block_id)]
        self._num_cached_free_base -= sum(1 for b in evicted if b < num_base)
        self.cache_epoch += 1
        return evicted

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block. Pass a request's blocks tail first, as vLLM does,
        so that its last blocks are the first to be evicted from the prefix cache."""
        ref_count, key_of = self._ref_count, self._key_of
        num_base = self.num_base_blocks
        released: list[int] = []
        for block_id in block_ids:
            count = ref_count[block_id]
            if count == 1:
                ref_count[block_id] = 0
                released.append(block_id)
            elif count > 1:
                ref_count[block_id] = count - 1
            else:
                raise ValueError(f"block {block_id} freed but not allocated")
        if not released:
            return
        num_elastic = sum(1 for b in released if b >= num_base)
        self.num_used_base -= len(released) - num_elastic
        self.num_used_elastic -= num_elastic
        if not key_of:  # no prefix cache in use: straight back onto the free stacks
            if num_elastic:
                self._free_elastic.extend(b for b in released if b >= num_base)
                self._free_base.extend(b for b in released if b < num_base)
            else:
                self._free_base.extend(released)
            return
        cached = self._cached_free
        lendable = self.elastic_state is ElasticState.ATTACHED
        for block_id in released:
            key = key_of.get(block_id)
            if key is not None:
                cached[block_id] = key
                if block_id < num_base:
                    self._num_cached_free_base += 1
                elif not lendable:
                    self.cache_epoch += 1  # a hit on it is no longer usable
            elif block_id < num_base:
                self._free_base.append(block_id)
            else:
                self._free_elastic.append(block_id)

    def ref_count(self, block_id: int) -> int:
        return self._ref_count[block_id]

    # ------------------------------------------------------------ prefix cache
    def cached_block(self, key: Hashable) -> int | None:
        """The block holding the content named `key`, if cached and usable right now."""
        block_id = self._block_of.get(key)
        if block_id is None:
            return None
        if block_id >= self.num_base_blocks and self.elastic_state is not ElasticState.ATTACHED:
            if self._ref_count[block_id] == 0:
                return None
        return block_id

    def num_unreferenced(self, block_ids: list[int]) -> int:
        """How many of `block_ids` no request references (cached but free)."""
        return list(map(self._ref_count.__getitem__, block_ids)).count(0)

    def touch(self, block_ids: list[int]) -> None:
        """Take a reference to each cached block (prefix-cache hits)."""
        ref_count, cached = self._ref_count, self._cached_free
        num_base = self.num_base_blocks
        for block_id in block_ids:
            count = ref_count[block_id]
            if count == 0:
                del cached[block_id]
                if block_id < num_base:
                    self._num_cached_free_base -= 1
                    self.num_used_base += 1
                else:
                    self.num_used_elastic += 1
            ref_count[block_id] = count + 1

    def register(self, block_ids: list[int], keys: list[Hashable]) -> None:
        """Name full, used blocks by their content keys so later requests can share them.
        A key already cached elsewhere, or a block already named, is left as it is."""
        key_of, block_of = self._key_of, self._block_of
        for block_id, key in zip(block_ids, keys):
            if key not in block_of and block_id not in key_of:
                key_of[block_id] = key
                block_of[key] = block_id

    # ----------------------------------------------------------------- elastic
    def attach_elastic(self, num_blocks: int | None = None) -> None:
        """Map the first `num_blocks` elastic blocks (all when None) into the pool."""
        if self.num_elastic_blocks == 0:
            raise ValueError("this pool has no elastic blocks to attach")
        if self.elastic_state is not ElasticState.DETACHED:
            raise ValueError(f"elastic region is {self.elastic_state.value}; detach it first")
        num = self.num_elastic_blocks if num_blocks is None else num_blocks
        if not 0 < num <= self.num_elastic_blocks:
            raise ValueError(f"can attach 1..{self.num_elastic_blocks} elastic blocks, not {num}")
        first = self.num_base_blocks
        self._free_elastic = list(range(first + num - 1, first - 1, -1))
        self.num_attached_elastic = num
        self.elastic_state = ElasticState.ATTACHED
        self.cache_epoch += 1

    def resume_lending(self) -> None:
        """Undo `start_draining`: the prefill that asked for the reserve went away."""
        if self.elastic_state is ElasticState.DRAINING:
            self.elastic_state = ElasticState.ATTACHED
            self.cache_epoch += 1

    def start_draining(self) -> None:
        if self.elastic_state is ElasticState.ATTACHED:
            self.elastic_state = ElasticState.DRAINING
            self.cache_epoch += 1

    def detach_elastic(self) -> None:
        if self.num_used_elastic:
            raise ElasticBusyError(
                f"cannot detach the elastic region: {self.num_used_elastic} of its blocks are "
                "still in use; drain them (preempt, wait or migrate) first"
            )
        # Content of elastic blocks is undefined once unmapped: forget their cache keys.
        for block_id in [b for b in self._cached_free if b >= self.num_base_blocks]:
            del self._cached_free[block_id]
            del self._block_of[self._key_of.pop(block_id)]
        self._free_elastic = []
        self.num_attached_elastic = 0
        self.elastic_state = ElasticState.DETACHED
        self.cache_epoch += 1

    def elastic_blocks_in_use(self) -> list[int]:
        return [
            b for b in range(self.num_base_blocks, self.num_blocks) if self._ref_count[b] > 0
        ]

    def check_invariants(self) -> None:
        """Free + used = total, every block in exactly one place. For tests and debugging."""
        free = self._free_base + self._free_elastic + list(self._cached_free)
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
        if self._num_cached_free_base != sum(1 for b in self._cached_free if b < self.num_base_blocks):
            raise AssertionError("cached-free base counter out of step")
        if self.elastic_state is ElasticState.DETACHED and self.num_used_elastic:
            raise AssertionError("elastic blocks in use while detached")
