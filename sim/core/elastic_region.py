"""The block pool's elastic region: the activation reserve lent as KV blocks.

Its blocks are the pool's ids [first_block, first_block + num_blocks), after the base ones.
They are mapped only while lent (`attach`, the first `num_attached` of them) and handed out
only while ATTACHED; DRAINING keeps them mapped but hands none out, so the region empties
before the reserve is taken back. It may be unmapped (`detach`) only when none of its blocks
is referenced, which is what keeps a block table from pointing at unmapped memory.

Free attached blocks: those freed (a stack, last freed on top) above the never-used rest of
the attached range, handed out lowest first, so an attach is O(1) however large the region.
Cached ones (named, no request holds them) are the pool's LRU's, not the region's.
"""

from __future__ import annotations

import enum

from mypy_extensions import mypyc_attr


class ElasticState(enum.Enum):
    DETACHED = "detached"
    ATTACHED = "attached"
    DRAINING = "draining"  # still mapped, but no new allocations land in it


@mypyc_attr(native_class=False)  # an exception class stays a Python class when compiled
class ElasticBusyError(RuntimeError):
    """Raised when the elastic region is detached while some of its blocks are in use."""


class ElasticRegion:
    def __init__(self, first_block: int, num_blocks: int) -> None:
        self.first_block = first_block
        self.num_blocks = num_blocks
        self.state = ElasticState.DETACHED
        self.num_attached = 0
        self.freed: list[int] = []  # free attached blocks freed since the attach
        self._fresh = self._fresh_end = first_block  # attached, never used since

    @property
    def num_free(self) -> int:
        """Free attached blocks that are not cached."""
        return len(self.freed) + self._fresh_end - self._fresh

    def fresh_blocks(self) -> range:
        """The attached blocks not handed out since the attach."""
        return range(self._fresh, self._fresh_end)

    def take(self, num_blocks: int) -> list[int]:
        """Up to `num_blocks` free attached blocks: freed ones first (last freed first),
        then never-used ones, lowest id first."""
        more = min(num_blocks, len(self.freed))
        taken = self.freed[:-more - 1:-1] if more else []
        if more:
            del self.freed[-more:]
        fresh = min(num_blocks - more, self._fresh_end - self._fresh)
        if fresh > 0:
            taken += range(self._fresh, self._fresh + fresh)
            self._fresh += fresh
        return taken

    def attach(self, num_blocks: int | None = None) -> None:
        """Map the first `num_blocks` blocks (all when None): all free, none used yet."""
        if self.num_blocks == 0:
            raise ValueError("this pool has no elastic blocks to attach")
        if self.state is not ElasticState.DETACHED:
            raise ValueError(f"elastic region is {self.state.value}; detach it first")
        num = self.num_blocks if num_blocks is None else num_blocks
        if not 0 < num <= self.num_blocks:
            raise ValueError(f"can attach 1..{self.num_blocks} elastic blocks, not {num}")
        self.freed = []
        self._fresh, self._fresh_end = self.first_block, self.first_block + num
        self.num_attached = num
        self.state = ElasticState.ATTACHED

    def start_draining(self) -> bool:
        """Hand out no more blocks; whether the state changed."""
        if self.state is not ElasticState.ATTACHED:
            return False
        self.state = ElasticState.DRAINING
        return True

    def resume_lending(self) -> bool:
        """Undo `start_draining`; whether the state changed."""
        if self.state is not ElasticState.DRAINING:
            return False
        self.state = ElasticState.ATTACHED
        return True

    def detach(self, num_used: int) -> None:
        """Unmap the region, of which `num_used` blocks are referenced (none may be)."""
        if num_used:
            raise ElasticBusyError(
                f"cannot detach the elastic region: {num_used} of its blocks are still in use; "
                "drain them (preempt, wait or migrate) first"
            )
        self.freed = []
        self._fresh = self._fresh_end = self.first_block
        self.num_attached = 0
        self.state = ElasticState.DETACHED
