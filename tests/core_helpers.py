"""Small builders shared by the pure-core tests (no simpy, no torch)."""

from __future__ import annotations

from sim.core.block_pool import BlockPool
from sim.core.controller import ElasticController
from sim.core.elastic import DrainStrategy, Policy, ReserveLayout, VmmCostModel
from sim.core.request import RequestState
from sim.core.scheduler import Scheduler, SchedulerConfig

BLOCK_BYTES = 50
BYTES_PER_TOKEN = 10


def linear_activation(num_tokens: int, num_rows: int) -> int:
    """A toy activation model: 10 bytes per token plus 1 byte per sampled row."""
    return BYTES_PER_TOKEN * num_tokens + num_rows


def make_scheduler(
    num_base_blocks: int = 64,
    *,
    policy: Policy = Policy.STATIC,
    num_elastic_blocks: int = 0,
    drain: DrainStrategy = DrainStrategy.PREEMPT,
    block_bytes: int = BLOCK_BYTES,
    vmm: VmmCostModel | None = None,
    **config_kwargs,
) -> Scheduler:
    config = SchedulerConfig(**config_kwargs)
    reserve = linear_activation(config.max_num_batched_tokens, config.max_num_seqs)
    lent = num_elastic_blocks * block_bytes
    assert lent <= reserve, "the elastic region cannot exceed the reserve"
    layout = ReserveLayout(reserve, lent, num_elastic_blocks, block_bytes, 1, granule_bytes=1)
    pool = BlockPool(num_base_blocks, num_elastic_blocks,
                     elastic_attached=policy is Policy.OVERCOMMIT)
    controller = ElasticController(policy, layout, linear_activation, vmm or VmmCostModel(), drain)
    return Scheduler(config, pool, controller)


def request(request_id: int, prompt: int, output: int, arrival_s: float = 0.0,
            hashes: tuple[int, ...] | None = None) -> RequestState:
    return RequestState(request_id, arrival_s, prompt, output, hashes)


def run_to_completion(sched: Scheduler, max_steps: int = 100_000, decode_run: bool = False):
    """Drive the scheduler with a fake executor in which every step takes 1 s."""
    outputs = []
    now = 0.0
    limit = (lambda batch, ctx, k, attach: k) if decode_run else None
    while sched.has_unfinished():
        out = sched.schedule(decode_run_limit=limit)
        now += out.num_steps
        sched.update(out, now)
        sched.pool.check_invariants()
        outputs.append(out)
        assert len(outputs) < max_steps, "scheduler made no progress"
    return outputs
