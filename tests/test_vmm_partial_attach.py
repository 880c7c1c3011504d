"""Partial and incremental attach of the elastic reserve (release mode), on the fake driver."""

from __future__ import annotations

import pytest

from gpu_backend.vmm import MIB, ElasticKVPool, KVLayout
from gpu_backend.vmm.fake_driver import FakeCudaDriver

LAYOUT = KVLayout.from_name("llama-3.1-8b")  # 2 MiB blocks: one block per granule


def make_pool(reclaim: str = "release") -> tuple[ElasticKVPool, FakeCudaDriver]:
    """4 base blocks; 12 MiB (6 blocks) elastic on 4 MiB handles (3 handles)."""
    fake = FakeCudaDriver()
    pool = ElasticKVPool(LAYOUT, 4, 12 * MIB, base_handle_bytes=4 * MIB,
                         elastic_handle_bytes=4 * MIB, reclaim=reclaim, driver=fake)
    return pool, fake


def mapped_blocks(pool: ElasticKVPool, fake: FakeCudaDriver) -> list[int]:
    block = LAYOUT.block_bytes
    return [b for b in range(4, 10) if fake.is_accessible(pool.block_address(b), block)]


def test_partial_then_incremental_attach_maps_a_growing_prefix() -> None:
    pool, fake = make_pool()
    pool.attach(num_handles=1)
    assert pool.attached and pool.num_mapped_handles == 1
    assert mapped_blocks(pool, fake) == [4, 5]
    assert fake.physical_bytes_in_use() == 8 * MIB + 4 * MIB  # base + one handle
    pool.attach(num_handles=1)  # already mapped: no-op
    pool.attach(num_handles=3)
    assert pool.num_mapped_handles == 3 and mapped_blocks(pool, fake) == [4, 5, 6, 7, 8, 9]
    pool.detach()
    assert pool.num_mapped_handles == 0 and mapped_blocks(pool, fake) == []
    assert fake.physical_bytes_in_use() == 8 * MIB  # release mode gave the reserve back
    pool.attach(num_handles=2)
    assert mapped_blocks(pool, fake) == [4, 5, 6, 7]
    pool.detach()
    pool.close()
    assert fake.leaks() == []


def test_partial_attach_rolls_back_on_failure() -> None:
    pool, fake = make_pool()
    pool.attach(num_handles=1)
    before = fake.snapshot()
    fake.fail_next("cuMemMap", 2)
    with pytest.raises(Exception, match="cuMemMap"):
        pool.attach(num_handles=3)
    assert fake.snapshot() == before and pool.num_mapped_handles == 1
    pool.close()
    assert fake.leaks() == []


def test_partial_attach_needs_release_mode_and_a_valid_count() -> None:
    pool, _ = make_pool("remap")
    with pytest.raises(ValueError, match="release"):
        pool.attach(num_handles=1)
    pool.attach(num_handles=3)  # the whole reserve is fine in remap mode
    assert pool.num_mapped_handles == 3
    pool.close()
    pool, _ = make_pool()
    with pytest.raises(ValueError, match="0..3"):
        pool.attach(num_handles=4)
    pool.close()
