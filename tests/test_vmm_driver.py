"""VmmDriver wrapper, fake driver rules, layout planning: no GPU needed."""

from __future__ import annotations

import threading

import pytest

from gpu_backend.vmm import MIB, KVLayout, NoDriverError, VmmDriver, VmmError, plan_pool
from gpu_backend.vmm.fake_driver import CUresult, FakeCudaDriver
from gpu_backend.vmm.layout import base_block_quantum, split_into_handles

GRANULE = 2 * MIB


def test_no_driver_says_so_plainly() -> None:
    with pytest.raises(NoDriverError, match="no NVIDIA driver is present"):
        VmmDriver(FakeCudaDriver(no_driver=True))


def test_real_driver_without_gpu_raises_no_driver_error() -> None:
    pytest.importorskip("cuda.bindings")
    try:
        driver = VmmDriver()
    except NoDriverError as exc:
        assert "cuInit" in str(exc)
        return
    driver.release_context()
    pytest.skip("a CUDA driver is present on this machine")


def test_errors_name_the_call_and_result() -> None:
    fake = FakeCudaDriver()
    driver = VmmDriver(fake)
    fake.fail_next("cuMemCreate")
    with pytest.raises(VmmError, match="cuMemCreate failed with CUDA_ERROR_OUT_OF_MEMORY") as info:
        driver.create(GRANULE)
    assert info.value.call == "cuMemCreate"
    driver.release_context()
    assert fake.leaks() == []


def test_context_made_current_once_per_thread() -> None:
    fake = FakeCudaDriver()
    driver = VmmDriver(fake)
    handles = []
    worker = threading.Thread(target=lambda: handles.append(driver.create(GRANULE)))
    worker.start()
    worker.join()
    handles.append(driver.create(GRANULE))
    assert fake.call_counts["cuCtxSetCurrent"] == 2
    for handle in handles:
        driver.release(handle)
    driver.release_context()
    assert fake.leaks() == []


def test_fake_refuses_what_the_driver_refuses() -> None:
    fake = FakeCudaDriver()
    driver = VmmDriver(fake)
    base = driver.reserve(8 * MIB)
    handle = driver.create(4 * MIB)
    with pytest.raises(VmmError, match="cuMemMap"):
        driver.map(base + MIB, 2 * MIB, handle)  # misaligned
    driver.map(base, 4 * MIB, handle)
    with pytest.raises(VmmError, match="CUDA_ERROR_ALREADY_MAPPED"):
        driver.map(base + 2 * MIB, 2 * MIB, handle)
    with pytest.raises(VmmError, match="cuMemSetAccess"):
        driver.set_access(base, 8 * MIB)  # upper half unmapped
    with pytest.raises(VmmError, match="cuMemUnmap"):
        driver.unmap(base, 2 * MIB)  # part of a mapping
    with pytest.raises(VmmError, match="cuMemAddressFree"):
        driver.free_range(base, 8 * MIB)  # still mapped
    driver.unmap(base, 4 * MIB)
    driver.release(handle)
    with pytest.raises(VmmError, match="cuMemRelease"):
        driver.release(handle)
    assert fake.double_releases == [handle.handle_id]
    driver.free_range(base, 8 * MIB)
    driver.release_context()


def test_fake_out_of_physical_memory() -> None:
    fake = FakeCudaDriver(physical_capacity_bytes=4 * MIB)
    driver = VmmDriver(fake)
    handle = driver.create(4 * MIB)
    with pytest.raises(VmmError, match=CUresult.CUDA_ERROR_OUT_OF_MEMORY.name):
        driver.create(GRANULE)
    driver.release(handle)
    driver.release(driver.create(GRANULE))
    driver.release_context()
    assert fake.leaks() == []


def test_block_bytes_of_llama_8b_is_two_mib() -> None:
    layout = KVLayout.from_name("llama-3.1-8b")
    assert layout.block_bytes == 32 * 2 * 16 * 8 * 128 * 2 == 2 * MIB


@pytest.mark.parametrize("name", ["elastic_handle_bytes", "base_handle_bytes",
                                  "elastic_reserve_bytes"])
def test_misaligned_sizes_name_granularity_and_nearest(name: str) -> None:
    sizes = {"elastic_handle_bytes": 4 * MIB, "base_handle_bytes": 4 * MIB,
             "elastic_reserve_bytes": 8 * MIB}
    sizes[name] = 5 * MIB
    with pytest.raises(ValueError, match=rf"{name}=5242880 bytes .*granularity \(2097152 bytes"
                                         r".*nearest valid: 4194304 or 6291456"):
        plan_pool(KVLayout.from_name("llama-3.1-8b"), 4, granularity_bytes=GRANULE, **sizes)


def test_base_blocks_must_end_on_a_granule() -> None:
    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16)  # 16 KiB blocks
    assert base_block_quantum(layout.block_bytes, GRANULE) == 128
    with pytest.raises(ValueError, match="multiple of 128: nearest valid 128 or 256"):
        plan_pool(layout, 200, 4 * MIB, 4 * MIB, 4 * MIB, GRANULE)
    plan = plan_pool(layout, 256, 5 * GRANULE, 8 * MIB, 4 * MIB, GRANULE)
    assert plan.base_bytes == 4 * MIB and plan.base_handle_sizes == (4 * MIB,)
    assert plan.elastic_handle_sizes == (4 * MIB, 4 * MIB, 2 * MIB)
    assert plan.num_elastic_blocks == 10 * MIB // layout.block_bytes


def test_elastic_tail_is_padding() -> None:
    layout = KVLayout(num_layers=48, num_kv_heads=8, head_dim=128, block_size=16)  # 3 MiB
    plan = plan_pool(layout, 2, 8 * MIB, 2 * MIB, 8 * MIB, GRANULE)
    assert plan.num_elastic_blocks == 2  # 6 MiB of blocks, 2 MiB padding
    assert plan.base_handle_sizes == (2 * MIB,) * 3
    assert split_into_handles(7 * GRANULE, 4 * GRANULE) == (4 * GRANULE, 3 * GRANULE)
