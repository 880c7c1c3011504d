"""A request's prompt token ids, consistent with the trace's prefix block hashes.

The engine runs random weights on synthetic prompts, so token ids are made up; what matters
is that they are made up consistently. A prefix-cache hit hands a request KV blocks another
request wrote: that KV equals what recomputing would write only if both requests have the
same token ids there. So the ids under a block hash depend on that hash alone (two prompts
that share hash j share its ids), and the ids past the hashed blocks on the request alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_HASH_STREAM = 1  # keeps a hash's seed apart from a request id's: (seed, 1, hash) vs (seed, id)


class PromptError(RuntimeError):
    """A request's prompt ids cannot match the KV blocks the scheduler gave it."""


@dataclass(frozen=True)
class PromptSpec:
    """What fixes a request's prompt ids: its length and, from a trace with prefix hashes,
    one hash per `hash_block_tokens` prompt tokens (Mooncake's hash_ids)."""

    num_tokens: int
    block_hashes: tuple[int, ...] | None = None
    hash_block_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.block_hashes and not (self.hash_block_tokens or 0) > 0:
            raise ValueError("block hashes need hash_block_tokens >= 1 (tokens per hash)")


def prompt_token_ids(spec: PromptSpec, request_id: int, vocab_size: int,
                     seed: int = 0) -> list[int]:
    """The prompt's token ids: those under hash j are the first ids of hash j's own seeded
    sequence, so two prompts sharing a hash share its tokens (and a prefix-cache hit reads
    the KV recomputing would write); tokens past the hashed blocks come from the request's
    own seed."""
    ids = np.empty(spec.num_tokens, dtype=np.int64)
    num_hashed = 0
    if spec.block_hashes:
        per_hash = spec.hash_block_tokens
        assert per_hash is not None  # checked by PromptSpec
        for start, block_hash in zip(range(0, spec.num_tokens, per_hash), spec.block_hashes):
            rng = np.random.default_rng((seed, _HASH_STREAM, int(block_hash) % 2**64))
            num = min(per_hash, spec.num_tokens - start)
            ids[start:start + num] = rng.integers(0, vocab_size, per_hash)[:num]
            num_hashed = start + num
    own = np.random.default_rng((seed, request_id))
    ids[num_hashed:] = own.integers(0, vocab_size, spec.num_tokens - num_hashed)
    return ids.tolist()
