"""A fault at every driver call of attach, detach and close, one alone or two in a row.

Each case runs the operation once to learn its driver calls, then again on a fresh pool with
call i failing (and, for double faults, call i + 1 too, which is usually the rollback's first
call or a query of the reconciliation). After each fault the pool must agree with the fake
driver's own bookkeeping (what is mapped where, with which handle and access; how many
handles are live; which ranges are reserved), every block it lets the engine use must be
mapped and accessible, and once the faults stop attach, detach and close must work and leave
nothing behind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from gpu_backend.vmm import MIB, ElasticKVPool, KVLayout, PoolCloseError, VmmError
from gpu_backend.vmm.fake_driver import FakeCudaDriver

LAYOUT = KVLayout.from_name("llama-3.1-8b")  # 2 MiB blocks: one block per granule
NUM_BASE_BLOCKS = 4
ACTS_ONLY_WHEN_IT_SUCCEEDS = {"cuMemCreate", "cuMemRelease", "cuMemAddressFree",
                              "cuDevicePrimaryCtxRelease"}


def make_pool(reclaim: str, fake: FakeCudaDriver | None = None,
              **kwargs) -> tuple[ElasticKVPool, FakeCudaDriver]:
    """2 base handles of 4 MiB; 6 MiB (3 blocks) elastic on 2 MiB handles."""
    fake = FakeCudaDriver() if fake is None else fake
    pool = ElasticKVPool(LAYOUT, NUM_BASE_BLOCKS, 6 * MIB, base_handle_bytes=4 * MIB,
                         elastic_handle_bytes=2 * MIB, reclaim=reclaim, driver=fake, **kwargs)
    return pool, fake


def consistency_problems(pool: ElasticKVPool, fake: FakeCudaDriver) -> list[str]:
    """What the pool says that the fake driver contradicts (empty when they agree)."""
    problems = []
    said = sorted((r.address, r.size_bytes, int(r.handle), r.accessible)
                  for r in pool.mapped_ranges())
    if tuple(said) != fake.snapshot()[0]:
        problems.append(f"pool maps {said}, driver maps {list(fake.snapshot()[0])}")
    stats = pool.stats()
    if stats.num_handles_live != len(fake.live_handle_ids()):
        problems.append(f"pool holds {stats.num_handles_live} handles, driver has "
                        f"{len(fake.live_handle_ids())} live")
    if stats.reserved_virtual_bytes != sum(fake.reservations.values()):
        problems.append(f"pool reserves {stats.reserved_virtual_bytes} bytes, driver "
                        f"{sum(fake.reservations.values())}")
    if fake.double_releases:
        problems.append(f"handles released twice: {fake.double_releases}")
    times_mapped = Counter(m.handle_id for m in fake.mappings.values())
    problems += [f"handle {h} mapped at {n} addresses" for h, n in times_mapped.items() if n > 1]
    return problems + usable_problems(pool, fake)


def usable_problems(pool: ElasticKVPool, fake: FakeCudaDriver) -> list[str]:
    """Blocks the engine may use (base + the mapped handles' blocks) must be readable and
    writable."""
    num_handles = pool.num_mapped_handles
    if pool.closed:
        return [] if not pool.attached and num_handles == 0 else ["closed pool claims attached"]
    if pool.attached != (num_handles > 0):
        return [f"attached={pool.attached} with {num_handles} usable handles"]
    usable_bytes = sum(pool.plan.elastic_handle_sizes[:num_handles])
    num_usable = NUM_BASE_BLOCKS + min(pool.plan.num_elastic_blocks,
                                       usable_bytes // LAYOUT.block_bytes)
    problems = [f"block {b} usable but not accessible" for b in range(num_usable)
                if not fake.is_accessible(pool.block_address(b), LAYOUT.block_bytes)]
    return problems


def attach_one(pool: ElasticKVPool) -> None:
    pool.attach(num_handles=1)


SCENARIOS: dict[str, tuple[str, Callable | None, str]] = {
    # name: (reclaim, set-up before the faulted call, faulted operation)
    "remap-attach": ("remap", None, "attach"),
    "release-attach": ("release", None, "attach"),
    "release-attach-more": ("release", attach_one, "attach"),
    "remap-detach": ("remap", ElasticKVPool.attach, "detach"),
    "release-detach": ("release", ElasticKVPool.attach, "detach"),
    "remap-close": ("remap", ElasticKVPool.attach, "close"),
    "release-close": ("release", attach_one, "close"),
}


def prepared(name: str) -> tuple[ElasticKVPool, FakeCudaDriver]:
    reclaim, setup, _ = SCENARIOS[name]
    pool, fake = make_pool(reclaim)
    if setup is not None:
        setup(pool)
    return pool, fake


def calls_of(name: str) -> list[str]:
    """The driver calls the scenario's operation makes when nothing fails."""
    pool, fake = prepared(name)
    start = len(fake.call_log)
    getattr(pool, SCENARIOS[name][2])()
    calls = fake.call_log[start:]
    pool.close()
    assert fake.leaks() == []
    return calls


def run_faulted(name: str, indices: tuple[int, ...], after_effect: bool = False) -> list[str]:
    """Fail the operation's calls at `indices` (0: its first call); check; return its calls."""
    pool, fake = prepared(name)
    operation = SCENARIOS[name][2]
    before = fake.snapshot()
    start = len(fake.call_log)
    for index in indices:
        fake.fail_at(index + 1, after_effect=after_effect)
    with pytest.raises(VmmError) as info:
        getattr(pool, operation)()
    fake.clear_failures()
    calls = fake.call_log[start:]
    assert consistency_problems(pool, fake) == []
    if operation == "close":
        assert isinstance(info.value, PoolCloseError) and info.value.held
        assert info.value.call in str(info.value) and "close() again" in str(info.value)
        pool.close()  # retries what is left
        assert fake.leaks() == []
        return calls
    kept_a_handle = operation == "detach" and calls[indices[0]] == "cuMemRelease"
    if len(indices) == 1 and not kept_a_handle:
        assert fake.snapshot() == before, "a single fault must roll back exactly"
    pool.attach()
    assert pool.num_mapped_handles == 3 and consistency_problems(pool, fake) == []
    assert fake.is_accessible(pool.kv_address, pool.plan.total_bytes)
    pool.detach()
    pool.close()
    assert fake.leaks() == []
    return calls


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_one_and_two_faults_at_every_call(name: str) -> None:
    """Call i fails; then, separately, call i and each later call j of that failing run (its
    reconciliation queries and rollback) fail: every double fault, not only adjacent ones."""
    calls = calls_of(name)
    assert calls, name
    for first, call in enumerate(calls):
        try:
            failing_run = run_faulted(name, (first,))
            for second in range(first + 1, len(failing_run)):
                run_faulted(name, (first, second))
        except AssertionError as exc:
            raise AssertionError(f"{name}: fault at call {first} ({call}), "
                                 f"then at {locals().get('second')}") from exc


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_driver_that_acts_then_reports_failure(name: str) -> None:
    """cuMemMap/Unmap/SetAccess or a sync that did the work but returned an error: the pool
    reads the truth back from the driver before rolling back."""
    for index, call in enumerate(calls_of(name)):
        if call in ACTS_ONLY_WHEN_IT_SUCCEEDS:
            continue
        try:
            run_faulted(name, (index,), after_effect=True)
        except AssertionError as exc:
            raise AssertionError(f"{name}: acted, then failed at call {index} ({call})") from exc


def test_double_fault_leaves_an_exact_description() -> None:
    """Detach (remap) fails mapping into the arena and the rollback's re-map fails too: the
    pool says which handles are usable where and refuses to call the rest attached."""
    pool, fake = make_pool("remap", start_attached=True)
    fake.fail_next("cuMemMap", 2)  # the second handle's map into the activation range
    fake.fail_next("cuMemMap", 3)  # the rollback's first re-map into the KV range
    with pytest.raises(VmmError, match="cuMemMap") as info:
        pool.detach()
    assert any("rollback step also failed" in note for note in info.value.__notes__)
    assert pool.location.value == "mixed" and pool.num_mapped_handles == 0 and not pool.attached
    assert consistency_problems(pool, fake) == []
    regions = [r.region.value for r in pool.mapped_ranges() if r.region.value != "base"]
    assert sorted(regions) == ["elastic", "elastic"]  # handle 0 never re-mapped: held unmapped
    with pytest.raises(RuntimeError, match="no activation arena"):
        pool.activation_arena()
    pool.attach()
    assert pool.num_mapped_handles == 3 and consistency_problems(pool, fake) == []
    pool.close()
    assert fake.leaks() == []


def test_close_retries_what_is_left_and_names_it() -> None:
    pool, fake = make_pool("release", start_attached=True)
    fake.fail_next("cuMemUnmap", 1)  # the first elastic handle stays mapped
    fake.fail_next("cuMemRelease", 3)  # two elastic handles go, then base handle 0 fails
    with pytest.raises(PoolCloseError, match=r"cuMemUnmap failed .*still held: base handle 0 "
                                             r"\(4 MiB\); elastic handle 0 \(2 MiB\) mapped at "
                                             r"0x[0-9a-f]+; elastic handle 0 \(2 MiB\); KV range"
                       ) as info:
        pool.close()
    assert info.value.call == "cuMemUnmap" and len(info.value.held) == 5  # and the context
    assert fake.handle_at(pool.mapped_ranges()[0].address) is not None
    assert consistency_problems(pool, fake) == []
    pool.close()
    assert fake.leaks() == [] and pool.stats().reserved_virtual_bytes == 0
    pool.close()  # idempotent once everything is back
