"""The engine's elastic transitions timed for a calibration: attach and detach of reserves of a
few handles, after prefills that leave different amounts in torch's cache, fitted to the fixed,
per-handle and per-cached-GiB costs the simulator's VmmCosts take
(sim.core.calibration.profile_fit.transition_costs)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from functools import partial

from gpu_backend.engine.shapes import host_batch, prefill_shape
from sim.core.calibration.profile_fit import transition_costs
from sim.core.elastic import Policy
from sim.core.engine_config import EngineConfig

TRANSITION_HANDLES = (1, 2, 4)
# prefills (tokens) run before the 2-handle attaches beside the largest: none, short, medium
TRANSITION_PREFILLS = (0, 512, 2048)
GRANULE_BYTES = 2 * 1024 * 1024  # CUDA VMM allocation granularity on the H200


def measure_transitions(runner, config: EngineConfig, device, num_pool_blocks: int,
                        cycles: int = 5) -> dict:
    """The engine's elastic transitions, run and timed by the engine's own `ElasticExecutor`.

    The engine lends in release mode: ATTACH hands torch's cached blocks back
    (empty_cache) and creates and maps the reserve's handles, DETACH unmaps and releases
    them. Each cycle first runs a prefill step so that its activations sit in torch's cache,
    as after a replay's last prefill: reserves of 1, 2 and 4 handles of
    `config.vmm_handle_bytes` after the largest prefill (8,192 tokens or the chunk), then 2
    handles after smaller ones and after none (TRANSITION_PREFILLS), so that the cached bytes
    each attach hands back (`freed_bytes`) vary. `transition_costs` fits the fixed, per-handle
    and per-cached-GiB costs the simulator's VmmCosts take.
    """
    from gpu_backend.engine.memory import kv_layout
    from gpu_backend.vmm import ElasticKVPool

    handle = config.vmm_handle_bytes
    largest = min(8192, config.max_num_batched_tokens)
    layout = kv_layout(config.model, config.block_size)
    # the fewest base blocks that end on the 2 MiB granule (the elastic part starts there)
    num_base = GRANULE_BYTES // math.gcd(layout.block_bytes, GRANULE_BYTES)
    points = []
    for handles, tokens in transition_plan(largest):
        with ElasticKVPool(layout, num_base, handles * handle, elastic_handle_bytes=handle,
                           reclaim="release", device_ordinal=device.index or 0) as pool:
            executor = release_executor(pool, num_base, device)
            before = prefill_step(runner, config, num_pool_blocks, tokens)
            points.append({"handles": handles, "prefill_tokens": tokens,
                           **cycle_transitions(executor, before, pool.plan.num_elastic_blocks,
                                               cycles)})
    return {"handle_bytes": handle, "reclaim": "release", "points": points,
            "costs": transition_costs(points)}


def transition_plan(largest_prefill: int) -> list[tuple[int, int]]:
    """(handles, prefill tokens) of each point: 1, 2 and 4 handles after the largest prefill,
    then 2 handles after each smaller one of TRANSITION_PREFILLS (0: none)."""
    plan = [(handles, largest_prefill) for handles in TRANSITION_HANDLES]
    plan += [(2, tokens) for tokens in TRANSITION_PREFILLS if tokens < largest_prefill]
    return plan


def release_executor(pool, num_base_blocks: int, device):
    """An `ElasticExecutor` (elastic policy) over `pool`, as the engine runs one in release
    mode: it syncs the device, and each attach first empties torch's cache and records the
    reserved bytes that freed."""
    import torch

    from gpu_backend.engine.elastic import ElasticExecutor

    return ElasticExecutor(pool, Policy.ELASTIC, block_id_offset=0,
                           num_core_base_blocks=num_base_blocks,
                           sync=lambda: torch.cuda.synchronize(device),
                           empty_cache=torch.cuda.empty_cache,
                           reserved_bytes=lambda: torch.cuda.memory_reserved(device))


def prefill_step(runner, config: EngineConfig, num_pool_blocks: int,
                 tokens: int) -> Callable[[], None]:
    """A prefill of `tokens` tokens on `runner`, to run before an attach (0: nothing), so that
    its activations sit in torch's cache."""
    if tokens == 0:
        return lambda: None
    batch = host_batch(prefill_shape(tokens), config.block_size, num_pool_blocks)
    return partial(runner.execute, batch)


def cycle_transitions(executor, before_attach, num_elastic_blocks: int,
                      cycles: int) -> dict[str, float]:
    """`cycles` times: before_attach(), lend all `num_elastic_blocks`, take them back.
    Median attach and detach seconds, as the executor timed them, and the median bytes of
    torch's cache each attach handed back."""
    for _ in range(cycles):
        before_attach()
        executor.attach(num_elastic_blocks)
        executor.detach()
    attaches = [t for t in executor.transitions if t.kind == "attach"][-cycles:]
    return {"attach_s": statistics.median(executor.attach_latencies_s[-cycles:]),
            "detach_s": statistics.median(executor.detach_latencies_s[-cycles:]),
            "freed_bytes": int(statistics.median(t.freed_bytes for t in attaches))}
