"""Move physical chunks between their places, recording each driver call's effect at once.

Every state change of the pool goes through :class:`ChunkOps`: one driver call, then the
record of what it did, with nothing in between that can raise. The pool runs these inside
its lock and :func:`~gpu_backend.vmm.signals.defer_signals`, so a Ctrl-C cannot fall between a
call and its record either. A transition is a :meth:`ChunkOps.converge` to per-chunk
:class:`~gpu_backend.vmm.state.Target` s, written so that it works from *any* starting state
(a half-finished attach included); rolling back is converging to the targets of before.

After a failure :meth:`ChunkOps.reconcile` asks the driver what is mapped at each of a
chunk's places (``cuMemRetainAllocationHandle``: which handle, if any; ``cuMemGetAccess``:
whether access is granted) and corrects the record, so a driver that acted and still
reported an error cannot leave the pool believing something false. Which handles exist is
the pool's own record: a handle is recorded the moment ``cuMemCreate`` returns it and
forgotten only once ``cuMemRelease`` succeeded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from gpu_backend.vmm.driver import VmmDriver
from gpu_backend.vmm.state import Chunk, Target


class ChunkOps:
    """Driver calls on chunks, each followed at once by its record; see the module docstring."""

    def __init__(self, driver: VmmDriver, sync: Callable[[], None]) -> None:
        self.driver = driver
        self.sync = sync  # waits for kernels; runs before any unmap
        self.num_handles_created = 0

    # -- single calls ---------------------------------------------------------------------

    def create(self, chunk: Chunk) -> None:
        chunk.handle = self.driver.create(chunk.size_bytes)
        chunk.num_refs = 1
        self.num_handles_created += 1

    def release(self, chunk: Chunk) -> None:
        """Drop every reference the pool holds; the handle is forgotten after the last one."""
        while chunk.num_refs:
            self.driver.release(chunk.handle)
            chunk.num_refs -= 1
        chunk.handle = None

    def map(self, chunk: Chunk, address: int) -> None:
        self.driver.map(address, chunk.size_bytes, chunk.handle)
        chunk.mappings[address] = False

    def unmap(self, chunk: Chunk, address: int) -> None:
        self.driver.unmap(address, chunk.size_bytes)
        del chunk.mappings[address]

    def grant(self, run: list[tuple[Chunk, int]]) -> None:
        """Read/write access over consecutive mappings, in one call."""
        self.driver.set_access(run[0][1], sum(chunk.size_bytes for chunk, _ in run))
        for chunk, address in run:
            chunk.mappings[address] = True

    # -- transitions ----------------------------------------------------------------------

    def converge(self, targets: dict[Chunk, Target], best_effort: bool = False,
                 sync: bool = True) -> list[Exception]:
        """Bring every chunk to its target: sync, unmap what is elsewhere, create, map, grant
        access, release. Stops at the first failure unless ``best_effort``, which goes on with
        the steps that do not depend on a failed one and returns the failures.

        A chunk is mapped at a new place only once it is mapped nowhere else, so no two
        addresses ever alias the same memory; nothing is unmapped unless the sync succeeded.
        ``sync=False`` unmaps without the sync: for a caller that knows no queued kernel
        touches the chunks being unmapped.
        """
        errors: list[Exception] = []

        def attempt(step: Callable[..., None], *args: Any) -> None:
            try:
                step(*args)
            except Exception as exc:
                if not best_effort:
                    raise
                errors.append(exc)

        stale = [(c, a) for c, t in targets.items() for a in list(c.mappings) if a != t.address]
        if stale:
            num_errors = len(errors)
            if sync:
                attempt(self.sync)
            for chunk, address in stale if len(errors) == num_errors else ():
                attempt(self.unmap, chunk, address)
        placed = [(c, t.address) for c, t in targets.items() if t.address is not None]
        for chunk, _ in placed:
            if chunk.handle is None:
                attempt(self.create, chunk)
        for chunk, address in placed:
            if chunk.handle is not None and not chunk.mappings:
                attempt(self.map, chunk, address)
        for run in _consecutive((c, a) for c, a in placed if c.mappings.get(a) is False):
            attempt(self.grant, run)
        for chunk, target in targets.items():
            if target.address is None and not target.keep_handle and not chunk.mappings:
                attempt(self.release, chunk)
        return errors

    def release_unmapped(self, chunks: Iterable[Chunk]) -> list[Exception]:
        """Release every unmapped chunk's handle; a failure does not stop the others."""
        return self.converge({c: Target(None, keep_handle=False) for c in chunks
                              if not c.mappings}, best_effort=True)

    # -- what the driver reports ------------------------------------------------------------

    def reconcile(self, chunks: Iterable[Chunk]) -> None:
        """Correct each chunk's mappings from the driver; where it cannot say, keep the record."""
        for chunk in chunks:
            for address in chunk.slots:
                try:
                    accessible = self._probe(chunk, address)
                except Exception:  # noqa: BLE001 - no answer: the record stands
                    continue
                if accessible is None:
                    chunk.mappings.pop(address, None)
                else:
                    chunk.mappings[address] = accessible

    def _probe(self, chunk: Chunk, address: int) -> bool | None:
        """None when this chunk's handle is not mapped at ``address``, else whether access is
        granted there. The query takes a reference on the handle, released again at once."""
        handle = self.driver.retain_mapped(address)
        if handle is None:
            return None
        if chunk.handle is None or int(handle) != int(chunk.handle):
            with contextlib.suppress(Exception):  # not this chunk's: nothing of ours to record
                self.driver.release(handle)
            return None
        chunk.num_refs += 1
        with contextlib.suppress(Exception):  # kept in num_refs, released with the chunk
            self.driver.release(handle)
            chunk.num_refs -= 1
        try:
            return self.driver.is_accessible(address)
        except Exception:  # noqa: BLE001 - mapped; access as recorded (never granted: False)
            return chunk.mappings.get(address, False)


def _consecutive(pairs: Iterable[tuple[Chunk, int]]) -> list[list[tuple[Chunk, int]]]:
    """Group (chunk, address) pairs into runs whose addresses follow on without a gap."""
    runs: list[list[tuple[Chunk, int]]] = []
    for chunk, address in sorted(pairs, key=lambda pair: pair[1]):
        if runs and runs[-1][-1][1] + runs[-1][-1][0].size_bytes == address:
            runs[-1].append((chunk, address))
        else:
            runs.append([(chunk, address)])
    return runs
