"""Everything a pool holds on the device, what of it is usable, and how it is given back.

:class:`PoolHoldings` owns the two virtual ranges and the chunks (physical handles) of one
pool. It answers the questions an engine's safety rests on from the per-chunk record that
:class:`~gpu_backend.vmm.placement.ChunkOps` keeps exact: how many elastic handles are usable
in the KV range (a prefix, mapped there with access and nowhere else), where the reserve is,
and every mapping. Transitions (:meth:`PoolHoldings.move`) roll back on failure; teardown
(:meth:`PoolHoldings.release_all`) goes on past failures and says what is left.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpu_backend.vmm.driver import VmmDriver
from gpu_backend.vmm.layout import MIB, PoolPlan
from gpu_backend.vmm.placement import ChunkOps
from gpu_backend.vmm.state import Chunk, ElasticLocation, MappedRange, Region, Target


class PoolHoldings:
    """The ranges and chunks of one pool; see the module docstring."""

    def __init__(self, driver: VmmDriver, plan: PoolPlan, sync: Callable[[], None],
                 owns_context: bool) -> None:
        self.driver = driver
        self.plan = plan
        self.ops = ChunkOps(driver, sync)
        self.owns_context = owns_context  # release the driver's context reference at the end
        self.base: list[Chunk] = []
        self.elastic: list[Chunk] = []
        self.kv_address: int | None = None
        self.activation_address: int | None = None  # remap mode only

    def build(self, with_arena: bool) -> None:
        """Reserve the KV range, map the base handles for good, and (remap mode) reserve the
        activation range and map the reserve's handles there."""
        plan, drv = self.plan, self.driver
        kv = self.kv_address = drv.reserve(plan.total_bytes)
        self.base = [Chunk(size, kv + offset) for size, offset in
                     zip(plan.base_handle_sizes, plan.handle_offsets(plan.base_handle_sizes, 0),
                         strict=True)]
        self.ops.converge({c: Target(c.kv_address) for c in self.base})
        arena = None  # the activation range's start, less the base part (offsets start there)
        if with_arena:
            self.activation_address = drv.reserve(plan.elastic_bytes)
            arena = self.activation_address - plan.base_bytes
        offsets = plan.handle_offsets(plan.elastic_handle_sizes, plan.base_bytes)
        self.elastic = [Chunk(size, kv + offset, None if arena is None else arena + offset)
                        for size, offset in zip(plan.elastic_handle_sizes, offsets, strict=True)]
        if arena is not None:
            self.ops.converge({c: Target(c.arena_address) for c in self.elastic})

    # -- what is usable -----------------------------------------------------------------------

    def num_usable_handles(self) -> int:
        """The prefix of elastic handles mapped in the KV range with access, nowhere else."""
        count = 0
        for chunk in self.elastic:
            if not chunk.usable_at(chunk.kv_address):
                break
            count += 1
        return count

    def location(self) -> ElasticLocation:
        mapped = [c for c in self.elastic if c.mappings]
        if not mapped:
            return ElasticLocation.NOWHERE
        if len(mapped) == self.num_usable_handles():
            return ElasticLocation.KV
        arena = [c for c in self.elastic
                 if c.arena_address is not None and c.usable_at(c.arena_address)]
        if len(arena) == len(mapped) == len(self.elastic):
            return ElasticLocation.ACTIVATIONS
        return ElasticLocation.MIXED

    def mapped_ranges(self) -> tuple[MappedRange, ...]:
        ranges = [MappedRange(address, chunk.size_bytes, chunk.handle, accessible,
                              self._region_of(chunk, address))
                  for chunk in self.base + self.elastic
                  for address, accessible in chunk.mappings.items()]
        return tuple(sorted(ranges, key=lambda r: r.address))

    def _region_of(self, chunk: Chunk, address: int) -> Region:
        if address == chunk.arena_address:
            return Region.ARENA
        return Region.BASE if any(chunk is c for c in self.base) else Region.ELASTIC

    def chunks(self) -> list[Chunk]:
        return self.base + self.elastic

    def reserved_bytes(self) -> int:
        ranges = ((self.kv_address, self.plan.total_bytes),
                  (self.activation_address, self.plan.elastic_bytes))
        return sum(size for address, size in ranges if address is not None)

    # -- transitions ----------------------------------------------------------------------------

    def move(self, targets: dict[Chunk, Target], sync: bool = True) -> None:
        """Converge to `targets`; on failure read the truth back from the driver, roll back to
        what was usable before, and read it back again if the rollback failed too. `sync`:
        see `ChunkOps.converge` (a rollback always synchronizes)."""
        before = {c: c.current_target() for c in targets}
        try:
            self.ops.converge(targets, sync=sync)
        except BaseException as exc:
            self.ops.reconcile(self.elastic)
            rollback_errors = self.ops.converge(before, best_effort=True)
            for error in rollback_errors:
                exc.add_note(f"rollback step also failed: {error}")
            if rollback_errors:
                self.ops.reconcile(self.elastic)
                exc.add_note(f"the reserve is left {self.location().value}: "
                             f"{self.num_usable_handles()} handle(s) usable in the KV range")
            raise

    def release_all(self) -> list[Exception]:
        """Sync, unmap, release, free both ranges, drop the context, going on past failures
        (never unmapping without a sync, never freeing a range that is still mapped)."""
        chunks = self.elastic + self.base
        errors = self.ops.converge({c: Target(None, keep_handle=False) for c in chunks},
                                   best_effort=True)
        if errors:
            self.ops.reconcile(chunks)
        for name, size_bytes in (("kv_address", self.plan.total_bytes),
                                 ("activation_address", self.plan.elastic_bytes)):
            address = getattr(self, name)
            if address is None or any(address <= a < address + size_bytes
                                      for c in chunks for a in c.mappings):
                continue
            if _attempt(errors, self.driver.free_range, address, size_bytes):
                setattr(self, name, None)
        if self.owns_context and not self._held_memory():
            _attempt(errors, self.driver.release_context)
        return errors

    def held(self) -> list[str]:
        """What is still held, in words, for errors and for idempotence."""
        held = self._held_memory()
        if self.owns_context and self.driver.holds_context:
            held.append("a reference on the primary context (released after the rest)")
        return held

    def _held_memory(self) -> list[str]:
        held: list[str] = []
        for kind, chunks in (("base", self.base), ("elastic", self.elastic)):
            for index, chunk in enumerate(chunks):
                name = f"{kind} handle {index} ({chunk.size_bytes / MIB:g} MiB)"
                held += [f"{name} mapped at {address:#x}" for address in chunk.mappings]
                if chunk.handle is not None:
                    held.append(name if chunk.num_refs == 1 else f"{name}, {chunk.num_refs} references")
        for name, address, size_bytes in (
                ("KV range", self.kv_address, self.plan.total_bytes),
                ("activation range", self.activation_address, self.plan.elastic_bytes)):
            if address is not None:
                held.append(f"{name} at {address:#x} ({size_bytes / MIB:g} MiB)")
        return held


def _attempt(errors: list[Exception], step: Callable[..., Any], *args: Any) -> bool:
    try:
        step(*args)
    except Exception as exc:  # noqa: BLE001 - reported with the rest
        errors.append(exc)
        return False
    return True
