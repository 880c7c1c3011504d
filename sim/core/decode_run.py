"""When a run of decode-only steps can be advanced as one event, and how long it may be.

A run is a stretch of steps in which every running request decodes one token per step and
no scheduling decision can change: nobody is admitted, nobody finishes before its last step,
and every new block the run needs is free now. The scheduler emits such a run as one
`SchedulerOutput` with `num_steps` > 1; its figures are those of the single steps.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.core.request import RequestState


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
