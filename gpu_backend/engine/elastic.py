"""Carry out the core's elastic actions on the real KV store, and time them.

    ATTACH      (release mode) torch.cuda.empty_cache() so the reserve's memory leaves torch's
                cache, then map the handles covering the blocks the controller lent
    DETACH      copy migrated blocks (whole blocks: every layer is contiguous), then unmap; the
                pool synchronizes before the unmap, and refuses while elastic blocks are live.
                Under async scheduling a detach whose step in flight holds no elastic block
                (`ElasticAction.needs_idle_device` false, and the engine's own check of that
                step's tables) unmaps without waiting: none of the queued kernels touch the
                reserve, and there is nothing to copy
    DRAIN_WAIT  nothing to do on the device

Overcommit maps the reserve handle by handle as elastic blocks are first used (the core's
`activation_need` counts used elastic blocks, so mapping on first use is the faithful match);
the mapped prefix only grows. Each transition is timed with perf_counter after a device sync,
and recorded with its phases (`Transition`: torch's cache emptied, blocks copied, handles
mapped or unmapped, and the cached bytes torch gave back), which a replay writes to
transitions.csv: on an H200 a few transitions in a few hundred took 50-175 ms where the
rest took under 3 ms, and the phases say which step of a transition stalls.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

from gpu_backend.engine.kv_store import (
    copy_blocks,
    mapped_device_blocks,
    mapped_elastic_bytes,
    mapped_handles,
)
from sim.core.elastic import Policy
from sim.core.step import ElasticActionKind, SchedulerOutput


@dataclass(frozen=True)
class Transition:
    """One timed transition (seconds; a phase a transition does not have is 0)."""
    step_id: int  # the step it ran before
    kind: str  # "attach", "detach" or "map" (overcommit's mapping on first use)
    handles: int  # handles mapped (attach, map) or mapped before the unmap (detach)
    total_s: float
    empty_cache_s: float = 0.0  # torch's cached blocks handed back (release mode)
    copy_s: float = 0.0  # migrated blocks copied, device synchronized
    map_s: float = 0.0  # handles created and mapped, device synchronized
    unmap_s: float = 0.0  # handles unmapped and released (synchronizes first)
    freed_bytes: int = 0  # torch's reserved bytes the empty_cache gave back
    behind_step: int = 0  # 1: a detach run while the step in flight still ran (no wait)


TRANSITION_COLUMNS = tuple(f.name for f in fields(Transition))


class ElasticExecutor:
    def __init__(self, store, policy: Policy, *, block_id_offset: int, num_core_base_blocks: int,
                 sync: Callable[[], None], empty_cache: Callable[[], None] | None = None,
                 on_mapped: Callable[[int], None] | None = None,
                 reserved_bytes: Callable[[], int] | None = None) -> None:
        self.store, self.policy = store, policy
        self.block_id_offset = block_id_offset
        self.num_core_base_blocks = num_core_base_blocks
        self.sync = sync
        self.empty_cache = empty_cache  # release mode: give torch's cached blocks back first
        self.on_mapped = on_mapped  # told the mapped elastic bytes after every change
        self.reserved_bytes = reserved_bytes  # torch's reserved bytes (what empty_cache frees)
        self.partial_attach = "num_handles" in inspect.signature(store.attach).parameters
        self.attach_latencies_s: list[float] = []
        self.detach_latencies_s: list[float] = []
        self.migration_latencies_s: list[float] = []
        self.transitions: list[Transition] = []

    # ----------------------------------------------------------------- queries
    @property
    def mapped_bytes(self) -> int:
        return mapped_elastic_bytes(self.store)

    @property
    def num_mapped_device_blocks(self) -> int:
        return mapped_device_blocks(self.store)

    @property
    def first_elastic_device_block(self) -> int:
        """The device id of the first elastic block (core ids are shifted by the offset)."""
        return self.block_id_offset + self.num_core_base_blocks

    def handles_for(self, num_elastic_blocks: int) -> int:
        """Handles that cover the first `num_elastic_blocks` elastic blocks."""
        need = num_elastic_blocks * self.store.layout.block_bytes
        covered = count = 0
        for size in _handle_sizes(self.store):
            if covered >= need:
                break
            covered += size
            count += 1
        return count

    # ----------------------------------------------------------------- actions
    def apply(self, out: SchedulerOutput, wait: bool = True) -> float:
        """Run `out.elastic`; returns the measured pause in seconds. `wait=False`: a detach
        the caller knows no queued kernel touches (see `detach`)."""
        action = out.elastic
        if action is None or action.kind is ElasticActionKind.DRAIN_WAIT:
            return 0.0
        if action.kind is ElasticActionKind.ATTACH:
            return self.attach(action.num_blocks, out.step_id)
        return self.detach(action.migrations, out.step_id, wait=wait)

    def attach(self, num_lent_blocks: int, step_id: int = -1) -> float:
        """Map the handles covering `num_lent_blocks` elastic blocks; returns the seconds."""
        self.sync()
        return self._map_timed("attach", self.handles_for(num_lent_blocks), step_id, sync=True)

    def detach(self, migrations: tuple[tuple[int, int], ...] = (), step_id: int = -1,
               wait: bool = True) -> float:
        """Copy `migrations` (core block ids), then unmap the reserve; returns the seconds.

        `wait=False` unmaps without waiting for queued kernels: only for a caller that knows
        none of them reads or writes an elastic block (the engine's step in flight holds
        none in its tables), and so with nothing to migrate."""
        if not wait and migrations:
            raise ValueError("a detach with migrations copies elastic blocks: it must wait")
        if wait:
            self.sync()
        start = time.perf_counter()
        handles = mapped_handles(self.store)
        offset = self.block_id_offset
        copy_blocks(self.store, [(s + offset, d + offset) for s, d in migrations])
        if wait:
            self.sync()
        copied = time.perf_counter()
        self.store.detach(sync=wait)  # with sync, the pool waits for the device first
        end = time.perf_counter()
        self.migration_latencies_s.append(copied - start)
        self.detach_latencies_s.append(end - start)
        self.transitions.append(Transition(step_id, "detach", handles, end - start,
                                           copy_s=copied - start, unmap_s=end - copied,
                                           behind_step=int(not wait)))
        self._notify()
        return end - start

    def _map_timed(self, kind: str, handles: int, step_id: int, sync: bool) -> float:
        """Release torch's cache (release mode), map `handles` (then sync, with `sync`), and
        record the transition; returns its seconds (an attach's latency)."""
        start = time.perf_counter()
        cleared, freed = self._clear_cache()
        self._map(handles)
        if sync:
            self.sync()
        end = time.perf_counter()
        self.attach_latencies_s.append(end - start)
        self.transitions.append(Transition(step_id, kind, handles, end - start,
                                           empty_cache_s=cleared - start, map_s=end - cleared,
                                           freed_bytes=freed))
        return end - start

    def _clear_cache(self) -> tuple[float, int]:
        """Release mode: torch's cached blocks handed back. (the time after, bytes freed)."""
        if self.empty_cache is None:
            return time.perf_counter(), 0
        before = self.reserved_bytes() if self.reserved_bytes is not None else 0
        self.empty_cache()
        after = self.reserved_bytes() if self.reserved_bytes is not None else 0
        return time.perf_counter(), max(0, before - after)

    def _map(self, num_handles: int) -> None:
        if self.partial_attach:
            self.store.attach(num_handles=num_handles)
        else:
            self.store.attach()
        self._notify()

    def _notify(self) -> None:
        if self.on_mapped is not None:
            self.on_mapped(self.mapped_bytes)

    # --------------------------------------------------------------- overcommit
    def ensure_mapped(self, out: SchedulerOutput) -> float:
        """Overcommit: map the handles the step's elastic blocks need; returns seconds spent."""
        if self.policy is not Policy.OVERCOMMIT:
            return 0.0
        top = max((b for s in out.scheduled for b in s.new_block_ids), default=-1)
        num_elastic = top - self.num_core_base_blocks + 1
        if num_elastic <= 0 or top + self.block_id_offset < self.num_mapped_device_blocks:
            return 0.0
        return self._map_timed("map", self.handles_for(num_elastic), out.step_id, sync=False)


def _handle_sizes(store) -> tuple[int, ...]:
    sizes = getattr(store, "elastic_handle_sizes", None)
    return sizes if sizes is not None else store.plan.elastic_handle_sizes
