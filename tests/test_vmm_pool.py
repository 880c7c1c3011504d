"""ElasticKVPool against the fake driver: placement, safety rules, rollback, teardown."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

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

LAYOUT = KVLayout.from_name("llama-3.1-8b")  # 2 MiB blocks: one block per granule
MODES = ["remap", "release"]


def make_pool(reclaim: str = "remap", fake: FakeCudaDriver | None = None,
              **kwargs) -> tuple[ElasticKVPool, FakeCudaDriver]:
    """4 base blocks on 4 MiB handles; 12 MiB (6 blocks) elastic on 2 MiB handles."""
    fake = FakeCudaDriver() if fake is None else fake
    kwargs.setdefault("elastic_handle_bytes", 2 * MIB)
    pool = ElasticKVPool(LAYOUT, 4, 12 * MIB, base_handle_bytes=4 * MIB, reclaim=reclaim,
                         driver=fake, **kwargs)
    return pool, fake


@pytest.mark.parametrize("reclaim", MODES)
def test_handles_back_the_right_offsets(reclaim: str) -> None:
    pool, fake = make_pool(reclaim)
    kv, block = pool.kv_address, LAYOUT.block_bytes
    assert pool.plan.num_blocks == 10 and not pool.attached
    assert fake.handle_at(kv) == fake.handle_at(kv + block)  # one 4 MiB base handle
    assert fake.handle_at(kv) != fake.handle_at(kv + 2 * block)
    assert all(fake.handle_at(pool.block_address(b)) is None for b in range(4, 10))
    pool.attach()
    elastic = [fake.handle_at(pool.block_address(b)) for b in range(4, 10)]
    assert None not in elastic and len(set(elastic)) == 6
    assert fake.is_accessible(kv, pool.plan.total_bytes)
    pool.detach()
    assert fake.is_accessible(kv, pool.plan.base_bytes)
    assert not any(fake.is_accessible(pool.block_address(b), block) for b in range(4, 10))
    if reclaim == "remap":  # the same handles now back the activation range
        arena_address = pool._holdings.activation_address
        lent = [fake.handle_at(arena_address + i * block) for i in range(6)]
        assert lent == elastic and fake.is_accessible(arena_address, 12 * MIB)
    else:
        assert fake.live_handle_ids().isdisjoint(elastic)
    pool.close()
    assert fake.leaks() == []


def test_large_handles_and_remainder() -> None:
    pool, fake = make_pool(elastic_handle_bytes=8 * MIB, start_attached=True)
    assert pool.plan.elastic_handle_sizes == (8 * MIB, 4 * MIB)
    top = pool.kv_address + pool.plan.base_bytes
    assert fake.handle_at(top) == fake.handle_at(top + 6 * MIB) != fake.handle_at(top + 8 * MIB)
    pool.close()
    assert fake.leaks() == []


@pytest.mark.parametrize("reclaim", MODES)
def test_detach_refused_while_elastic_blocks_live(reclaim: str) -> None:
    pool, _ = make_pool(reclaim, start_attached=True)
    pool.mark_allocated([0, 1, 5])
    with pytest.raises(ElasticBusyError, match=r"1 elastic block\(s\) in \[4, 10\)"):
        pool.detach()
    assert pool.attached
    pool.mark_freed([5])
    pool.detach()  # live base blocks do not pin the reserve
    with pytest.raises(ElasticDetachedError):
        pool.mark_allocated([6])
    pool.mark_allocated([2])
    with pytest.raises(ValueError, match="freed but not allocated"):
        pool.mark_freed([7])
    with pytest.raises(IndexError):
        pool.mark_allocated([10])
    pool.close()


def test_detach_refused_by_engine_callback() -> None:
    live = [3]
    pool, _ = make_pool(start_attached=True, live_elastic_blocks=lambda: live[0])
    with pytest.raises(ElasticBusyError):
        pool.detach()
    live[0] = 0
    pool.detach()
    pool.close()


@pytest.mark.parametrize("streams", [(), (11, 12)])
def test_sync_before_every_unmap(streams: tuple) -> None:
    pool, fake = make_pool(start_attached=True, sync_streams=streams)
    for _ in range(2):
        start = len(fake.events)
        pool.detach()
        pool.attach()
        kinds = [kind for kind, _ in fake.events[start:]]
        assert "unmap" in kinds and kinds[0] == "sync"
        first_unmap_of_attach = kinds.index("unmap", kinds.index("sync", 1))
        assert kinds[first_unmap_of_attach - 1] == "sync"
    assert {s for kind, s in fake.events if kind == "sync"} == (set(streams) or {0})
    pool.close()


@pytest.mark.parametrize("reclaim", MODES)
def test_detach_without_sync_unmaps_with_no_wait_and_ends_where_a_synced_one_does(
        reclaim: str) -> None:
    """sync=False: the caller knows no queued kernel touches the reserve (an engine whose
    step in flight holds no elastic block), so nothing waits before the unmap."""
    synced, synced_fake = make_pool(reclaim, start_attached=True)
    synced.detach()
    pool, fake = make_pool(reclaim, start_attached=True)
    start = len(fake.events)
    pool.detach(sync=False)
    kinds = [kind for kind, _ in fake.events[start:]]
    assert "unmap" in kinds and "sync" not in kinds
    assert fake.snapshot() == synced_fake.snapshot()
    assert not pool.attached and pool.location is synced.location
    pool.attach()
    assert fake.is_accessible(pool.kv_address, pool.plan.total_bytes)
    for p, f in ((pool, fake), (synced, synced_fake)):
        p.close()
        assert f.leaks() == []


@pytest.mark.parametrize("reclaim", MODES)
def test_failed_detach_without_sync_rolls_back(reclaim: str) -> None:
    pool, fake = make_pool(reclaim, start_attached=True)
    before = fake.snapshot()
    fake.fail_next("cuMemUnmap", 2)
    with pytest.raises(VmmError):
        pool.detach(sync=False)
    assert fake.snapshot() == before and pool.attached
    fake.clear_failures()
    pool.detach(sync=False)
    pool.close()
    assert fake.leaks() == []


ATTACH_CALLS = {"remap": ["cuCtxSynchronize", "cuMemUnmap", "cuMemMap", "cuMemSetAccess"],
                "release": ["cuMemCreate", "cuMemMap", "cuMemSetAccess"]}
DETACH_CALLS = {"remap": ["cuCtxSynchronize", "cuMemUnmap", "cuMemMap", "cuMemSetAccess"],
                "release": ["cuCtxSynchronize", "cuMemUnmap"]}


@pytest.mark.parametrize("nth", [1, 3, 6])
@pytest.mark.parametrize(("reclaim", "call"),
                         [(m, c) for m in MODES for c in ATTACH_CALLS[m]])
def test_failed_attach_rolls_back(reclaim: str, call: str, nth: int) -> None:
    pool, fake = make_pool(reclaim)
    before = fake.snapshot()
    fake.fail_next(call, nth)
    try:
        pool.attach()
    except VmmError as exc:
        assert exc.call == call
        assert fake.snapshot() == before and not pool.attached
    else:
        assert nth > 1, "the first such call must fail the attach"
    fake.clear_failures()
    pool.attach()
    assert fake.is_accessible(pool.kv_address, pool.plan.total_bytes)
    pool.close()
    assert fake.leaks() == []


@pytest.mark.parametrize("nth", [1, 3, 6])
@pytest.mark.parametrize(("reclaim", "call"),
                         [(m, c) for m in MODES for c in DETACH_CALLS[m]])
def test_failed_detach_rolls_back(reclaim: str, call: str, nth: int) -> None:
    pool, fake = make_pool(reclaim, start_attached=True)
    before = fake.snapshot()
    fake.fail_next(call, nth)
    try:
        pool.detach()
    except VmmError as exc:
        assert exc.call == call
        assert fake.snapshot() == before and pool.attached
    else:
        assert nth > 1, "the first such call must fail the detach"
    fake.clear_failures()
    pool.detach()
    pool.close()
    assert fake.leaks() == []


def test_failed_release_is_retried_once_at_close() -> None:
    pool, fake = make_pool("release", start_attached=True)
    fake.fail_next("cuMemRelease", 2)
    with pytest.raises(VmmError, match="cuMemRelease"):
        pool.detach()
    assert not pool.attached and pool.stats().num_handles_live == 2 + 1  # 2 base + kept one
    pool.attach()  # reuses the kept handle, creates the other five
    assert pool.stats().num_handles_created == 2 + 6 + 5
    pool.close()
    assert fake.leaks() == [] and fake.double_releases == []


def test_release_mode_attach_fails_cleanly_when_memory_was_taken() -> None:
    fake = FakeCudaDriver(physical_capacity_bytes=8 * MIB + 12 * MIB)
    pool, _ = make_pool("release", fake=fake, start_attached=True)
    pool.detach()
    squatter = fake.cuMemCreate(8 * MIB, None, 0)[1]  # torch's allocator took part of it
    with pytest.raises(VmmError, match="cuMemCreate failed with CUDA_ERROR_OUT_OF_MEMORY"):
        pool.attach()
    assert not pool.attached and pool.stats().num_handles_live == 2
    fake.cuMemRelease(squatter)  # torch.cuda.empty_cache()
    pool.attach()
    pool.close()
    assert fake.leaks() == []


@pytest.mark.parametrize("call", ["cuMemAddressReserve", "cuMemCreate", "cuMemMap",
                                  "cuMemSetAccess"])
@pytest.mark.parametrize("nth", [1, 2])
@pytest.mark.parametrize("reclaim", MODES)
def test_failed_construction_leaks_nothing(reclaim: str, call: str, nth: int) -> None:
    fake = FakeCudaDriver()
    fake.fail_next(call, nth)
    try:
        make_pool(reclaim, fake=fake, start_attached=True)[0].close()
    except VmmError as exc:
        assert exc.call == call
    else:
        assert nth > 1, "the first call of each kind must fail the construction"
    assert fake.leaks() == []


def test_bad_sizes_release_the_context() -> None:
    fake = FakeCudaDriver()
    with pytest.raises(ValueError, match="granularity"):
        make_pool(fake=fake, elastic_handle_bytes=3 * MIB)
    assert fake.leaks() == []


@pytest.mark.parametrize("reclaim", MODES)
def test_close_releases_everything_once(reclaim: str) -> None:
    with make_pool(reclaim, start_attached=True)[0] as pool:
        fake = pool._driver.cuda
        pool.mark_allocated([5])
    assert fake.leaks() == [] and fake.reservations == {}
    assert all(rec.num_releases == 1 for rec in fake.handles.values())
    pool.close()  # idempotent
    assert pool.stats().reserved_virtual_bytes == 0 and pool.stats().mapped_bytes == 0
    with pytest.raises(PoolClosedError):
        pool.attach()


def test_close_at_interpreter_exit() -> None:
    script = textwrap.dedent("""
        import atexit
        from gpu_backend.vmm import MIB, ElasticKVPool, KVLayout
        from gpu_backend.vmm.fake_driver import FakeCudaDriver
        fake = FakeCudaDriver()
        atexit.register(lambda: print("LEAKS", fake.leaks()))  # runs after the pool's hook
        pool = ElasticKVPool(KVLayout.from_name("llama-3.1-8b"), 4, 12 * MIB, driver=fake,
                             elastic_handle_bytes=2 * MIB, start_attached=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert "LEAKS []" in out.stdout


def test_stats_and_other_threads() -> None:
    pool, fake = make_pool()
    worker = threading.Thread(target=pool.attach)
    worker.start()
    worker.join()
    assert pool.attached and fake.call_counts["cuCtxSetCurrent"] == 2
    pool.detach()
    stats = pool.stats()
    assert stats.num_attaches == 1 and stats.num_detaches == 1
    assert 0 < stats.last_detach_s == stats.total_detach_s
    assert stats.mapped_bytes == 8 * MIB + 12 * MIB  # base in KV range, reserve in arena
    assert stats.reserved_virtual_bytes == 20 * MIB + 12 * MIB
    assert stats.num_handles_live == stats.num_handles_created == 2 + 6
    pool.close()


def test_layer_views_index_the_combined_layout() -> None:
    torch = pytest.importorskip("torch")
    from gpu_backend.vmm.torch_views import layer_view

    layout = KVLayout(num_layers=3, num_kv_heads=2, head_dim=4, block_size=2, dtype="float32")
    num_blocks = 5
    pool_bytes = torch.zeros(num_blocks * layout.block_bytes, dtype=torch.uint8)
    full = pool_bytes.view(torch.float32).view(num_blocks, 3, 2, 2, 2, 4)
    full.copy_(torch.arange(full.numel(), dtype=torch.float32).view_as(full))
    for layer in range(3):
        k = layer_view(pool_bytes, layout, num_blocks, layer, 0)
        v = layer_view(pool_bytes, layout, num_blocks, layer, 1)
        assert k.shape == (num_blocks, 2, 2, 4) and k.data_ptr() >= pool_bytes.data_ptr()
        assert torch.equal(k, full[:, layer, 0]) and torch.equal(v, full[:, layer, 1])
    with pytest.raises(IndexError):
        layer_view(pool_bytes, layout, num_blocks, 3, 0)
