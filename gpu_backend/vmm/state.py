"""Plain-data pieces of the pool: physical chunks, where they are mapped, and statistics."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpu_backend.vmm.errors import ElasticDetachedError


class Reclaim(str, enum.Enum):
    """How detached elastic memory reaches activations; see pool.py."""

    REMAP = "remap"
    RELEASE = "release"


class ElasticLocation(enum.Enum):
    KV = "kv"  # attached: a prefix of the reserve usable at the top of the KV range
    ACTIVATIONS = "activations"  # remap mode, detached: all of it usable in the activation range
    NOWHERE = "nowhere"  # release mode, detached: nothing mapped
    MIXED = "mixed"  # a rollback failed part-way: see ElasticKVPool.mapped_ranges()


class Region(enum.Enum):
    BASE = "base"  # base blocks, in the KV range
    ELASTIC = "elastic"  # elastic blocks, in the KV range
    ARENA = "arena"  # the activation range (remap mode)


@dataclass(frozen=True)
class Target:
    """Where a chunk should end up: mapped with access at ``address``, or unmapped (its
    handle kept or released)."""

    address: int | None
    keep_handle: bool = True


@dataclass(eq=False)
class Chunk:
    """One physical handle, its fixed places, and where it is mapped now.

    ``kv_address`` is its place in the KV range, ``arena_address`` its place in the activation
    range (remap mode only). ``handle`` is None while released. ``num_refs`` counts the pool's
    references on the handle: 1 from cuMemCreate, one more for each driver query whose own
    release failed; all are released at the end. ``mappings`` maps each address the handle is
    mapped at to whether read/write access was granted there. Compared by identity.
    """

    size_bytes: int
    kv_address: int
    arena_address: int | None = None
    handle: Any | None = None
    num_refs: int = 0
    mappings: dict[int, bool] = field(default_factory=dict)

    @property
    def slots(self) -> tuple[int, ...]:
        """Every address the pool may map this chunk at."""
        return (self.kv_address,) if self.arena_address is None else (self.kv_address,
                                                                      self.arena_address)

    def usable_at(self, address: int) -> bool:
        """Mapped at ``address`` with access, and nowhere else (no aliased second mapping)."""
        return self.mappings == {address: True}

    def is_at(self, target: Target) -> bool:
        if target.address is None:
            return not self.mappings and (target.keep_handle or self.handle is None)
        return self.usable_at(target.address) and self.handle is not None

    def current_target(self) -> Target:
        """The target that keeps what is usable now (rollback goes back to it)."""
        usable = [a for a in self.mappings if self.usable_at(a)]
        return Target(usable[0] if usable else None, keep_handle=self.handle is not None)


@dataclass(frozen=True)
class MappedRange:
    """One mapping as the pool knows it (after a failure: as the driver reported it)."""

    address: int
    size_bytes: int
    handle: Any
    accessible: bool
    region: Region


@dataclass(frozen=True)
class PoolStats:
    """What the pool holds and what its transitions cost (seconds, wall clock, sync included)."""

    mapped_bytes: int
    reserved_virtual_bytes: int
    num_handles_created: int  # cumulative: release mode re-creates on every attach
    num_handles_live: int
    attached: bool
    num_live_elastic_blocks: int
    num_attaches: int
    num_detaches: int
    last_attach_s: float | None
    total_attach_s: float
    last_detach_s: float | None
    total_detach_s: float


@dataclass
class TransitionTimer:
    """Counts and latencies of attach/detach, measured with time.perf_counter."""

    num_attaches: int = 0
    num_detaches: int = 0
    last_attach_s: float | None = None
    total_attach_s: float = 0.0
    last_detach_s: float | None = None
    total_detach_s: float = 0.0

    def record_attach(self, seconds: float) -> None:
        self.num_attaches += 1
        self.last_attach_s = seconds
        self.total_attach_s += seconds

    def record_detach(self, seconds: float) -> None:
        self.num_detaches += 1
        self.last_detach_s = seconds
        self.total_detach_s += seconds

    def stats(self, **holdings: Any) -> PoolStats:
        return PoolStats(num_attaches=self.num_attaches, num_detaches=self.num_detaches,
                         last_attach_s=self.last_attach_s, total_attach_s=self.total_attach_s,
                         last_detach_s=self.last_detach_s, total_detach_s=self.total_detach_s,
                         **holdings)


class ElasticBlockTracker:
    """Which elastic block ids hold live KV: marked ones plus the engine's own count."""

    def __init__(self, num_base_blocks: int, num_blocks: int,
                 external_count: Callable[[], int] | None = None) -> None:
        self.num_base_blocks = num_base_blocks
        self.num_blocks = num_blocks
        self.external_count = external_count
        self.marked: set[int] = set()

    def elastic_ids(self, block_ids: Iterable[int]) -> list[int]:
        """The elastic ids among ``block_ids``; IndexError for ids outside the pool."""
        ids = list(block_ids)
        for block_id in ids:
            if not 0 <= block_id < self.num_blocks:
                raise IndexError(f"block id {block_id} out of range [0, {self.num_blocks})")
        return [b for b in ids if b >= self.num_base_blocks]

    def mark_allocated(self, block_ids: Iterable[int], num_usable_elastic_blocks: int) -> None:
        """Record live blocks; elastic ones must lie in the mapped, accessible part."""
        elastic = self.elastic_ids(block_ids)
        end = self.num_base_blocks + num_usable_elastic_blocks
        outside = [b for b in elastic if b >= end]
        if outside and not num_usable_elastic_blocks:
            raise ElasticDetachedError(f"elastic blocks {outside[:8]} used while detached; "
                                       "attach() before allocating elastic blocks")
        if outside:
            raise ElasticDetachedError(f"elastic blocks {outside[:8]} lie beyond the mapped blocks "
                                       f"[{self.num_base_blocks}, {end}); attach more handles first")
        self.marked.update(elastic)

    def mark_freed(self, block_ids: Iterable[int]) -> None:
        elastic = self.elastic_ids(block_ids)
        unknown = [b for b in elastic if b not in self.marked]
        if unknown:
            raise ValueError(f"elastic blocks {unknown[:8]} freed but not allocated")
        self.marked.difference_update(elastic)

    def num_live(self) -> int:
        return len(self.marked) + (self.external_count() if self.external_count else 0)
