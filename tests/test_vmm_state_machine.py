"""Property test: random attach/detach/allocate/free/fail/close sequences on the fake driver.

Invariants after every step: no handle is released twice or mapped twice, no offset is
mapped twice, every live block lies in mapped, accessible memory, a failed transition
leaves the driver state exactly as before, and closing leaves nothing behind.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpu_backend.vmm import (
    MIB,
    ElasticBusyError,
    ElasticDetachedError,
    ElasticKVPool,
    KVLayout,
    PoolClosedError,
    VmmError,
)
from gpu_backend.vmm.fake_driver import FakeCudaDriver

LAYOUT = KVLayout.from_name("llama-3.1-8b")  # 2 MiB blocks
NUM_BASE_BLOCKS, NUM_BLOCKS = 4, 4 + 6
FAILABLE = ["cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuCtxSynchronize"]


class ElasticPoolMachine(RuleBasedStateMachine):
    @initialize(reclaim=st.sampled_from(["remap", "release"]),
                handle_mib=st.sampled_from([2, 4, 12]), start_attached=st.booleans())
    def build(self, reclaim: str, handle_mib: int, start_attached: bool) -> None:
        self.fake = FakeCudaDriver()
        self.pool = ElasticKVPool(LAYOUT, NUM_BASE_BLOCKS, 12 * MIB, reclaim=reclaim,
                                  elastic_handle_bytes=handle_mib * MIB,
                                  base_handle_bytes=4 * MIB, driver=self.fake,
                                  start_attached=start_attached)
        self.live: set[int] = set()
        self.closed = False

    def _transition(self, name: str, fail_call: str | None, nth: int) -> None:
        before = self.fake.snapshot()
        was_attached = self.pool.attached
        if fail_call is not None:
            self.fake.fail_next(fail_call, nth)
        try:
            getattr(self.pool, name)()
        except ElasticBusyError:
            assert name == "detach" and any(b >= NUM_BASE_BLOCKS for b in self.live)
            assert self.fake.snapshot() == before
        except VmmError as exc:
            assert exc.call == fail_call
            assert self.fake.snapshot() == before and self.pool.attached == was_attached
        finally:
            self.fake.clear_failures()

    @precondition(lambda self: not self.closed)
    @rule(fail_call=st.none() | st.sampled_from(FAILABLE), nth=st.integers(1, 4))
    def attach(self, fail_call: str | None, nth: int) -> None:
        self._transition("attach", fail_call, nth)

    @precondition(lambda self: not self.closed)
    @rule(fail_call=st.none() | st.sampled_from(FAILABLE), nth=st.integers(1, 4))
    def detach(self, fail_call: str | None, nth: int) -> None:
        self._transition("detach", fail_call, nth)

    @precondition(lambda self: not self.closed)
    @rule(block_id=st.integers(0, NUM_BLOCKS - 1))
    def allocate(self, block_id: int) -> None:
        if block_id in self.live:
            return
        try:
            self.pool.mark_allocated([block_id])
        except ElasticDetachedError:
            assert block_id >= NUM_BASE_BLOCKS and not self.pool.attached
            return
        self.live.add(block_id)

    @precondition(lambda self: not self.closed and self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from(sorted(self.live)))
        self.pool.mark_freed([block_id])
        self.live.discard(block_id)

    @precondition(lambda self: not self.closed)
    @rule()
    def close(self) -> None:
        self.pool.close()
        self.closed = True
        assert self.fake.leaks() == []

    @precondition(lambda self: self.closed)
    @rule(verb=st.sampled_from(["attach", "detach"]))
    def closed_pool_refuses(self, verb: str) -> None:
        with pytest.raises(PoolClosedError):
            getattr(self.pool, verb)()
        self.pool.close()  # idempotent

    @invariant()
    def nothing_mapped_or_released_twice(self) -> None:
        assert self.fake.double_releases == []
        mapped = Counter(m.handle_id for m in self.fake.mappings.values())
        assert all(count == 1 for count in mapped.values())
        assert set(mapped) <= self.fake.live_handle_ids()

    @invariant()
    def live_blocks_are_mapped(self) -> None:
        if self.closed:
            return
        for block_id in self.live:
            address = self.pool.block_address(block_id)
            assert self.fake.is_accessible(address, LAYOUT.block_bytes), block_id
        assert self.fake.is_accessible(self.pool.kv_address, self.pool.plan.base_bytes)
        if not self.pool.attached:
            top = self.pool.kv_address + self.pool.plan.base_bytes
            assert all(self.fake.handle_at(top + i * MIB) is None for i in range(12))

    def teardown(self) -> None:
        if hasattr(self, "pool"):
            self.pool.close()
            assert self.fake.leaks() == []


ElasticPoolMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=30,
                                                deadline=None)
TestElasticPool = ElasticPoolMachine.TestCase
