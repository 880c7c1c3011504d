"""Plain-data contracts between the scheduler and an executor (simulated or real GPU).

As in vLLM v1, `SchedulerOutput` says only what to run; how full the pool is and what the
step costs in activation memory travel apart in `SchedulerStats` (`Scheduler.make_stats`),
so an executor never has to read, or rewrite, bookkeeping to run a step.

The records are named tuples: immutable like a frozen dataclass, but built in a fraction of
the time (a frozen dataclass sets each field through object.__setattr__, which compiled code
cannot shortcut), and the simulator builds one per scheduled request per step and one per
elastic attach or detach (an hour of a trace has tens of thousands).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

# A named tuple built straight from its fields' tuple, as its own __new__ would build it
# without the call through Python: one per scheduled request per step adds up.
new_tuple = tuple.__new__


class ScheduledRequest(NamedTuple):
    request_id: int
    num_computed_tokens: int  # KV already cached before this step: position of the first new token
    num_new_tokens: int  # tokens computed this step (per step, for a decode run)
    new_block_ids: tuple[int, ...]  # appended to the request's block table before the step runs
    is_decode: bool  # exactly one new token that is the latest sampled output
    samples: bool  # this step reaches the end of the known tokens, so one token is sampled
    new_table: bool = False  # admitted this step: new_block_ids is the whole block table


class ElasticActionKind(enum.Enum):
    ATTACH = "attach"
    DETACH = "detach"
    DRAIN_WAIT = "drain_wait"  # stop lending new elastic blocks; detach once they empty


class ElasticAction(NamedTuple):
    kind: ElasticActionKind
    num_handles: int
    duration_s: float  # VMM driver time (map + set access, or unmap); migration copy is separate
    preempted_ids: tuple[int, ...] = ()  # drain victims preempted by recompute
    migrations: tuple[tuple[int, int], ...] = ()  # (elastic block, base block) copies to run
    migrated_bytes: int = 0
    num_blocks: int = 0  # ATTACH: the first num_blocks elastic blocks become usable
    # Must the step in flight (async scheduling) end before this action runs? An attach
    # always waits (release mode hands torch's cache back, which waits for the device), a
    # drain-wait never does (nothing to do on the device), and a detach only when the step
    # scheduled before it held elastic blocks (its kernels may still read or write them).
    needs_idle_device: bool = True


class OutOfMemory(NamedTuple):
    """A step whose activations do not fit in what the KV pool left unlent."""

    needed_bytes: int
    available_bytes: int
    failed_ids: tuple[int, ...]


class SchedulerOutput(NamedTuple):
    """What to run: the requests of one step (or of a run of identical decode steps)."""

    step_id: int
    scheduled: tuple[ScheduledRequest, ...]
    num_steps: int  # > 1 only for a fast-forwarded run of identical decode-only steps
    num_prefill_tokens: int
    num_decode_tokens: int
    prefill_chunks: tuple[tuple[int, int], ...]  # (new tokens, cached prefix tokens) per prefill
    decode_context_tokens: int  # sum of decode rows' context lengths at the run's first step
    preempted_ids: tuple[int, ...]
    elastic: ElasticAction | None
    oom: OutOfMemory | None  # the step was not run: its requests failed (overcommit)
    num_sampled_rows: int = 0

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_decode_only(self) -> bool:
        return self.num_prefill_tokens == 0 and self.num_decode_tokens > 0


class SchedulerStats(NamedTuple):
    """Pool usage and activation need of one scheduled step, as it was scheduled (after its
    blocks were allocated, before `update` frees finished requests' blocks)."""

    step_id: int
    num_running_reqs: int
    num_waiting_reqs: int
    num_used_blocks: int
    num_usable_blocks: int  # base blocks plus the elastic blocks attached now
    num_lent_blocks: int  # elastic blocks mapped into the KV pool (0 when detached)
    activation_bytes: int  # activation peak this step needs
    activation_available_bytes: int  # reserve not lent to the KV pool at this step
    # A decode run takes every block its steps need at its first step, so num_used_blocks is
    # its last step's count; its new blocks wait this many steps in all before their first
    # use: KV use over the run, step by step, is num_used_blocks less those block-steps.
    run_block_wait_steps: int = 0
