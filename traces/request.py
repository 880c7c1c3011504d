"""One inference request as the simulator and the GPU backend consume it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """A request arriving at ``arrival_s`` with a prompt to prefill and tokens to decode.

    ``block_hashes`` carries Mooncake's ``hash_ids``: one id per ``hash_block_tokens``
    prompt tokens (see ``Trace.hash_block_tokens``); two requests whose hashes start with
    the same ids share that prompt prefix, so a prefix cache could reuse its KV blocks.
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] | None = None
