"""ElasticKVPool on a real GPU: data through torch views across detach/attach, in both modes,
and a child process sent SIGTERM in the middle of an attach.

Run on the GPU machine: ``python -m pytest tests_gpu/test_vmm_gpu.py -q``. Skipped without CUDA.
Promise checked here: base blocks are always preserved; elastic contents are undefined after
a detach (callers treat them as empty), although in remap mode the same physical handles
come back, which the test uses to prove that the arena and the elastic blocks share memory.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from gpu_backend.vmm import (  # noqa: E402
    MIB,
    ElasticBusyError,
    ElasticKVPool,
    KVLayout,
)

LAYOUT = KVLayout(num_layers=4, num_kv_heads=8, head_dim=128, block_size=16)  # 256 KiB blocks
NUM_BASE_BLOCKS = 64  # 16 MiB
RESERVE_BYTES = 64 * MIB  # 4 handles of 16 MiB, 256 elastic blocks


def pattern(block_ids: range, layer: int) -> torch.Tensor:
    """Small integers (< 256 with the V offset), so bf16 holds them exactly."""
    ids = torch.arange(block_ids.start, block_ids.stop, device="cuda")
    return ((ids % 32) * 4 + layer).float()


def fill_patterns(pool: ElasticKVPool, block_ids: range) -> None:
    for layer in range(LAYOUT.num_layers):
        values = pattern(block_ids, layer).to(torch.bfloat16).view(-1, 1, 1, 1)
        pool.k_cache(layer)[block_ids.start:block_ids.stop] = values
        pool.v_cache(layer)[block_ids.start:block_ids.stop] = values + 128


def check_patterns(pool: ElasticKVPool, block_ids: range) -> None:
    for layer in range(LAYOUT.num_layers):
        expected = pattern(block_ids, layer)
        k = pool.k_cache(layer)[block_ids.start:block_ids.stop].float()
        v = pool.v_cache(layer)[block_ids.start:block_ids.stop].float()
        assert torch.equal(k.amin(dim=(1, 2, 3)), expected)
        assert torch.equal(k.amax(dim=(1, 2, 3)), expected)
        assert torch.equal(v.amax(dim=(1, 2, 3)), expected + 128)


@pytest.fixture(params=["remap", "release"])
def pool(request: pytest.FixtureRequest):
    torch.zeros(1, device="cuda")  # let torch create its context first, as an engine would
    with ElasticKVPool(LAYOUT, NUM_BASE_BLOCKS, RESERVE_BYTES, elastic_handle_bytes=16 * MIB,
                       base_handle_bytes=8 * MIB, reclaim=request.param,
                       start_attached=True) as pool:
        yield pool
    torch.cuda.synchronize()


def test_views_alias_the_pool(pool: ElasticKVPool) -> None:
    plane_bytes = LAYOUT.plane_elements * LAYOUT.element_bytes
    for block_id in (0, NUM_BASE_BLOCKS - 1, NUM_BASE_BLOCKS, pool.plan.num_blocks - 1):
        address = pool.block_address(block_id)
        assert pool.k_cache(0)[block_id].data_ptr() == address
        assert pool.v_cache(0)[block_id].data_ptr() == address + plane_bytes
        assert pool.k_cache(2)[block_id].data_ptr() == address + 4 * plane_bytes
    assert pool.k_cache(1).shape == (pool.plan.num_blocks, 16, 8, 128)
    assert pool.k_cache(1).stride(0) == LAYOUT.block_elements


def test_base_survives_detach_and_kernels_see_reattached_memory(pool: ElasticKVPool) -> None:
    base, elastic = range(0, NUM_BASE_BLOCKS), range(NUM_BASE_BLOCKS, pool.plan.num_blocks)
    fill_patterns(pool, base)
    fill_patterns(pool, elastic)
    check_patterns(pool, elastic)
    k_ptr = pool.k_cache(0).data_ptr()
    static_sum = torch.zeros((), device="cuda")
    graph = torch.cuda.CUDAGraph()  # captured over the elastic blocks while attached
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        static_sum.copy_(pool.k_cache(0)[elastic.start:].float().sum())
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        static_sum.copy_(pool.k_cache(0)[elastic.start:].float().sum())
    for _ in range(2):
        pool.detach()
        if pool.reclaim.value == "remap":
            arena = pool.activation_arena()
            assert arena.numel() == RESERVE_BYTES
            arena.fill_(0x3F)  # activations overwrite the lent memory
        else:
            activations = torch.full((RESERVE_BYTES,), 0x3F, dtype=torch.uint8, device="cuda")
            del activations
            torch.cuda.empty_cache()
        check_patterns(pool, base)
        pool.attach()
        assert pool.k_cache(0).data_ptr() == k_ptr
        check_patterns(pool, base)
        if pool.reclaim.value == "remap":  # same handles back: they hold what the arena wrote
            raw = pool.k_cache(0)[elastic.start:].contiguous().view(torch.uint8)
            assert bool((raw == 0x3F).all())
        fill_patterns(pool, elastic)  # callers treat elastic blocks as empty after attach
        check_patterns(pool, elastic)
        graph.replay()
        expected = pool.k_cache(0)[elastic.start:].float().sum()
        torch.cuda.synchronize()
        assert torch.allclose(static_sum, expected, rtol=1e-5)  # graph read the remapped memory


def test_detach_refused_with_live_blocks(pool: ElasticKVPool) -> None:
    pool.mark_allocated([0, NUM_BASE_BLOCKS + 3])
    with pytest.raises(ElasticBusyError):
        pool.detach()
    assert pool.attached
    pool.mark_freed([NUM_BASE_BLOCKS + 3])
    pool.detach()
    assert not pool.attached


def test_release_mode_gives_memory_to_torch_and_stats(pool: ElasticKVPool) -> None:
    torch.cuda.synchronize()
    free_attached = torch.cuda.mem_get_info()[0]
    pool.detach()
    free_detached = torch.cuda.mem_get_info()[0]
    if pool.reclaim.value == "release":
        assert free_detached - free_attached >= RESERVE_BYTES - 4 * MIB
    else:
        assert abs(free_detached - free_attached) < 4 * MIB
    pool.attach()
    stats = pool.stats()
    assert stats.attached and stats.num_attaches == 1 and stats.num_detaches == 1
    assert 0 < stats.last_attach_s < 1 and 0 < stats.last_detach_s < 1
    assert stats.mapped_bytes == pool.plan.total_bytes
    assert stats.num_handles_live == 2 + 4


CHILD = textwrap.dedent("""
    import json, signal, sys
    from cuda.bindings import driver as cu
    from gpu_backend.vmm import MIB, ElasticKVPool, KVLayout

    class Terminated(Exception):
        pass

    phase = ["build"]
    if sys.argv[2] == "handler":
        def on_term(signum, frame):
            raise Terminated(phase[0])
        signal.signal(signal.SIGTERM, on_term)

    def driver_disagrees(pool):
        \"\"\"Ask the driver itself at every handle's place in the KV range.\"\"\"
        said = {r.address: r for r in pool.mapped_ranges()}
        top, problems = pool.kv_address + pool.plan.base_bytes, []
        arena = pool._holdings.activation_address  # remap mode: where the reserve is lent
        places = [pool.kv_address] + [top + i * 2 * MIB for i in range(256)]
        places += [arena + i * 2 * MIB for i in range(256)] if arena is not None else []
        for address in places + [a for a in said if a not in places]:
            err, handle = cu.cuMemRetainAllocationHandle(cu.CUdeviceptr(address))
            if err != cu.CUresult.CUDA_SUCCESS:
                if address in said:
                    problems.append(f"{address:#x}: pool says mapped, driver says {err.name}")
                continue
            cu.cuMemRelease(handle)
            if address not in said or int(said[address].handle) != int(handle):
                problems.append(f"{address:#x}: driver maps a handle the pool does not say")
        return problems

    pool = ElasticKVPool(KVLayout(4, 8, 128, 16), 64, 512 * MIB, elastic_handle_bytes=2 * MIB,
                         base_handle_bytes=16 * MIB, reclaim=sys.argv[1])
    report = {"cycles": 0}
    try:
        print("ready", flush=True)
        while True:
            phase[0] = "attach"
            print("attach", flush=True)
            pool.attach()
            phase[0] = "detach"
            pool.detach()
            report["cycles"] += 1
    except Terminated as exc:
        report.update(handler_ran_in=str(exc), mapped_handles=pool.num_mapped_handles,
                      location=pool.location.value, problems=driver_disagrees(pool))
        pool.close()
        report["closed"] = True
    print(json.dumps(report), flush=True)
