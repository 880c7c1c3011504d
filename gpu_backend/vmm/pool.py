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
unmap does not wait for queued kernels; only ``detach(sync=False)`` skips that, for a caller
that knows no queued kernel reads or writes an elastic block (an engine whose step in flight
holds none in its tables; its activations then come from memory released behind it).
``detach`` raises :class:`ElasticBusyError` while any elastic block is live
(:meth:`mark_allocated` or the ``live_elastic_blocks`` callable); elastic blocks can be marked
only inside the mapped part.

Which elastic blocks an engine may use: those inside the first :attr:`num_mapped_handles`
handles. That count is the prefix of handles mapped in the KV range *with access granted*
and mapped nowhere else; ``attached`` means it is above zero. Neither ever counts memory the
driver has not mapped, whatever failed before.

Failures: a failed driver call rolls the transition back and the error names the call. A
transition and its rollback run with SIGINT/SIGTERM deferred (``signals.py``), so a Ctrl-C
lands after the pool's record is complete. After any failure the pool re-reads from the
driver what is mapped where (``placement.py``); if the rollback failed too, the pool is left
in a state it describes exactly (:meth:`mapped_ranges`, ``location`` MIXED) and the next
``attach``/``detach`` starts from there. Every handle is released exactly once: by
``close()``, the context manager, or at interpreter exit (atexit); ``close()`` goes on past a
failed call and, if anything is left, raises :class:`PoolCloseError` naming it; calling it
again retries.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpu_backend.vmm.driver import VmmDriver
from gpu_backend.vmm.errors import (
    ElasticBusyError,
    ElasticDetachedError,
    PoolClosedError,
    PoolCloseError,
)
from gpu_backend.vmm.holdings import PoolHoldings
from gpu_backend.vmm.layout import GIB, MIB, KVLayout, plan_pool
from gpu_backend.vmm.signals import defer_signals
from gpu_backend.vmm.state import (
    ElasticBlockTracker,
    ElasticLocation,
    MappedRange,
    PoolStats,
    Reclaim,
    Target,
    TransitionTimer,
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
        self.layout = layout
        self.reclaim = Reclaim(reclaim)
        self._sync_streams = tuple(sync_streams)
        self._lock = threading.RLock()
        self._timer = TransitionTimer()
        self._closed = False
        owns_driver = not isinstance(driver, VmmDriver)
        try:
            with defer_signals():  # from the context's retain to the last map: one section
                self._driver = VmmDriver(driver, device_ordinal) if owns_driver else driver
                self.plan = plan_pool(layout, num_base_blocks, elastic_reserve_bytes,
                                      base_handle_bytes, elastic_handle_bytes,
                                      self._driver.granularity_bytes)
                self._blocks = ElasticBlockTracker(num_base_blocks, self.plan.num_blocks,
                                                   live_elastic_blocks)
                self._tensors = TensorCache(layout, self.plan.num_blocks,
                                            self._driver.device_ordinal)
                self._holdings = PoolHoldings(self._driver, self.plan, self._sync, owns_driver)
                self._holdings.build(with_arena=self.reclaim is Reclaim.REMAP)
                if start_attached:
                    self.attach()
                self._timer = TransitionTimer()  # construction is not a measured transition
        except BaseException as exc:  # a Ctrl-C delivered at the section's end included
            self._give_back_after_failed_init(exc, owns_driver)
            raise
        atexit.register(self.close)

    def _give_back_after_failed_init(self, exc: BaseException, owns_driver: bool) -> None:
        """Release what the constructor took; what cannot be is retried at interpreter exit."""
        self._closed = True
        with defer_signals():
            if hasattr(self, "_holdings"):
                self._holdings.release_all()
                held, retry = self._holdings.held(), self.close
            elif owns_driver and hasattr(self, "_driver"):
                with contextlib.suppress(Exception):
                    self._driver.release_context()
                held = ["a reference on the primary context"] if self._driver.holds_context else []
                retry = self._driver.release_context
            else:
                held = []
        if held:
            exc.add_note(f"cleanup left held: {'; '.join(held)}; retried at exit")
            atexit.register(retry)

    def _sync(self) -> None:
        self._driver.synchronize(self._sync_streams)

    # -- where the elastic reserve is ---------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once close() was called, even if it could not give everything back."""
        return self._closed

    @property
    def num_mapped_handles(self) -> int:
        """Elastic handles usable in the KV range now: the prefix mapped there with access
        (none once closed). The engine's block tables may use their blocks and no others."""
        return 0 if self._closed else self._holdings.num_usable_handles()

    @property
    def attached(self) -> bool:
        return self.num_mapped_handles > 0

    @property
    def location(self) -> ElasticLocation:
        """Where the reserve is; MIXED when no clean state describes it (see mapped_ranges)."""
        return self._holdings.location()

    def mapped_ranges(self) -> tuple[MappedRange, ...]:
        """Every mapping the pool holds, by address: after a failure, as the driver reported."""
        return self._holdings.mapped_ranges()

    def _num_usable_elastic_blocks(self) -> int:
        usable_bytes = sum(self.plan.elastic_handle_sizes[:self.num_mapped_handles])
        return min(self.plan.num_elastic_blocks, usable_bytes // self.layout.block_bytes)

    # -- attach / detach -----------------------------------------------------------------------

    def attach(self, num_handles: int | None = None) -> None:
        """Map the first `num_handles` elastic handles (all by default) into the top of the
        KV range. Called again with a larger count it maps the next handles (incremental
        attach, e.g. on first use under overcommit); a count already mapped is a no-op.

        Partial attach needs reclaim="release": in remap mode the unmapped rest would leave
        holes in the activation arena.
        """
        with self._lock, defer_signals():
            self._check_open()
            total = len(self._holdings.elastic)
            target = total if num_handles is None else num_handles
            if not 0 <= target <= total:
                raise ValueError(f"can attach 0..{total} elastic handles, not {target}")
            if target < total and self.reclaim is Reclaim.REMAP:
                raise ValueError("partial attach needs reclaim='release' (remap mode moves the "
                                 "whole reserve between the KV range and the activation arena)")
            if target <= self.num_mapped_handles:
                return
            start = time.perf_counter()
            self._holdings.move({c: Target(c.kv_address) for c in self._holdings.elastic[:target]})
            self._timer.record_attach(time.perf_counter() - start)

    def detach(self, sync: bool = True) -> None:
        """Unmap the elastic blocks and lend their memory to activations (no-op when detached).

        Raises ElasticBusyError while any elastic block is live; the caller drains first.
        `sync=False` unmaps without waiting for queued kernels: the caller's promise that none
        of them touches the elastic range (see the module's Safety).
        In release mode a handle that fails to release is kept (not rolled back): attach()
        reuses it and close() retries it.
        """
        with self._lock, defer_signals():
            self._check_open()
            elastic = self._holdings.elastic
            targets = {c: Target(c.arena_address) for c in elastic}
            kept = [c for c in elastic if c.handle is not None]
            if all(c.is_at(t) for c, t in targets.items()) and (
                    self.reclaim is Reclaim.REMAP or not kept):
                return
            num_live = self.num_live_elastic_blocks()
            if num_live:
                raise ElasticBusyError(
                    f"cannot detach: {num_live} elastic block(s) in [{self.plan.num_base_blocks}, "
                    f"{self.plan.num_blocks}) are still allocated; free or migrate them first")
            start = time.perf_counter()
            self._holdings.move(targets, sync=sync)
            errors = ([] if self.reclaim is Reclaim.REMAP
                      else self._holdings.ops.release_unmapped(elastic))
            self._timer.record_detach(time.perf_counter() - start)
            if errors:
                raise errors[0]

    # -- live elastic blocks ---------------------------------------------------------------

    def mark_allocated(self, block_ids: Iterable[int]) -> None:
        """Record blocks as holding live KV; live elastic blocks keep the reserve attached."""
        with self._lock:
            self._blocks.mark_allocated(block_ids, self._num_usable_elastic_blocks())

    def mark_freed(self, block_ids: Iterable[int]) -> None:
        with self._lock:
            self._blocks.mark_freed(block_ids)

    def num_live_elastic_blocks(self) -> int:
        return self._blocks.num_live()

    # -- addresses and torch views ---------------------------------------------------------

    @property
    def kv_address(self) -> int:
        self._check_open()
        assert self._holdings.kv_address is not None
        return self._holdings.kv_address

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
            if self.location is not ElasticLocation.ACTIVATIONS:
                raise RuntimeError(f"no activation arena: reclaim={self.reclaim.value} and the "
                                   f"elastic memory is at {self.location.value}; detach() in remap mode")
            assert self._holdings.activation_address is not None
            return self._tensors.arena(self._holdings.activation_address, self.plan.elastic_bytes)

    # -- reporting and teardown ---------------------------------------------------------------

    def stats(self) -> PoolStats:
        chunks = self._holdings.chunks()
        return self._timer.stats(
            mapped_bytes=sum(c.size_bytes * len(c.mappings) for c in chunks),
            reserved_virtual_bytes=self._holdings.reserved_bytes(),
            num_handles_created=self._holdings.ops.num_handles_created, attached=self.attached,
            num_handles_live=sum(c.handle is not None for c in chunks),
            num_live_elastic_blocks=self.num_live_elastic_blocks())

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("the ElasticKVPool is closed")

    def close(self) -> None:
        """Sync, unmap, release every handle once and free both ranges. Idempotent; if a call
        fails the others still run, PoolCloseError names what is still held, and calling
        close() again retries exactly that."""
        with self._lock, defer_signals():
            if self._closed and not self._holdings.held():
                return
            self._closed = True
            self._tensors.clear()
            errors = self._holdings.release_all()
            held = self._holdings.held()
            if errors or held:
                raise PoolCloseError(errors[0] if errors else None, tuple(held))
            atexit.unregister(self.close)

    def __enter__(self) -> ElasticKVPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
