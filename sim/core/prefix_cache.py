"""Content keys of prompt blocks and the cached prefix of a waiting request (prefix caching).

A trace names a prompt's content by block hashes, one per `hash_block_tokens` tokens
(Mooncake's `hash_ids`). As in vLLM, a block's key covers its whole prefix: the key of hash j
chains every hash before it, so two prompts share a key only where they share the prefix up
to it. Each KV block (`block_size` tokens) of a hash block gets its own key.

Keys are small ints. A chain (the previous chain's id, a hash) is interned to an id the first
time it is seen, and a KV block's key is `chain_id * blocks_per_hash + sub_block`. This is
exact (no two different chains ever share an id) and, unlike a nested tuple, hashes in
constant time: the tuple chain's hash was recomputed from its whole depth on every lookup.
The interning table grows with the distinct prefixes of the trace (Mooncake's conversation
trace: ~300k, tens of MB).

A request waiting at the head of the queue is looked up again at every step until it fits.
Its hits are kept while the pool's `cache_epoch` stands: they are cut at the first one whose
key the pool evicted since (`take_dropped_keys`), and only the blocks after them are looked up
again, so a long wait costs the step's evictions, not the prompt's length.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.block_pool import BlockPool
from sim.core.request import RequestState


@dataclass
class _Memo:
    """A waiting request's hits as last looked up, and the index of each hit's key (built
    when first needed; it may hold keys past a cut, which the cut's bound ignores)."""

    request_id: int
    epoch: int
    hits: list[int]
    position: dict[int, int]
    refused: tuple[int, int] | None = None  # (pool's freed blocks, new blocks) when refused


class PrefixCache:
    def __init__(self, pool: BlockPool, block_size: int, hash_block_tokens: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.blocks_per_hash = hash_block_tokens // block_size
        self._chain_ids: dict[tuple[int, int], int] = {}
        self._keys: dict[int, list[int]] = {}  # per live request
        self._num_registered: dict[int, int] = {}  # prompt blocks already named, per request
        self._memo: _Memo | None = None  # the last request looked up

    def keys(self, req: RequestState) -> list[int]:
        """Keys of the request's full prompt blocks named by its trace hashes."""
        keys = self._keys.get(req.request_id)
        if keys is None:
            keys = []
            if req.block_hashes:
                per_hash = self.blocks_per_hash
                num_full = req.num_prompt_tokens // self.block_size
                chain_ids = self._chain_ids
                chain_id = 0
                for block_hash in req.block_hashes:
                    if len(keys) >= num_full:
                        break
                    link = (chain_id, block_hash)
                    chain_id = chain_ids.get(link, 0)
                    if not chain_id:
                        chain_id = chain_ids[link] = len(chain_ids) + 1
                    first = chain_id * per_hash
                    keys.extend(range(first, first + min(per_hash, num_full - len(keys))))
            self._keys[req.request_id] = keys
        return keys

    def hits(self, req: RequestState) -> list[int]:
        """Cached blocks holding the longest prefix of the request's prompt. The list is the
        prefix cache's own: read it, do not change it.

        At least the last prompt token is always computed, so the request samples."""
        keys = self.keys(req)
        max_hits = min(len(keys), (req.num_prompt_tokens + req.num_output_tokens - 1)
                       // self.block_size)
        pool = self.pool
        dropped = pool.take_dropped_keys()
        memo = self._memo
        if memo is None or memo.request_id != req.request_id or memo.epoch != pool.cache_epoch:
            memo = self._memo = _Memo(req.request_id, pool.cache_epoch, [], {})
        elif dropped and memo.hits:  # cut the hits at the first one evicted since
            if len(memo.position) < len(memo.hits):
                memo.position = dict(zip(keys[:len(memo.hits)], range(len(memo.hits))))
            gone = memo.position.keys() & dropped
            if gone:
                del memo.hits[min(map(memo.position.__getitem__, gone)):]
                memo.refused = None
        hits = memo.hits
        if len(hits) < max_hits:
            more = pool.cached_run(keys, len(hits), max_hits)
            if more:
                hits += more
                memo.refused = None
        return hits

    def still_refused(self, req: RequestState, num_new_blocks: int) -> bool:
        """Was the request refused at its last admission check, with nothing since that could
        let it in? Its hits are the same (`hits` was called), no block came free, and its
        chunk needs no fewer new blocks. Free blocks then only went down, and free hits only
        with them (a hit taken by another request is one free block less of both), so the
        check would fail again: it is not worth counting its free hits again."""
        memo = self._memo
        return (memo is not None and memo.request_id == req.request_id
                and memo.refused is not None and memo.refused[0] == self.pool.num_freed_blocks
                and num_new_blocks >= memo.refused[1])

    def refuse(self, req: RequestState, num_new_blocks: int) -> None:
        """The request's admission check failed needing `num_new_blocks` new blocks."""
        if self._memo is not None and self._memo.request_id == req.request_id:
            self._memo.refused = (self.pool.num_freed_blocks, num_new_blocks)

    def admitted(self, req: RequestState, num_hits: int) -> None:
        """Its first `num_hits` blocks came from the cache: they are named already."""
        self._num_registered[req.request_id] = num_hits
        self._memo = None

    def register_full_blocks(self, req: RequestState) -> None:
        """Name the prompt blocks this step filled (those before were named already)."""
        keys = self.keys(req)
        num_full = min(len(keys), req.num_computed_tokens // self.block_size)
        first = self._num_registered.get(req.request_id, 0)
        if num_full > first:
            self.pool.register(req.block_ids[first:num_full], keys[first:num_full])
            self._num_registered[req.request_id] = num_full

    def reset(self, request_id: int) -> None:
        """The request lost its blocks (preempted, failed): none of them is named by it."""
        self._num_registered.pop(request_id, None)

    def forget(self, request_id: int) -> None:
        """The request is done: drop its keys."""
        self._keys.pop(request_id, None)
        self._num_registered.pop(request_id, None)
