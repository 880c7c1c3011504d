"""Plain-data pieces of the pool: physical chunks, statistics and rollback."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from gpu_backend.vmm.errors import ElasticDetachedError


class Reclaim(str, enum.Enum):
    """How detached elastic memory reaches activations; see pool.py."""

    REMAP = "remap"
    RELEASE = "release"


class ElasticLocation(enum.Enum):
    KV = "kv"  # attached: mapped at the top of the KV range
    ACTIVATIONS = "activations"  # remap mode, detached: mapped in the activation range
    NOWHERE = "nowhere"  # release mode, detached: handles released


@dataclass
class Chunk:
    """One physical handle and where it is mapped.

    ``offset_bytes`` is its fixed place in the KV range; ``handle`` is None while released
    (release mode, detached); ``mapped_at`` is the address it is mapped at, if any.
    """

    size_bytes: int
    offset_bytes: int
    handle: Any | None
    mapped_at: int | None = None


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


@contextlib.contextmanager
def undo_on_error() -> Iterator[list[Callable[[], None]]]:
    """Yield a list of undo steps; if the block raises, run them newest first and re-raise.

    A failing undo step does not stop the others; its error is attached to the original
    exception as a note, so the message still names the driver call that failed first.
    """
    undo: list[Callable[[], None]] = []
    try:
        yield undo
    except BaseException as exc:
        for step in reversed(undo):
            try:
                step()
            except Exception as undo_exc:  # noqa: BLE001 - finish the rollback, then report
                if hasattr(exc, "add_note"):
                    exc.add_note(f"rollback step also failed: {undo_exc}")
        raise


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

    def mark_allocated(self, block_ids: Iterable[int], attached: bool) -> None:
        elastic = self.elastic_ids(block_ids)
        if elastic and not attached:
            raise ElasticDetachedError(f"elastic blocks {elastic[:8]} used while detached; "
                                       "attach() before allocating elastic blocks")
        self.marked.update(elastic)

    def mark_freed(self, block_ids: Iterable[int]) -> None:
        elastic = self.elastic_ids(block_ids)
        unknown = [b for b in elastic if b not in self.marked]
        if unknown:
            raise ValueError(f"elastic blocks {unknown[:8]} freed but not allocated")
        self.marked.difference_update(elastic)

    def num_live(self) -> int:
        return len(self.marked) + (self.external_count() if self.external_count else 0)
