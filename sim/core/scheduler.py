"""The step scheduler shared by the simulator and the GPU engine.

One step: `out = scheduler.schedule()`, the executor runs it, `scheduler.update(out, end_s)`.
Per step there is one token budget (`max_num_batched_tokens`). Running requests are served
first, in order, each catching its computed tokens up to its known tokens (a decode is one
token, a prompt is cut into chunks by the budget). When a running request cannot get a block,
the request at the tail of the running list is preempted by recompute until it can. Waiting
requests are admitted first come, first served, only in a step that preempted nobody.

The elastic controller (`ElasticController`) runs at the start of `schedule()`; it may
attach or detach the elastic region and drain it first. Admission of waiting requests needs
the region detached under the elastic policy, because a prefill needs the reserve.

For the simulator, `schedule(decode_run_limit=...)` returns a run of identical decode-only
steps in one output when nothing can change in between (no admission, no finish, no block
shortage): the caller's limit function says how many of them fit before the next arrival.

`schedule()` returns what to run; `make_stats()` then reports the pool's usage and the step's
activation need (`SchedulerStats`), as vLLM v1 keeps its SchedulerStats apart. A request
leaves `requests` once it finishes or fails, so a long trace holds only the live ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from sim.core.block_cache import EMPTY
from sim.core.block_pool import BlockPool
from sim.core.controller import ElasticController
from sim.core.decode_run import allocate_run, decode_run_bounds, step_items, steps_that_fit
from sim.core.prefix_cache import PrefixCache, first_chunk
from sim.core.request import RejectReason, RequestState, RequestStatus
from sim.core.scheduler_config import SchedulerConfig
from sim.core.step import (
    ElasticAction,
    ElasticActionKind,
    OutOfMemory,
    ScheduledRequest,
    SchedulerOutput,
    SchedulerStats,
    new_tuple,
)

__all__ = ["DecodeRunLimit", "Scheduler", "SchedulerConfig"]

DecodeRunLimit = Callable[[int, int, int, ElasticAction | None], int]
"""limit(batch_size, context_tokens, max_steps, attach) -> steps (1..max_steps) to run at
once; `attach` is the elastic attach the run waits for first (its pause delays every step)."""


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, pool: BlockPool, controller: ElasticController
    ) -> None:
        self.config = config
        self.pool = pool
        self.controller = controller
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.requests: dict[int, RequestState] = {}  # waiting and running, by id
        self.prefix: PrefixCache | None = (
            PrefixCache(pool, config.block_size, config.hash_block_tokens)
            if config.enable_prefix_caching else None)
        self._step_id = 0
        self._stats: SchedulerStats | None = None
        self._failed: list[RequestState] = []  # failed since the last update()
        self._run_states: tuple[int, tuple[RequestState, ...]] | None = None  # the last run's
        self.step_held_elastic = False  # the last step scheduled held elastic blocks

    # -------------------------------------------------------------- requests
    def add_request(self, req: RequestState) -> bool:
        """Queue a request; refuse it (status REJECTED, `reject_reason` set) if it can never
        run: longer than max_model_len, or needing more KV blocks than a request may hold."""
        total_tokens = req.num_prompt_tokens + req.max_output_tokens
        blocks = -(-total_tokens // self.config.block_size)
        if total_tokens > self.config.max_model_len:
            req.reject_reason = RejectReason.EXCEEDS_MAX_MODEL_LEN
        elif blocks > self.controller.max_blocks_per_request(self.pool):
            req.reject_reason = RejectReason.EXCEEDS_KV_POOL
        if req.reject_reason is not None:
            req.status = RequestStatus.REJECTED
            return False
        self.requests[req.request_id] = req
        self.waiting.append(req)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def preempt(self, req: RequestState) -> None:
        """Free a running request's blocks; it goes back to the head of the waiting queue."""
        self.running.remove(req)
        self._free_blocks(req)
        req.num_recomputed_tokens += req.num_computed_tokens
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        if self.prefix is not None:
            self.prefix.reset(req.request_id)
        self.waiting.appendleft(req)

    def table_changed(self, req: RequestState) -> None:
        """The request's block table was rewritten in place (its elastic blocks migrated)."""
        if self.prefix is not None:
            self.prefix.table_changed(req.request_id)

    # ------------------------------------------------------------ predicates
    def head_chunk_blocks(self) -> int | None:
        """Blocks the head of the waiting queue needs for its first chunk, or None."""
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return None
        head = self.waiting[0]
        num_new = min(head.num_uncomputed_tokens, self.config.max_num_batched_tokens)
        return head.blocks_needed(num_new, self.config.block_size)

    def has_prefill_running(self) -> bool:
        for r in self.running:
            if r.num_output_tokens == 0 or (
                    r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens != 1):
                return True
        return False

    # -------------------------------------------------------------- schedule
    def schedule(self, decode_run_limit: DecodeRunLimit | None = None) -> SchedulerOutput:
        out = self._schedule(decode_run_limit)
        self.step_held_elastic = self.pool.num_used_elastic > 0
        return out

    def _schedule(self, decode_run_limit: DecodeRunLimit | None) -> SchedulerOutput:
        self._step_id += 1
        action = self.controller.before_step(self)
        preempted: list[int] = list(action.preempted_ids) if action else []
        if decode_run_limit is not None and (action is None or
                                             action.kind is ElasticActionKind.ATTACH):
            run = self._decode_run(decode_run_limit, action)
            if run is not None:
                return run
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[RequestState, int, list[int]]] = []
        budget = self._schedule_running(budget, scheduled, preempted)
        if not preempted and self.waiting and self.controller.admission_allowed(self.pool):
            self._schedule_waiting(budget, scheduled)
        return self._finish_output(scheduled, preempted, action)

    def make_stats(self) -> SchedulerStats:
        """Pool usage and activation need of the step the last `schedule()` returned."""
        if self._stats is None:
            raise RuntimeError("make_stats() reports on a scheduled step: call schedule() first")
        return self._stats

    def _schedule_running(self, budget: int, scheduled: list, preempted: list[int]) -> int:
        block_size = self.config.block_size
        allocate = self.pool.allocate
        prefix = self.prefix
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            num_computed = req.num_computed_tokens
            num_new = min(req.num_prompt_tokens + req.num_output_tokens - num_computed, budget)
            needed = -(-(num_computed + num_new) // block_size) - len(req.block_ids)
            if needed <= 0:
                new_blocks: list[int] | None = []
            elif prefix is not None and num_computed < req.num_prompt_tokens and req.block_hashes:
                new_blocks = self._allocate_prompt(prefix, req, needed)
            else:
                new_blocks = allocate(needed)
            while new_blocks is None:
                victim = running[-1]
                self.preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
                new_blocks = allocate(req.blocks_needed(num_new, block_size))
            if new_blocks is None:
                break
            req.block_ids.extend(new_blocks)
            scheduled.append((req, num_new, new_blocks))
            budget -= num_new
            i += 1
        return budget

    def _allocate_prompt(self, prefix: PrefixCache, req: RequestState,
                         num_blocks: int) -> list[int] | None:
        """Blocks for a chunk of a prompt the prefix cache names once computed: it gets them
        as the array they come as."""
        blocks = self.pool.allocate_blocks(num_blocks)
        if blocks is None:
            return None
        prefix.allocated(req, len(req.block_ids), blocks)
        return blocks.tolist()

    def _schedule_waiting(self, budget: int, scheduled: list) -> None:
        block_size = self.config.block_size
        pool, prefix = self.pool, self.prefix
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            cached = prefix if prefix is not None and req.block_hashes else None
            if cached is not None and cached.refused_before_lookup(req, budget):
                break
            hits = cached.hits(req) if cached is not None else EMPTY
            num_hits = len(hits)
            num_new, needed = first_chunk(req, num_hits, budget, block_size)
            if cached is not None and cached.still_refused(req, needed):
                break
            # A hit sitting free in the cache stops being free once touched.
            if not pool.can_allocate(needed) or (
                    num_hits and not pool.can_allocate(needed + pool.num_unreferenced(hits))):
                if cached is not None:
                    cached.refuse(req, needed)
                break
            if num_hits:
                pool.touch(hits)
            if cached is not None:  # the prefix cache keeps the new blocks as their array
                new_array = pool.allocate_blocks(needed)
                assert new_array is not None
                new_blocks = new_array.tolist()
            else:
                new_array = EMPTY
                allocated = pool.allocate(needed)
                assert allocated is not None
                new_blocks = allocated
            self.waiting.popleft()
            if num_hits:
                table = hits.tolist()
                table += new_blocks
                req.block_ids = table
            else:
                req.block_ids = new_blocks
            req.num_computed_tokens = num_hits * block_size
            if req.num_preemptions == 0:  # as vLLM: counted at the first admission only
                req.num_cached_tokens = req.num_computed_tokens
            if cached is not None:
                cached.admitted(req, num_hits, new_array)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append((req, num_new, req.block_ids))
            budget -= num_new

    # ------------------------------------------------------------- decode run
    def _decode_run(self, limit: DecodeRunLimit,
                    attach: ElasticAction | None) -> SchedulerOutput | None:
        """A run of decode-only steps in which no scheduling decision can change (an attach
        just made keeps it so: nothing is admitted while the reserve is lent)."""
        running = self.running
        if not running or len(running) > self.config.max_num_batched_tokens or \
                self._admission_possible():
            return None
        bounds = decode_run_bounds(running)
        if bounds is None or bounds[0] < 2:
            return None
        block_size = self.config.block_size
        max_steps = steps_that_fit(running, self.pool.num_free_blocks, block_size, bounds[0])
        if max_steps < 2:
            return None
        context_tokens = bounds[1]
        num_steps = max(1, min(max_steps,
                               limit(len(running), context_tokens, max_steps, attach)))
        items, wait_steps = allocate_run(running, num_steps, block_size, self.pool.allocate)
        self._run_states = (self._step_id, tuple(running))
        return self._output(items, num_steps, 0, len(running), (), context_tokens, [], attach,
                            None, len(running), wait_steps=wait_steps)

    def _admission_possible(self) -> bool:
        needed = self.head_chunk_blocks()
        if needed is None or not self.controller.admission_allowed(self.pool):
            return False
        return self.pool.can_allocate(needed)

    # ---------------------------------------------------------------- output
    def _finish_output(self, scheduled: list, preempted: list[int],
                       action: ElasticAction | None) -> SchedulerOutput:
        items, num_prefill, num_decode, prefill_chunks, decode_context, num_rows = \
            step_items(scheduled)
        need = None
        oom = None
        if items:
            need = self.controller.activation_need(self.pool, num_prefill + num_decode, num_rows)
            oom = self._check_memory(need, items)
        if oom is not None:
            items, num_prefill, num_decode, prefill_chunks, decode_context = [], 0, 0, [], 0
            num_rows, need = 0, None
        return self._output(tuple(items), 1, num_prefill, num_decode, tuple(prefill_chunks),
                            decode_context, preempted, action, oom, num_rows, need)

    def _check_memory(self, need: tuple[int, int],
                      items: list[ScheduledRequest]) -> OutOfMemory | None:
        """Fail the step's requests when its activations exceed what the reserve holds."""
        needed, available = need
        if needed <= available:
            return None
        failed = tuple(s.request_id for s in items)
        self.fail_oom(failed)
        return OutOfMemory(needed, available, failed)

    def fail_oom(self, request_ids: tuple[int, ...]) -> None:
        """The step holding these requests ran out of memory: drop them as failed.

        Called by `schedule()` when the activation model predicts the OOM, and by a real
        executor when the GPU raises one the model did not predict.
        """
        for request_id in request_ids:
            req = self.requests.get(request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            self.running.remove(req)
            self._free_blocks(req)
            req.status = RequestStatus.FAILED_OOM
            self._forget(req)
            self._failed.append(req)

    def _output(self, items, num_steps, num_prefill, num_decode, prefill_chunks,
                decode_context, preempted, action, oom, num_rows,
                need: tuple[int, int] | None = None, wait_steps: int = 0) -> SchedulerOutput:
        """The output, and the stats `make_stats` reports; `need`: the step's activation need
        when the caller has it already (the pool has not changed since); `wait_steps`: a
        decode run's SchedulerStats.run_block_wait_steps."""
        pool = self.pool
        needed, available = need or self.controller.activation_need(
            pool, num_prefill + num_decode, num_rows)
        if items:  # a step ran: its activations stay in the allocator's cache
            self.controller.note_step(needed)
        lent = pool.num_attached_elastic
        self._stats = new_tuple(SchedulerStats, (
            self._step_id, len(self.running), len(self.waiting),
            pool.num_used_base + pool.num_used_elastic, pool.num_base_blocks + lent, lent,
            needed, available, wait_steps))
        return new_tuple(SchedulerOutput, (
            self._step_id, items, num_steps, num_prefill, num_decode, prefill_chunks,
            decode_context, tuple(preempted), action, oom, num_rows))

    # ---------------------------------------------------------------- update
    def update(self, out: SchedulerOutput, end_s: float) -> list[RequestState]:
        """Close a step that ended at `end_s`; return the requests that ended in it: those
        that finished, then those that failed (out of memory) since the last update."""
        finished: list[RequestState] = []
        requests, num_steps = self.requests, out.num_steps
        if self._run_states is not None and self._run_states[0] == out.step_id:
            self._close_run(self._run_states[1], num_steps, end_s, finished)
            return self._with_failed(finished)
        prefix = self.prefix
        for item in out.scheduled:
            req = requests.get(item.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            req.num_computed_tokens += item.num_new_tokens * num_steps
            if prefix is not None and not item.is_decode and req.block_hashes:
                prefix.register_full_blocks(req)
            if not item.samples:
                continue
            req.num_output_tokens += num_steps
            if req.first_token_s is None:
                req.first_token_s = end_s
            if req.num_output_tokens >= req.max_output_tokens:
                self._finish(req, end_s)
                finished.append(req)
        return self._with_failed(finished)

    def _close_run(self, states: tuple[RequestState, ...], num_steps: int, end_s: float,
                   finished: list[RequestState]) -> None:
        """A decode run: every request computed and sampled one token per step."""
        self._run_states = None
        running = RequestStatus.RUNNING
        for req in states:
            if req.status is not running:
                continue
            req.num_computed_tokens += num_steps
            req.num_output_tokens += num_steps
            if req.num_output_tokens >= req.max_output_tokens:
                self._finish(req, end_s)
                finished.append(req)

    def _with_failed(self, finished: list[RequestState]) -> list[RequestState]:
        if self._failed:
            finished += self._failed
            self._failed = []
        return finished

    def _finish(self, req: RequestState, end_s: float) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_s = end_s
        self.running.remove(req)
        self._free_blocks(req)
        self._forget(req)

    def _free_blocks(self, req: RequestState) -> None:
        """Give the request's blocks back, last first (`BlockPool.free`); under prefix
        caching as the arrays the prefix cache keeps of its table."""
        prefix = self.prefix
        split = prefix.table_tail_first(req) if prefix is not None else None
        if split is not None:
            self.pool.free_table(*split)
        elif prefix is not None:
            self.pool.free(prefix.blocks_tail_first(req))
        else:
            self.pool.free(req.block_ids[::-1])
        req.block_ids = []

    def _forget(self, req: RequestState) -> None:
        """A finished or failed request leaves the scheduler for good."""
        del self.requests[req.request_id]
        if self.prefix is not None:
            self.prefix.forget(req.request_id)
