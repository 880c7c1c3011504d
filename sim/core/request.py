"""Per-request scheduling state, in the style of vLLM v1.

A request knows how many tokens exist (`num_tokens`: prompt plus the outputs sampled so far)
and how many of them already have KV in the cache (`num_computed_tokens`). Each step the
scheduler lets the computed count catch up by some number of tokens; there is no separate
prefill or decode phase. A step that brings `num_computed_tokens` up to `num_tokens` samples
one new token. Preemption by recompute resets the computed count to zero, so the prompt and
the outputs so far are prefilled again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"  # can never run: longer than max_model_len or the whole KV pool
    FAILED_OOM = "failed_oom"  # its step ran out of activation memory (overcommit policy)


class RejectReason(enum.Enum):
    """Why a request was refused on arrival: it could never run on this engine."""

    EXCEEDS_MAX_MODEL_LEN = "exceeds_max_model_len"  # prompt + output > max_model_len
    EXCEEDS_KV_POOL = "exceeds_kv_pool"  # its KV would need more blocks than a request can hold


@dataclass(slots=True, eq=False)
class RequestState:
    request_id: int
    arrival_s: float
    num_prompt_tokens: int
    max_output_tokens: int
    block_hashes: tuple[int, ...] | None = None
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    num_recomputed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    first_token_s: float | None = None
    finish_s: float | None = None
    reject_reason: RejectReason | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens that exist so far: the prompt plus the outputs sampled up to now."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def num_remaining_outputs(self) -> int:
        return self.max_output_tokens - self.num_output_tokens

    @property
    def is_finished(self) -> bool:
        return self.status in _DONE

    def blocks_needed(self, num_new_tokens: int, block_size: int) -> int:
        """KV blocks still to allocate so that `num_new_tokens` more tokens have slots."""
        num_slots = self.num_computed_tokens + num_new_tokens
        return max(0, -(-num_slots // block_size) - len(self.block_ids))


_DONE = frozenset({RequestStatus.FINISHED, RequestStatus.REJECTED, RequestStatus.FAILED_OOM})
