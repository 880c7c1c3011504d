"""A step's items, and when a run of decode-only steps can be advanced as one event.

A run is a stretch of steps in which every running request decodes one token per step and
no scheduling decision can change: nobody is admitted, nobody finishes before its last step,
and every new block the run needs is free now. The scheduler emits such a run as one
`SchedulerOutput` with `num_steps` > 1; its figures are those of the single steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.core.request import RequestState
from sim.core.step import ScheduledRequest, new_tuple


def decode_run_bounds(running: Sequence[RequestState]) -> tuple[int, int] | None:
    """(most steps before a request finishes, sum of context tokens), or None unless every
    running request is decoding."""
    max_steps = None
    context_tokens = 0
    for r in running:
        num_tokens = r.num_prompt_tokens + r.num_output_tokens
        if r.num_output_tokens == 0 or num_tokens - r.num_computed_tokens != 1:
            return None
        left = r.max_output_tokens - r.num_output_tokens
        max_steps = left if max_steps is None or left < max_steps else max_steps
        context_tokens += num_tokens
    if max_steps is None:
        return None
    return max_steps, context_tokens


def steps_that_fit(running: Sequence[RequestState], num_free_blocks: int, block_size: int,
                   max_steps: int) -> int:
    """Largest k <= max_steps whose new blocks, over all running requests, are free now."""
    # a request's blocks already cover its computed tokens, so k more need <= ceil(k / size)
    if len(running) * -(-max_steps // block_size) <= num_free_blocks:
        return max_steps
    slots = [(r.num_computed_tokens, len(r.block_ids) * block_size) for r in running]

    def blocks_for(k: int) -> int:
        return sum(max(0, -(-(c + k - held) // block_size)) for c, held in slots)

    if blocks_for(max_steps) <= num_free_blocks:
        return max_steps
    low, high = 0, max_steps  # blocks_for(low) fits, blocks_for(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        if blocks_for(mid) <= num_free_blocks:
            low = mid
        else:
            high = mid
    return low


def allocate_run(running: Sequence[RequestState], num_steps: int, block_size: int,
                 allocate: Callable[[int], list[int] | None]) -> tuple[tuple, int]:
    """Give each running request the blocks `num_steps` more tokens need: the run's items
    (one token per step each, every one sampling), and the steps its new blocks wait before
    their first use, in all. A request's j-th new block (from 0) is first used at step
    `first + j x block_size` (1-based), the step after its tokens fill the blocks before.

    The run's blocks are taken in one allocation and dealt out from its end: while the pool's
    free base blocks cover it, each request gets the ids one allocation per request, in running
    order, would give it (such an allocation takes the stack's top blocks); past them (evicted
    cached blocks, lent elastic ones) the same blocks may go to other requests."""
    needs = [-(-(req.num_computed_tokens + num_steps) // block_size) - len(req.block_ids)
             for req in running]
    total = sum(needs)
    blocks = allocate(total) if total > 0 else []
    assert blocks is not None, "decode run horizon allowed too many blocks"
    items = []
    wait_steps = 0
    end = total
    for req, needed in zip(running, needs):
        num_computed = req.num_computed_tokens
        new_ids: tuple[int, ...] = ()
        if needed > 0:
            new_blocks = blocks[end - needed:end]
            end -= needed
            num_blocks = len(req.block_ids)
            req.block_ids += new_blocks
            new_ids = tuple(new_blocks)
            first = num_blocks * block_size - num_computed + 1
            wait_steps += needed * (first - 1) + block_size * needed * (needed - 1) // 2
        items.append(new_tuple(ScheduledRequest, (
            req.request_id, num_computed, 1, new_ids, True, True, False)))
    return tuple(items), wait_steps


def step_items(scheduled: list[tuple[RequestState, int, list[int]]]) -> tuple:
    """(items, prefill tokens, decode tokens, prefill chunks, decode context tokens, sampled
    rows) of one step whose (request, new tokens, new blocks) the scheduler picked; new
    blocks that are the request's whole table mark it admitted this step."""
    items = []
    prefill_chunks = []
    num_prefill = num_decode = decode_context = num_rows = 0
    for req, num_new, new_blocks in scheduled:
        num_computed = req.num_computed_tokens
        num_tokens = req.num_prompt_tokens + req.num_output_tokens
        decode = num_new == 1 and req.num_output_tokens > 0 and num_tokens - num_computed == 1
        samples = num_computed + num_new == num_tokens
        items.append(new_tuple(ScheduledRequest, (
            req.request_id, num_computed, num_new, tuple(new_blocks), decode, samples,
            new_blocks is req.block_ids)))
        num_rows += samples
        if decode:
            num_decode += 1
            decode_context += num_tokens
        else:
            num_prefill += num_new
            prefill_chunks.append((num_new, num_computed))
    return items, num_prefill, num_decode, prefill_chunks, decode_context, num_rows
