"""The elastic controller: when to lend the activation reserve and how to take it back.

It runs at the start of every `Scheduler.schedule()`. Under the elastic policy it attaches
the elastic region when the coming step is decode-only (no prefill running, none admissible),
and before a step that would admit a prefill it drains the region (preempt, wait or migrate)
and detaches it. It also answers, for every step, how much activation memory the step needs
and how much the KV pool has left unlent, which is how overcommit's OOM is detected.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

from sim.core.block_pool import BlockPool, ElasticState
from sim.core.elastic import ActivationFn, DrainStrategy, Policy, ReserveLayout, VmmCostModel
from sim.core.request import RequestState
from sim.core.step import ElasticAction, ElasticActionKind, new_tuple


class SchedulerView(Protocol):
    """What the controller reads of the scheduler and may ask of it (the scheduler satisfies
    this; naming it here keeps the controller from importing the scheduler)."""

    pool: BlockPool
    # whether the last step scheduled held elastic blocks (its tables may point into them)
    step_held_elastic: bool

    @property
    def running(self) -> Sequence[RequestState]: ...

    def has_prefill_running(self) -> bool: ...

    def head_chunk_blocks(self) -> int | None: ...

    def preempt(self, req: RequestState) -> None: ...

    def table_changed(self, req: RequestState) -> None: ...


class ElasticController:
    def __init__(
        self,
        policy: Policy,
        layout: ReserveLayout,
        activation_fn: ActivationFn,
        vmm: VmmCostModel | None = None,
        drain: DrainStrategy = DrainStrategy.MIGRATE,
        detach_behind_step: bool = True,
    ) -> None:
        self.policy = policy
        self.layout = layout
        # pure in (tokens, rows) and asked at every step: remember the recent answers
        self.activation_fn = functools.lru_cache(maxsize=1 << 14)(activation_fn)
        self.vmm = vmm or VmmCostModel()
        self.drain = drain
        self.detach_behind_step = detach_behind_step  # EngineConfig.detach_behind_step
        self._lends = policy is Policy.ELASTIC and layout.num_elastic_blocks > 0
        # (handles, map seconds, detach seconds) by bytes lent: pure, and a decode batch
        # lends one of a few hundred sizes, attached and detached thousands of times
        self._vmm_costs: dict[int, tuple[int, float, float]] = {}
        self.lent_bytes = 0  # bytes of the reserve mapped into the KV pool right now
        self.lent_handles = 0
        # the largest step's activations since the last attach: what the engine's allocator
        # caches and the next attach hands back (VmmCosts.attach_cache_gib_s)
        self.cached_bytes = 0

    # ------------------------------------------------------------- queries
    def admission_allowed(self, pool: BlockPool) -> bool:
        """Under the elastic policy a prefill may start only with the reserve detached."""
        return self.policy is not Policy.ELASTIC or pool.elastic_state is ElasticState.DETACHED

    def max_blocks_per_request(self, pool: BlockPool) -> int:
        """A prefill runs in base blocks only, unless overcommit lends the reserve for good."""
        if self.policy is Policy.OVERCOMMIT:
            return pool.num_blocks
        return pool.num_base_blocks

    def activation_need(self, pool: BlockPool, num_tokens: int, num_rows: int) -> tuple[int, int]:
        """(bytes the step's activations need, bytes of the reserve not lent right now)."""
        needed = self.activation_fn(num_tokens, num_rows) if num_tokens else 0
        reserve = self.layout.reserve_bytes
        if self.policy is Policy.OVERCOMMIT:
            return needed, reserve - pool.num_used_elastic * self.layout.block_bytes
        if self.policy is Policy.ELASTIC and pool.elastic_state is not ElasticState.DETACHED:
            return needed, reserve - self.lent_bytes
        return needed, reserve

    def note_step(self, activation_bytes: int) -> None:
        """A step ran with `activation_bytes` of activations: the allocator keeps the largest."""
        self.cached_bytes = max(self.cached_bytes, activation_bytes)

    def prefill_wanted(self, sched: SchedulerView, pool: BlockPool) -> bool:
        """Would the next step run a prefill if the elastic region were drained and detached?
        (`pool`: the scheduler's)"""
        if sched.has_prefill_running():
            return True
        needed = sched.head_chunk_blocks()
        if needed is None:
            return False
        free_base = pool.num_free_base_blocks
        if self.drain is not DrainStrategy.PREEMPT:
            free_base -= pool.num_used_elastic  # migration or waiting uses base blocks
        return needed <= free_base

    # ------------------------------------------------------------- actions
    def before_step(self, sched: SchedulerView) -> ElasticAction | None:
        if not self._lends:
            return None
        pool = sched.pool
        wanted = self.prefill_wanted(sched, pool)
        if pool.elastic_state is ElasticState.DETACHED:
            if wanted:
                return None
            batch_size = len(sched.running)
            return self._attach(pool, batch_size) if batch_size else None
        if not wanted:
            pool.resume_lending()  # a drain was started but the prefill went away
            return None
        if self.drain is DrainStrategy.WAIT and pool.num_used_elastic:
            if pool.elastic_state is ElasticState.DRAINING:
                return None
            pool.start_draining()
            return ElasticAction(ElasticActionKind.DRAIN_WAIT, 0, 0.0, needs_idle_device=False)
        return self._drain_and_detach(sched)

    def _attach(self, pool: BlockPool, batch_size: int) -> ElasticAction | None:
        """Lend what the reserve holds beyond the activations of the current decode batch.

        While lent no request is admitted, so the decode batch can only shrink: its activation
        peak now bounds every step until the next detach.
        """
        headroom = self.activation_fn(batch_size, batch_size)
        lendable = self.layout.reserve_bytes - headroom
        granule = self.layout.granule_bytes
        lent_bytes = max(0, lendable) // granule * granule
        num_blocks = min(lent_bytes // self.layout.block_bytes, self.layout.num_elastic_blocks)
        if num_blocks == 0:
            return None
        pool.attach_elastic(num_blocks)
        self.lent_bytes = num_blocks * self.layout.block_bytes
        self.lent_handles, map_s, _ = self._costs(self.lent_bytes)
        # as vmm.attach_s(lent_bytes, cached_bytes) adds them
        duration_s = map_s + self.vmm.cache_release_s(self.cached_bytes)
        self.cached_bytes = 0  # handed back
        # kind, handles, seconds, preempted, migrations, migrated bytes, blocks, waits
        return new_tuple(ElasticAction, (ElasticActionKind.ATTACH, self.lent_handles,
                                         duration_s, (), (), 0, num_blocks, True))

    def _drain_and_detach(self, sched: SchedulerView) -> ElasticAction:
        """Preempt or migrate the holders of elastic blocks, then detach. The detach waits
        for the step in flight only if that step held elastic blocks (or `detach_behind_step`
        is off): otherwise none of its kernels touch the reserve, and there is nothing to
        migrate either."""
        pool = sched.pool
        waits = sched.step_held_elastic or not self.detach_behind_step
        pool.start_draining()  # allocations from here on land in base blocks only
        preempted: list[int] = []
        migrations: list[tuple[int, int]] = []
        holders = []
        if pool.num_used_elastic:  # elastic ids are the highest, so max() finds a holder
            first_elastic = pool.num_base_blocks
            holders = [r for r in sched.running if r.block_ids and max(r.block_ids) >= first_elastic]
        for req in reversed(holders):  # tail first, as preemption does
            if self.drain is DrainStrategy.MIGRATE and _migrate(pool, req.block_ids, migrations):
                sched.table_changed(req)
                continue
            sched.preempt(req)
            preempted.append(req.request_id)
        pool.detach_elastic()
        duration_s = self._costs(self.lent_bytes)[2]
        handles, self.lent_bytes, self.lent_handles = self.lent_handles, 0, 0
        # kind, handles, seconds, preempted, migrations, migrated bytes, blocks, waits
        return new_tuple(ElasticAction, (
            ElasticActionKind.DETACH, handles, duration_s, tuple(preempted),
            tuple(migrations), len(migrations) * self.layout.block_bytes, 0,
            waits or bool(migrations) or bool(preempted)))

    def _costs(self, lent_bytes: int) -> tuple[int, float, float]:
        """(handles, `VmmCostModel.map_s`, `VmmCostModel.detach_s`) of lending `lent_bytes`."""
        costs = self._vmm_costs.get(lent_bytes)
        if costs is None:
            vmm = self.vmm
            costs = (vmm.num_handles(lent_bytes), vmm.map_s(lent_bytes), vmm.detach_s(lent_bytes))
            self._vmm_costs[lent_bytes] = costs
        return costs


def _migrate(pool: BlockPool, block_ids: list[int], migrations: list[tuple[int, int]]) -> bool:
    """Move a request's elastic blocks into free base blocks, in place; False if they do not fit."""
    positions = [i for i, b in enumerate(block_ids) if pool.is_elastic(b)]
    targets = pool.allocate(len(positions))
    if targets is None:
        return False
    sources = [block_ids[i] for i in positions]
    for i, target in zip(positions, targets):
        block_ids[i] = target
    pool.free(sources)
    migrations.extend(zip(sources, targets))
    return True
