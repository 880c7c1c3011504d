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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from sim.core.block_pool import BlockPool
from sim.core.controller import ElasticController
from sim.core.request import RequestState, RequestStatus
from sim.core.step import ElasticAction, OutOfMemory, ScheduledRequest, SchedulerOutput

DecodeRunLimit = Callable[[int, int, int], int]
"""limit(batch_size, context_tokens, max_steps) -> steps (1..max_steps) to run at once."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 32768
    block_size: int = 16
    enable_prefix_caching: bool = False
    hash_block_tokens: int = 512  # prompt tokens named by one trace block hash (Mooncake)

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.block_size < 1 or self.hash_block_tokens % self.block_size:
            raise ValueError(
                f"block_size {self.block_size} must be >= 1 and divide hash_block_tokens "
                f"{self.hash_block_tokens}"
            )


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, pool: BlockPool, controller: ElasticController
    ) -> None:
        self.config = config
        self.pool = pool
        self.controller = controller
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.requests: dict[int, RequestState] = {}
        self._block_keys: dict[int, list[Hashable]] = {}
        self._num_registered: dict[int, int] = {}  # prompt blocks already named, per request
        self._step_id = 0

    # -------------------------------------------------------------- requests
    def add_request(self, req: RequestState) -> bool:
        """Queue a request; reject it (status REJECTED, reason set) if it can never run."""
        self.requests[req.request_id] = req
        total_tokens = req.num_prompt_tokens + req.max_output_tokens
        blocks = -(-total_tokens // self.config.block_size)
        if total_tokens > self.config.max_model_len:
            req.reject_reason = f"{total_tokens} tokens > max_model_len {self.config.max_model_len}"
        elif blocks > self.controller.max_blocks_per_request(self.pool):
            limit = self.controller.max_blocks_per_request(self.pool)
            req.reject_reason = f"needs {blocks} KV blocks > {limit} it could ever hold"
        if req.reject_reason:
            req.status = RequestStatus.REJECTED
            return False
        self.waiting.append(req)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def preempt(self, req: RequestState) -> None:
        """Free a running request's blocks; it goes back to the head of the waiting queue."""
        self.running.remove(req)
        self.pool.free(reversed(req.block_ids))
        req.block_ids = []
        req.num_recomputed_tokens += req.num_computed_tokens
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self._num_registered.pop(req.request_id, None)
        self.waiting.appendleft(req)

    # ------------------------------------------------------------ predicates
    def head_chunk_blocks(self) -> int | None:
        """Blocks the head of the waiting queue needs for its first chunk, or None."""
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return None
        head = self.waiting[0]
        num_new = min(head.num_uncomputed_tokens, self.config.max_num_batched_tokens)
        return head.blocks_needed(num_new, self.config.block_size)

    def has_prefill_running(self) -> bool:
        return any(not _is_decode(r) for r in self.running)

    # -------------------------------------------------------------- schedule
    def schedule(self, decode_run_limit: DecodeRunLimit | None = None) -> SchedulerOutput:
        self._step_id += 1
        action = self.controller.before_step(self)
        preempted: list[int] = list(action.preempted_ids) if action else []
        if decode_run_limit is not None and action is None:
            run = self._decode_run(decode_run_limit)
            if run is not None:
                return run
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[RequestState, int, list[int]]] = []
        budget = self._schedule_running(budget, scheduled, preempted)
        if not preempted and self.controller.admission_allowed(self.pool):
            self._schedule_waiting(budget, scheduled)
        return self._finish_output(scheduled, preempted, action)

    def _schedule_running(self, budget: int, scheduled: list, preempted: list[int]) -> int:
        block_size = self.config.block_size
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_uncomputed_tokens, budget)
            new_blocks = self.pool.allocate(req.blocks_needed(num_new, block_size))
            while new_blocks is None:
                victim = self.running[-1]
                self.preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
                new_blocks = self.pool.allocate(req.blocks_needed(num_new, block_size))
            if new_blocks is None:
                break
            req.block_ids.extend(new_blocks)
            scheduled.append((req, num_new, new_blocks))
            budget -= num_new
            i += 1
        return budget

    def _schedule_waiting(self, budget: int, scheduled: list) -> None:
        block_size = self.config.block_size
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            hits = self._prefix_hits(req) if req.num_computed_tokens == 0 else []
            num_cached = len(hits) * block_size
            num_new = min(req.num_tokens - num_cached, budget)
            needed = -(-(num_cached + num_new) // block_size) - len(hits)
            # A hit sitting free in the cache stops being free once touched.
            free_hits = sum(1 for b in hits if self.pool.ref_count(b) == 0)
            if not self.pool.can_allocate(needed + free_hits):
                break
            for block_id in hits:
                self.pool.touch(block_id)
            new_blocks = self.pool.allocate(needed)
            assert new_blocks is not None
            self.waiting.popleft()
            req.block_ids = hits + new_blocks
            req.num_computed_tokens = num_cached
            if req.num_preemptions == 0:  # as vLLM: counted at the first admission only
                req.num_cached_tokens = num_cached
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append((req, num_new, req.block_ids))
            budget -= num_new

    # ----------------------------------------------------------- prefix cache
    def _keys(self, req: RequestState) -> list[Hashable]:
        """Content keys of the request's full prompt blocks named by its trace hashes."""
        keys = self._block_keys.get(req.request_id)
        if keys is None:
            keys = []
            if self.config.enable_prefix_caching and req.block_hashes:
                per_hash = self.config.hash_block_tokens // self.config.block_size
                num_full = req.num_prompt_tokens // self.config.block_size
                chain: Hashable = None
                for j, block_hash in enumerate(req.block_hashes):
                    chain = (chain, block_hash)
                    for sub in range(per_hash):
                        if j * per_hash + sub >= num_full:
                            break
                        keys.append((chain, sub))
            self._block_keys[req.request_id] = keys
        return keys

    def _prefix_hits(self, req: RequestState) -> list[int]:
        keys = self._keys(req)
        # Always compute at least the last prompt token, so the request samples.
        max_hits = (req.num_tokens - 1) // self.config.block_size
        hits: list[int] = []
        for key in keys[:max_hits]:
            block_id = self.pool.cached_block(key)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _register_full_blocks(self, req: RequestState) -> None:
        """Name the prompt blocks this step filled (those before were named already)."""
        keys = self._keys(req)
        num_full = min(len(keys), req.num_computed_tokens // self.config.block_size)
        first = self._num_registered.get(req.request_id, 0)
        for index in range(first, num_full):
            self.pool.register(req.block_ids[index], keys[index])
        self._num_registered[req.request_id] = max(first, num_full)

    # ------------------------------------------------------------- decode run
    def _decode_run(self, limit: DecodeRunLimit) -> SchedulerOutput | None:
        """A run of decode-only steps in which no scheduling decision can change."""
        running = self.running
        if not running or len(running) > self.config.max_num_batched_tokens:
            return None
        if self.has_prefill_running() or self._admission_possible():
            return None
        max_steps = min(r.max_output_tokens - r.num_output_tokens for r in running)
        max_steps = self._limit_by_blocks(max_steps)
        if max_steps < 2:
            return None
        context_tokens = sum(r.num_tokens for r in running)
        num_steps = max(1, min(max_steps, limit(len(running), context_tokens, max_steps)))
        block_size = self.config.block_size
        scheduled = []
        for req in running:
            needed = -(-(req.num_computed_tokens + num_steps) // block_size) - len(req.block_ids)
            new_blocks = self.pool.allocate(needed) if needed > 0 else []
            assert new_blocks is not None, "decode run horizon allowed too many blocks"
            req.block_ids.extend(new_blocks)
            scheduled.append(
                ScheduledRequest(req.request_id, req.num_computed_tokens, 1, tuple(new_blocks),
                                 True, True)
            )
        return self._output(tuple(scheduled), num_steps, 0, len(running), (), context_tokens,
                            [], None, None)

    def _admission_possible(self) -> bool:
        needed = self.head_chunk_blocks()
        if needed is None or not self.controller.admission_allowed(self.pool):
            return False
        return self.pool.can_allocate(needed)

    def _limit_by_blocks(self, max_steps: int) -> int:
        """Largest k <= max_steps whose new blocks fit in the free blocks."""
        free = self.pool.num_free_blocks
        block_size = self.config.block_size
        slots = [(r.num_computed_tokens, len(r.block_ids) * block_size) for r in self.running]

        def blocks_for(k: int) -> int:
            return sum(max(0, -(-(c + k - held) // block_size)) for c, held in slots)

        if blocks_for(max_steps) <= free:
            return max_steps
        low, high = 0, max_steps  # blocks_for(low) fits, blocks_for(high) does not
        while high - low > 1:
            mid = (low + high) // 2
            if blocks_for(mid) <= free:
                low = mid
            else:
                high = mid
        return low

    # ---------------------------------------------------------------- output
    def _finish_output(self, scheduled: list, preempted: list[int],
                       action: ElasticAction | None) -> SchedulerOutput:
        items = []
        prefill_chunks = []
        num_prefill = num_decode = decode_context = 0
        for req, num_new, new_blocks in scheduled:
            decode = _is_decode(req) and num_new == 1
            samples = req.num_computed_tokens + num_new == req.num_tokens
            items.append(ScheduledRequest(req.request_id, req.num_computed_tokens, num_new,
                                          tuple(new_blocks), decode, samples,
                                          new_table=new_blocks is req.block_ids))
            if decode:
                num_decode += 1
                decode_context += req.num_tokens
            else:
                num_prefill += num_new
                prefill_chunks.append((num_new, req.num_computed_tokens))
        oom = self._check_memory(num_prefill + num_decode, items)
        if oom is not None:
            items, num_prefill, num_decode, prefill_chunks, decode_context = [], 0, 0, [], 0
        return self._output(tuple(items), 1, num_prefill, num_decode, tuple(prefill_chunks),
                            decode_context, preempted, action, oom)

    def _check_memory(self, num_tokens: int, items: list[ScheduledRequest]) -> OutOfMemory | None:
        num_rows = sum(1 for s in items if s.samples)
        needed, available = self.controller.activation_need(self.pool, num_tokens, num_rows)
        if needed <= available or not items:
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
            req = self.requests[request_id]
            if req.status is not RequestStatus.RUNNING:
                continue
            self.running.remove(req)
            self.pool.free(reversed(req.block_ids))
            req.block_ids = []
            req.status = RequestStatus.FAILED_OOM
            self._num_registered.pop(request_id, None)

    def _output(self, items, num_steps, num_prefill, num_decode, prefill_chunks,
                decode_context, preempted, action, oom) -> SchedulerOutput:
        num_rows = sum(1 for s in items if s.samples)
        needed, available = self.controller.activation_need(
            self.pool, num_prefill + num_decode, num_rows)
        if items:  # a step ran: its activations stay in the allocator's cache
            self.controller.note_step(needed)
        lent = self.pool.num_attached_elastic
        return SchedulerOutput(
            step_id=self._step_id, scheduled=items, num_steps=num_steps,
            num_prefill_tokens=num_prefill, num_decode_tokens=num_decode,
            prefill_chunks=prefill_chunks, decode_context_tokens=decode_context,
            preempted_ids=tuple(preempted), elastic=action, oom=oom,
            activation_bytes=needed, activation_available_bytes=available,
            num_used_blocks=self.pool.num_used_blocks,
            num_usable_blocks=self.pool.num_usable_blocks, num_lent_blocks=lent,
            num_sampled_rows=num_rows,
        )

    # ---------------------------------------------------------------- update
    def update(self, out: SchedulerOutput, end_s: float) -> list[RequestState]:
        """Close a step that ended at `end_s`; return the requests that finished in it."""
        finished = []
        for item in out.scheduled:
            req = self.requests[item.request_id]
            if req.status is not RequestStatus.RUNNING:
                continue
            req.num_computed_tokens += item.num_new_tokens * out.num_steps
            if self.config.enable_prefix_caching and req.block_hashes and not item.is_decode:
                self._register_full_blocks(req)
            if not item.samples:
                continue
            req.num_output_tokens += out.num_steps
            if req.first_token_s is None:
                req.first_token_s = end_s
            if req.num_output_tokens >= req.max_output_tokens:
                self._finish(req, end_s)
                finished.append(req)
        return finished

    def _finish(self, req: RequestState, end_s: float) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_s = end_s
        self.running.remove(req)
        self.pool.free(reversed(req.block_ids))
        req.block_ids = []
        self._block_keys.pop(req.request_id, None)
        self._num_registered.pop(req.request_id, None)


def _is_decode(req: RequestState) -> bool:
    return req.num_output_tokens > 0 and req.num_uncomputed_tokens == 1