""")
REPO = Path(__file__).resolve().parents[1]


def free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def terminate_mid_attach(reclaim: str, handler: str) -> tuple[int, dict | None]:
    """Start the child, SIGTERM it right after it announces its fourth attach, and return its
    exit code and report (None when the default SIGTERM action ended it)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, reclaim, handler], cwd=REPO, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for _ in range(4):
            assert child.stdout.readline().strip() == "attach"
        child.send_signal(signal.SIGTERM)  # an attach of 256 handles takes milliseconds
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert reports or handler == "default", err[-2000:]
    return child.returncode, reports[0] if reports else None


@pytest.mark.parametrize("reclaim", ["remap", "release"])
def test_sigterm_mid_attach_leaves_a_consistent_pool_and_frees_the_gpu(reclaim: str) -> None:
    torch.zeros(1, device="cuda")  # the parent's own context first, then the baseline
    before = free_bytes()
    code, report = terminate_mid_attach(reclaim, "handler")
    assert code == 0 and report is not None and report["closed"] and report["problems"] == []
    assert report["location"] in ("kv", "activations", "nowhere")  # a clean state, never mixed
    if report["handler_ran_in"] == "attach":  # deferred to the end of the attach, which finished
        assert report["mapped_handles"] in (0, 256)
    code, report = terminate_mid_attach(reclaim, "default")
    assert code == -signal.SIGTERM and report is None  # ended just after the attach section
    deadline = time.monotonic() + 20
    while free_bytes() < before - 8 * MIB and time.monotonic() < deadline:
        time.sleep(0.2)  # the driver frees a dead process's memory asynchronously
    assert free_bytes() >= before - 8 * MIB
