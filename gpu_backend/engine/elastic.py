"""Carry out the core's elastic actions on the real KV store, and time them.

    ATTACH      (release mode) torch.cuda.empty_cache() so the reserve's memory leaves torch's
                cache, then map the handles covering the blocks the controller lent
    DETACH      copy migrated blocks (whole blocks: every layer is contiguous), then unmap; the
                pool synchronizes before the unmap, and refuses while elastic blocks are live
    DRAIN_WAIT  nothing to do on the device

Overcommit maps the reserve handle by handle as elastic blocks are first used (the core's
`activation_need` counts used elastic blocks, so mapping on first use is the faithful match);
the mapped prefix only grows. Each transition is timed with perf_counter after a device sync.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

from gpu_backend.engine.kv_store import copy_blocks, mapped_device_blocks, mapped_elastic_bytes
from sim.core.elastic import Policy
from sim.core.step import ElasticActionKind, SchedulerOutput


class ElasticExecutor:
    def __init__(self, store, policy: Policy, *, block_id_offset: int, num_core_base_blocks: int,
                 sync: Callable[[], None], empty_cache: Callable[[], None] | None = None,
                 on_mapped: Callable[[int], None] | None = None) -> None:
        self.store, self.policy = store, policy
        self.block_id_offset = block_id_offset
        self.num_core_base_blocks = num_core_base_blocks
        self.sync = sync
        self.empty_cache = empty_cache  # release mode: give torch's cached blocks back first
        self.on_mapped = on_mapped  # told the mapped elastic bytes after every change
        self.partial_attach = "num_handles" in inspect.signature(store.attach).parameters
        self.attach_latencies_s: list[float] = []
        self.detach_latencies_s: list[float] = []
        self.migration_latencies_s: list[float] = []

    # ----------------------------------------------------------------- queries
    @property
    def mapped_bytes(self) -> int:
        return mapped_elastic_bytes(self.store)

    @property
    def num_mapped_device_blocks(self) -> int:
        return mapped_device_blocks(self.store)

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
    def apply(self, out: SchedulerOutput) -> float:
        """Run `out.elastic`; returns the measured pause in seconds."""
        action = out.elastic
        if action is None or action.kind is ElasticActionKind.DRAIN_WAIT:
            return 0.0
        if action.kind is ElasticActionKind.ATTACH:
            return self.attach(out.num_lent_blocks)
        return self.detach(action.migrations)

    def attach(self, num_lent_blocks: int) -> float:
        """Map the handles covering `num_lent_blocks` elastic blocks; returns the seconds."""
        self.sync()
        start = time.perf_counter()
        if self.empty_cache is not None:
            self.empty_cache()
        self._map(self.handles_for(num_lent_blocks))
        self.sync()
        elapsed = time.perf_counter() - start
        self.attach_latencies_s.append(elapsed)
        return elapsed

    def detach(self, migrations: tuple[tuple[int, int], ...] = ()) -> float:
        """Copy `migrations` (core block ids), then unmap the reserve; returns the seconds."""
        self.sync()
        start = time.perf_counter()
        offset = self.block_id_offset
        copy_blocks(self.store, [(s + offset, d + offset) for s, d in migrations])
        self.sync()
        copied = time.perf_counter()
        self.store.detach()  # synchronizes before unmapping
        elapsed = time.perf_counter() - start
        self.migration_latencies_s.append(copied - start)
        self.detach_latencies_s.append(elapsed)
        self._notify()
        return elapsed

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
        start = time.perf_counter()
        if self.empty_cache is not None:
            self.empty_cache()
        self._map(self.handles_for(num_elastic))
        elapsed = time.perf_counter() - start
        self.attach_latencies_s.append(elapsed)
        return elapsed


def _handle_sizes(store) -> tuple[int, ...]:
    sizes = getattr(store, "elastic_handle_sizes", None)
    return sizes if sizes is not None else store.plan.elastic_handle_sizes
