"""ElasticKVPool: a paged KV cache on one CUDA virtual range whose upper part comes and goes.

The base blocks are backed by handles mapped for the pool's lifetime. The elastic reserve
(the memory an engine keeps for its largest prefill's activations) is a list of separately
created handles that are *attached* (mapped into the top of the KV range) while only
decode runs, and *detached* before a prefill needs the memory. See ``layout.py`` for the
byte layout. Data pointers never change, so CUDA graphs captured over the KV views stay
valid across attach/detach.

Giving the memory to activations (``reclaim``):

* ``"remap"`` (default): detach maps the *same* handles into a second, pre-reserved range,
  exposed as :meth:`activation_arena`, a uint8 tensor the engine carves activations from.
  No handle is created or released after construction and torch's allocator is untouched,
  so a transition costs only per-handle map/unmap/set-access and cannot fail for lack of
  memory. Default for that reason (provisional until ``benchmarks/vmm_latency.py`` has run
  on the H200): release mode adds create/release per handle to every transition plus a
  cudaMalloc/empty_cache round trip in torch, and its attach can fail with out-of-memory.
* ``"release"``: detach releases the handles (``cuMemRelease``) so torch's own caching
  allocator can take the physical memory; attach creates them again and fails with
  ``CUDA_ERROR_OUT_OF_MEMORY`` (state unchanged) unless torch gave it back first
  (``torch.cuda.empty_cache()``).

Contract: elastic block contents are UNDEFINED after a detach (activations may overwrite
them, or the memory is new); callers must treat elastic blocks as empty after re-attach.
Base blocks are always preserved.

Safety: the pool synchronizes (the context, or ``sync_streams``) before every unmap, since
unmap does not wait for queued kernels; ``detach`` raises :class:`ElasticBusyError` while any
elastic block is live (:meth:`mark_allocated` or the ``live_elastic_blocks`` callable);
elastic blocks cannot be marked while detached. A failed driver call rolls the transition
back, leaving the state as before, and the error names the call. Every handle is released
exactly once: by ``close()``, the context manager, or at interpreter exit (atexit).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from gpu_backend.vmm.driver import VmmDriver
from gpu_backend.vmm.errors import ElasticBusyError, ElasticDetachedError, PoolClosedError
from gpu_backend.vmm.layout import GIB, MIB, KVLayout, plan_pool
from gpu_backend.vmm.state import (
    Chunk,
    ElasticBlockTracker,
    ElasticLocation,
    PoolStats,
    Reclaim,
    TransitionTimer,
    undo_on_error,
)
from gpu_backend.vmm.torch_views import TensorCache


class ElasticKVPool:
    """Base + elastic KV blocks on one virtual range; see the module docstring."""

    def __init__(self, layout: KVLayout, num_base_blocks: int, elastic_reserve_bytes: int, *,
                 elastic_handle_bytes: int = 512 * MIB, base_handle_bytes: int = 2 * GIB,
                 reclaim: Reclaim | str = Reclaim.REMAP, start_attached: bool = False,
                 driver: Any = None, device_ordinal: int = 0,
                 live_elastic_blocks: Callable[[], int] | None = None,
                 sync_streams: Sequence[Any] = ()) -> None:
        self._owns_driver = not isinstance(driver, VmmDriver)
        self._driver = VmmDriver(driver, device_ordinal) if self._owns_driver else driver
        try:
            self.plan = plan_pool(layout, num_base_blocks, elastic_reserve_bytes, base_handle_bytes,
                                  elastic_handle_bytes, self._driver.granularity_bytes)
        except ValueError:
            if self._owns_driver:
                self._driver.release_context()
            raise
        self.layout = layout
        self.reclaim = Reclaim(reclaim)
        self._sync_streams = tuple(sync_streams)
        self._blocks = ElasticBlockTracker(num_base_blocks, self.plan.num_blocks, live_elastic_blocks)
        self._lock = threading.RLock()
        self._timer = TransitionTimer()
        self._base: list[Chunk] = []
        self._elastic: list[Chunk] = []
        self._kv_address: int | None = None
        self._activation_address: int | None = None
        self._location = ElasticLocation.NOWHERE
        self._tensors = TensorCache(layout, self.plan.num_blocks, self._driver.device_ordinal)
        self._closed = False
        self._num_handles_created = 0
        with undo_on_error() as undo:
            undo.append(self._close_unregistered)
            self._build(start_attached)
        atexit.register(self.close)

    # -- construction -----------------------------------------------------------------------

    def _build(self, start_attached: bool) -> None:
        plan, drv = self.plan, self._driver
        self._kv_address = drv.reserve(plan.total_bytes)
        for size, offset in zip(plan.base_handle_sizes,
                                plan.handle_offsets(plan.base_handle_sizes, 0), strict=True):
            chunk = Chunk(size, offset, self._create(size))
            self._base.append(chunk)
            drv.map(self._kv_address + offset, size, chunk.handle)
            chunk.mapped_at = self._kv_address + offset
        if plan.base_bytes:
            drv.set_access(self._kv_address, plan.base_bytes)
        offsets = plan.handle_offsets(plan.elastic_handle_sizes, plan.base_bytes)
        self._elastic = [Chunk(size, offset, None)
                         for size, offset in zip(plan.elastic_handle_sizes, offsets, strict=True)]
        if self.reclaim is Reclaim.REMAP:
            self._activation_address = drv.reserve(plan.elastic_bytes)
            self._create_elastic([])
            self._map_elastic(self._activation_address, [])
            self._location = ElasticLocation.ACTIVATIONS
        if start_attached:
            self.attach()
        self._timer = TransitionTimer()  # construction is not a measured transition

    # -- elastic primitives (each pushes its undo) -------------------------------------------

    def _elastic_base(self, location: ElasticLocation) -> int:
        assert self._kv_address is not None
        if location is ElasticLocation.KV:
            return self._kv_address + self.plan.base_bytes
        assert self._activation_address is not None
        return self._activation_address

    def _create_elastic(self, undo: list[Callable[[], None]],
                        chunks: Sequence[Chunk] | None = None) -> None:
        for chunk in self._elastic if chunks is None else chunks:
            if chunk.handle is None:
                chunk.handle = self._create(chunk.size_bytes)
                undo.append(partial(self._release_chunk, chunk))

    def _map_elastic(self, region_address: int, undo: list[Callable[[], None]],
                     chunks: Sequence[Chunk] | None = None) -> None:
        """Map `chunks` (consecutive; all by default) at their offsets in the region."""
        drv, base = self._driver, self.plan.base_bytes
        chunks = self._elastic if chunks is None else chunks
        for chunk in chunks:
            address = region_address + chunk.offset_bytes - base
            drv.map(address, chunk.size_bytes, chunk.handle)
            chunk.mapped_at = address
            undo.append(partial(self._unmap_chunk, chunk))
        if chunks:
            drv.set_access(region_address + chunks[0].offset_bytes - base,
                           sum(c.size_bytes for c in chunks))

    def _unmap_elastic(self, region_address: int, undo: list[Callable[[], None]]) -> None:
        """Unmap every mapped elastic chunk (a prefix after a partial attach); on rollback
        re-map them and restore access last."""
        mapped = [c for c in self._elastic if c.mapped_at is not None]
        undo.append(partial(self._driver.set_access, region_address,
                            sum(c.size_bytes for c in mapped)))
        for chunk in mapped:
            address = chunk.mapped_at
            assert address is not None
            self._unmap_chunk(chunk)
            undo.append(partial(self._remap_chunk, chunk, address))

    def _create(self, size_bytes: int) -> Any:
        handle = self._driver.create(size_bytes)
        self._num_handles_created += 1
        return handle

    def _unmap_chunk(self, chunk: Chunk) -> None:
        if chunk.mapped_at is not None:
            self._driver.unmap(chunk.mapped_at, chunk.size_bytes)
            chunk.mapped_at = None

    def _remap_chunk(self, chunk: Chunk, address: int) -> None:
        self._driver.map(address, chunk.size_bytes, chunk.handle)
        chunk.mapped_at = address

    def _release_chunk(self, chunk: Chunk) -> None:
        """Release a handle once: it is forgotten only after cuMemRelease succeeds."""
        if chunk.handle is not None:
            self._driver.release(chunk.handle)
            chunk.handle = None

    def _sync(self) -> None:
        self._driver.synchronize(self._sync_streams)

    # -- attach / detach -----------------------------------------------------------------------

    @property
    def attached(self) -> bool:
        return self._location is ElasticLocation.KV

    @property
    def num_mapped_handles(self) -> int:
        """Elastic handles mapped into the KV range now (a prefix of the reserve's handles)."""
        if not self.attached:
            return 0
        return sum(c.mapped_at is not None for c in self._elastic)

    def attach(self, num_handles: int | None = None) -> None:
        """Map the first `num_handles` elastic handles (all by default) into the top of the
        KV range. Called again with a larger count it maps the next handles (incremental
        attach, e.g. on first use under overcommit); a count already mapped is a no-op.

        Partial attach needs reclaim="release": in remap mode the unmapped rest would leave
        holes in the activation arena.
        """
        with self._lock:
            self._check_open()
            total = len(self._elastic)
            target = total if num_handles is None else num_handles
            if not 0 <= target <= total:
                raise ValueError(f"can attach 0..{total} elastic handles, not {target}")
            if target < total and self.reclaim is Reclaim.REMAP:
                raise ValueError("partial attach needs reclaim='release' (remap mode moves the "
                                 "whole reserve between the KV range and the activation arena)")
            first = self.num_mapped_handles
            if target <= first:
                return
            start = time.perf_counter()
            with undo_on_error() as undo:
                if self._location is ElasticLocation.ACTIVATIONS:
                    self._sync()  # activation kernels may still use the arena
                    self._unmap_elastic(self._elastic_base(ElasticLocation.ACTIVATIONS), undo)
                chunks = self._elastic[first:target]
                self._create_elastic(undo, chunks)
                self._map_elastic(self._elastic_base(ElasticLocation.KV), undo, chunks)
            self._location = ElasticLocation.KV
            self._timer.record_attach(time.perf_counter() - start)

    def detach(self) -> None:
        """Unmap the elastic blocks and lend their memory to activations (no-op when detached).

        Raises ElasticBusyError while any elastic block is live; the caller drains first.
        """
        with self._lock:
            self._check_open()
            if not self.attached:
                return
            num_live = self.num_live_elastic_blocks()
            if num_live:
                raise ElasticBusyError(
                    f"cannot detach: {num_live} elastic block(s) in [{self.plan.num_base_blocks}, "
                    f"{self.plan.num_blocks}) are still allocated; free or migrate them first")
            start = time.perf_counter()
            self._sync()  # unmap does not wait for kernels still reading the KV cache
            with undo_on_error() as undo:
                self._unmap_elastic(self._elastic_base(ElasticLocation.KV), undo)
                if self.reclaim is Reclaim.REMAP:
                    self._map_elastic(self._elastic_base(ElasticLocation.ACTIVATIONS), undo)
            self._location = ElasticLocation.ACTIVATIONS
            errors: list[Exception] = []
            if self.reclaim is Reclaim.RELEASE:
                self._location = ElasticLocation.NOWHERE
                for chunk in self._elastic:  # not undoable: a handle that fails to release
                    try:  # is kept, reused by attach() and retried by close()
                        self._release_chunk(chunk)
                    except Exception as exc:  # noqa: BLE001 - release the others first
                        errors.append(exc)
            self._timer.record_detach(time.perf_counter() - start)
            if errors:
                raise errors[0]

    # -- live elastic blocks ---------------------------------------------------------------

    def mark_allocated(self, block_ids: Iterable[int]) -> None:
        """Record blocks as holding live KV; live elastic blocks keep the reserve attached."""
        with self._lock:
            self._blocks.mark_allocated(block_ids, self.attached)

    def mark_freed(self, block_ids: Iterable[int]) -> None:
        with self._lock:
            self._blocks.mark_freed(block_ids)

    def num_live_elastic_blocks(self) -> int:
        return self._blocks.num_live()

    # -- addresses and torch views ---------------------------------------------------------

    @property
    def kv_address(self) -> int:
        self._check_open()
        assert self._kv_address is not None
        return self._kv_address

    def block_address(self, block_id: int) -> int:
        """Device address of block ``block_id`` (all its layers follow contiguously)."""
        self._blocks.elastic_ids([block_id])  # range check
        return self.kv_address + block_id * self.layout.block_bytes

    def k_cache(self, layer: int) -> Any:
        """Layer's K cache, ``[num_blocks, block_size, num_kv_heads, head_dim]``, zero-copy."""
        return self._layer_view(layer, 0)

    def v_cache(self, layer: int) -> Any:
        """Layer's V cache, same shape and strides as :meth:`k_cache`."""
        return self._layer_view(layer, 1)

    def _layer_view(self, layer: int, kv_index: int) -> Any:
        with self._lock:
            if not self.plan.num_base_blocks and not self.attached:
                raise ElasticDetachedError("build the views while attached: nothing is mapped yet")
            return self._tensors.layer(self.kv_address, self.plan.total_bytes, layer, kv_index)

    def activation_arena(self) -> Any:
        """uint8 tensor over the lent reserve (remap mode, detached); its address never changes."""
        with self._lock:
            if self._location is not ElasticLocation.ACTIVATIONS:
                raise RuntimeError(f"no activation arena: reclaim={self.reclaim.value} and the "
                                   f"elastic memory is at {self._location.value}; detach() in remap mode")
            return self._tensors.arena(self._elastic_base(ElasticLocation.ACTIVATIONS),
                                       self.plan.elastic_bytes)

    # -- reporting and teardown ---------------------------------------------------------------

    def stats(self) -> PoolStats:
        chunks = self._base + self._elastic
        mapped = sum(c.size_bytes for c in chunks if c.mapped_at is not None)
        reserved = self.plan.total_bytes + (self.plan.elastic_bytes if self._activation_address else 0)
        return self._timer.stats(
            mapped_bytes=mapped, reserved_virtual_bytes=0 if self._closed else reserved,
            num_handles_created=self._num_handles_created, attached=self.attached,
            num_handles_live=sum(c.handle is not None for c in chunks),
            num_live_elastic_blocks=self.num_live_elastic_blocks())

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("the ElasticKVPool is closed")

    def close(self) -> None:
        """Sync, unmap, release every handle once and free both ranges (idempotent)."""
        with self._lock:
            if self._closed:
                return
            atexit.unregister(self.close)
            self._close_unregistered()

    def _close_unregistered(self) -> None:
        self._closed = True
        self._tensors.clear()
        errors: list[BaseException] = []
        steps: list[Callable[[], None]] = [self._sync]
        steps += [partial(self._unmap_chunk, c) for c in self._elastic + self._base]
        steps += [partial(self._release_chunk, c) for c in self._elastic + self._base]
        for address, size in ((self._kv_address, self.plan.total_bytes),
                              (self._activation_address, self.plan.elastic_bytes)):
            if address is not None:
                steps.append(partial(self._driver.free_range, address, size))
        if self._owns_driver:
            steps.append(self._driver.release_context)
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - keep releasing, report the first failure
                errors.append(exc)
        self._kv_address = self._activation_address = None
        self._location = ElasticLocation.NOWHERE
        if errors:
            raise errors[0]

    def __enter__(self) -> ElasticKVPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
