"""Content keys of prompt blocks and the cached prefix of a waiting request (prefix caching).

A trace names a prompt's content by block hashes, one per `hash_block_tokens` tokens
(Mooncake's `hash_ids`). As in vLLM, a block's key covers its whole prefix: the key of hash j
chains every hash before it, so two prompts share a key only where they share the prefix up
to it. Each KV block (`block_size` tokens) of a hash block gets its own key.

Keys are small ints. A chain (the previous chain's id, a hash) is interned to an id the first
time it is seen (`ChainIds`), and a KV block's key is `chain_id * blocks_per_hash + sub_block`.
This is exact (no two different chains ever share an id) and hashes in constant time, where a
nested tuple's hash would cover its whole depth. The interning table grows with the distinct
prefixes of the trace (Mooncake's conversation trace: ~200k).

Keys and hits are numpy arrays: the pool looks a request's blocks up at once.

A request waiting at the head of the queue is looked up again at every step until it fits.
Its hits are kept while the pool's `cache_epoch` stands: after any eviction they are cut at
the first one no longer named by its key, and the blocks after them are looked up again only
once some block was named since, so a long wait costs a vectorised check of the hits at
most, not a walk of the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mypy_extensions import mypyc_attr

from sim.core.block_cache import EMPTY, Blocks, as_blocks
from sim.core.block_pool import BlockPool
from sim.core.request import RequestState


def first_chunk(req: RequestState, num_hits: int, budget: int,
                block_size: int) -> tuple[int, int]:
    """(tokens, new blocks) of a waiting request's first chunk when its first `num_hits`
    blocks come from the cache and the step has `budget` tokens left."""
    num_cached = num_hits * block_size
    num_new = min(req.num_prompt_tokens + req.num_output_tokens - num_cached, budget)
    return num_new, -(-(num_cached + num_new) // block_size) - num_hits


def _chain_keys(chains: list[int], blocks_per_hash: int) -> np.ndarray:
    """The keys of the blocks of `chains`, in order: chain c's are c x blocks_per_hash, and
    the blocks_per_hash after. A prompt's chains come in a few runs of consecutive ids (the
    ones a prompt adds are consecutive, and so are those an earlier prompt added), each run's
    keys one range."""
    parts = []
    i = 0
    while i < len(chains):
        first = end = chains[i]
        i += 1
        while i < len(chains) and chains[i] == end + 1:
            end += 1
            i += 1
        parts.append(np.arange(first * blocks_per_hash, (end + 1) * blocks_per_hash))
    if not parts:
        return EMPTY
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class ChainIds:
    """Interned ids of hash chains: chain (parent id, hash) gets id 1, 2, ... in the order
    first seen (0 is the empty prefix).

    The chains a prompt adds get consecutive ids, each the parent of the next, so a chain is
    first looked for as its parent's successor (`_parent`, `_hash` by id: two list reads).
    Only a chain whose parent is not the id just before it goes in a dict: by its hash
    alone, checked against its parent (a trace's hash usually ends one chain only, as
    Mooncake's name a block with its prefix), or by the pair when another chain with that
    hash came first. So a prompt costs one dict entry at most, however many chains it adds."""

    def __init__(self) -> None:
        self._parent: list[int] = [0]  # by id (index 0: the empty prefix)
        self._hash: list[int | None] = [None]  # by id: the hash that ends the chain
        self._by_hash: dict[int, int] = {}  # hash -> the first such chain with it
        self._by_pair: dict[tuple[int, int], int] = {}  # (parent, hash) -> the later ones

    def __len__(self) -> int:
        return len(self._parent) - 1

    def of(self, block_hashes: tuple[int, ...]) -> list[int]:
        """The chain id of each prefix of `block_hashes`, interning those never seen."""
        parent, hash_of, by_hash = self._parent, self._hash, self._by_hash
        num_ids = len(parent)
        chains: list[int] = []
        chain_id = 0
        for block_hash in block_hashes:
            child = chain_id + 1
            if child == num_ids or parent[child] != chain_id or hash_of[child] != block_hash:
                child = by_hash.get(block_hash, 0)
                if child and parent[child] != chain_id:
                    child = self._by_pair.get((chain_id, block_hash), 0)
                if not child:
                    break
            chains.append(child)
            chain_id = child
        else:
            return chains
        rest = block_hashes[len(chains):]
        if chain_id != num_ids - 1:  # the first new chain is not a successor: by dict
            if block_hashes[len(chains)] in by_hash:
                self._by_pair[chain_id, rest[0]] = num_ids
            else:
                by_hash[rest[0]] = num_ids
        new = range(num_ids, num_ids + len(rest))
        parent.append(chain_id)
        parent.extend(new[:-1])
        hash_of.extend(rest)
        chains.extend(new)
        return chains


@dataclass
class _Memo:
    """A waiting request's hits as last looked up, with the pool's epoch, eviction and naming
    counts then (no naming count: never looked up)."""

    request_id: int
    epoch: int
    num_evicted: int
    num_named: int | None
    hits: Blocks
    refused: tuple[int, int] | None = None  # (pool's freed blocks, new blocks) when refused


@dataclass
class _Table:
    """What the prefix cache keeps of a running request's block table, as arrays (so that
    naming and freeing a Mooncake prompt's thousands of blocks need no conversion from its
    list): its first `num_named` blocks, named (its hits, then what its steps filled), and
    after them the `num_fresh` it was allocated since, while each allocation followed on
    from the last. None: not kept (the table changed in place, or an allocation came from
    elsewhere); the list is then the record."""

    num_named: int
    named: list[Blocks] | None
    fresh: list[Blocks] | None
    num_fresh: int
    all_named: bool = True  # no block it registered found its key held elsewhere


@mypyc_attr(allow_interpreted_subclasses=True)  # tests check it against a subclass
class PrefixCache:
    def __init__(self, pool: BlockPool, block_size: int, hash_block_tokens: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.blocks_per_hash = hash_block_tokens // block_size
        self._chains = ChainIds()
        self._keys: dict[int, np.ndarray] = {}  # per live request
        self._tables: dict[int, _Table] = {}  # per running request
        self._memo: _Memo | None = None  # the last request looked up

    def keys(self, req: RequestState) -> np.ndarray:
        """Keys of the request's full prompt blocks named by its trace hashes."""
        found = self._keys.get(req.request_id)
        if found is None:
            per_hash = self.blocks_per_hash
            num_full = req.num_prompt_tokens // self.block_size
            chains = self._chains.of((req.block_hashes or ())[:-(-num_full // per_hash)])
            found = _chain_keys(chains, per_hash)[:num_full]
            self.pool.cover_keys((len(self._chains) + 1) * per_hash)  # ids 1..count
            self._keys[req.request_id] = found
        return found

    def hits(self, req: RequestState) -> Blocks:
        """Cached blocks holding the longest prefix of the request's prompt. The array is the
        prefix cache's own: read it, do not change it.

        At least the last prompt token is always computed, so the request samples."""
        keys = self.keys(req)
        max_hits = min(len(keys), (req.num_prompt_tokens + req.num_output_tokens - 1)
                       // self.block_size)
        pool = self.pool
        memo = self._memo
        if memo is None or memo.request_id != req.request_id or memo.epoch != pool.cache_epoch:
            memo = self._memo = _Memo(req.request_id, pool.cache_epoch, pool.num_evicted,
                                      None, EMPTY)
        elif memo.num_evicted != pool.num_evicted:  # cut at the first hit evicted since
            memo.num_evicted = pool.num_evicted
            kept = pool.num_still_named(memo.hits, keys[:len(memo.hits)])
            if kept < len(memo.hits):
                memo.hits = memo.hits[:kept]
                memo.refused = None
        # the keys after the hits missed last time; only a block named since can change that
        if len(memo.hits) < max_hits and memo.num_named != pool.num_named:
            memo.num_named = pool.num_named
            more = pool.cached_run(keys, len(memo.hits), max_hits)
            if len(more):
                memo.hits = np.concatenate((memo.hits, more)) if len(memo.hits) else more
                memo.refused = None
        return memo.hits

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

    def refused_before_lookup(self, req: RequestState, budget: int) -> bool:
        """`still_refused` known before the lookup: refused at its last check, and since then
        no block came free, none was named (so no hit can have been added) and the epoch
        stands. Evictions may have cut its hits, but fewer hits need no fewer new blocks, so
        the blocks it needs with the hits it had are a lower bound of what it needs now."""
        memo, pool = self._memo, self.pool
        if memo is None or memo.num_named != pool.num_named or memo.epoch != pool.cache_epoch:
            return False
        needed = first_chunk(req, len(memo.hits), budget, self.block_size)[1]
        return self.still_refused(req, needed)

    def refuse(self, req: RequestState, num_new_blocks: int) -> None:
        """The request's admission check failed needing `num_new_blocks` new blocks."""
        if self._memo is not None and self._memo.request_id == req.request_id:
            self._memo.refused = (self.pool.num_freed_blocks, num_new_blocks)

    def admitted(self, req: RequestState, num_hits: int, new_blocks: Blocks) -> None:
        """Its first `num_hits` blocks came from the cache (they are named already), the
        rest of its table is `new_blocks`."""
        named = []
        if num_hits:  # the table starts with them: as the lookup's array, where it is that
            memo = self._memo
            named.append(memo.hits if memo is not None and memo.request_id == req.request_id
                         and len(memo.hits) == num_hits else as_blocks(req.block_ids[:num_hits]))
        self._tables[req.request_id] = _Table(num_hits, named, [new_blocks], len(new_blocks))
        self._memo = None

    def allocated(self, req: RequestState, position: int, blocks: Blocks) -> None:
        """The request's table got `blocks` from `position` on (a chunk of its prompt)."""
        table = self._tables.get(req.request_id)
        if table is None or table.fresh is None:
            return
        if position == table.num_named + table.num_fresh:
            table.fresh.append(blocks)
            table.num_fresh += len(blocks)
        else:  # it got blocks in between that were not handed over
            table.fresh = None

    def register_full_blocks(self, req: RequestState) -> None:
        """Name the prompt blocks this step filled (those before were named already)."""
        keys = self.keys(req)
        num_full = min(len(keys), req.num_computed_tokens // self.block_size)
        table = self._tables.get(req.request_id)
        if table is None:
            table = self._tables[req.request_id] = _Table(0, None, None, 0)
        first = table.num_named
        if num_full > first:
            blocks = self._take_fresh(table, num_full - first)
            if blocks is None:
                blocks = as_blocks(req.block_ids[first:num_full])
            if self.pool.register(blocks, keys[first:num_full]) < len(blocks):
                table.all_named = False
            table.num_named = num_full
            if table.named is not None:
                table.named.append(blocks)

    def _take_fresh(self, table: _Table, count: int) -> Blocks | None:
        """The first `count` fresh blocks as one array, now named; None if not kept."""
        fresh = table.fresh
        if fresh is None or table.num_fresh < count:
            table.fresh = None
            return None
        joined = fresh[0] if len(fresh) == 1 else np.concatenate(fresh)
        table.fresh = [joined[count:]]
        table.num_fresh -= count
        return joined[:count]

    def blocks_tail_first(self, req: RequestState) -> Blocks:
        """The request's blocks, last first, as `BlockPool.free` takes them: the arrays its
        table is kept as, only the rest (its decode steps' blocks) converted from its list."""
        split = self._split_tail_first(req)
        if split is None:
            return as_blocks(req.block_ids[::-1])
        return np.concatenate(split)

    def table_tail_first(self, req: RequestState) -> tuple[Blocks, Blocks] | None:
        """The request's blocks, last first, as `BlockPool.free_table` takes them: those past
        its named ones, then its named ones (hits and what it named, all still named: held
        blocks keep their keys); None unless its table is kept as arrays and every block
        it registered was named."""
        table = self._tables.get(req.request_id)
        if table is None or not table.all_named:
            return None
        return self._split_tail_first(req)

    def _split_tail_first(self, req: RequestState) -> tuple[Blocks, Blocks] | None:
        """(its blocks past the named ones, its named ones), each last first, from the
        arrays kept (each one contiguous: the pool indexes with them, and numpy's fast path
        wants that); None if not kept."""
        table = self._tables.get(req.request_id)
        if table is None or table.named is None:
            return None
        fresh = table.fresh if table.fresh is not None else []
        covered = table.num_named + (table.num_fresh if table.fresh is not None else 0)
        rest = as_blocks(req.block_ids[covered:][::-1])
        own = np.concatenate([rest] + [part[::-1] for part in fresh[::-1] if len(part)]) \
            if table.num_fresh and table.fresh is not None else rest
        named = np.concatenate([part[::-1] for part in table.named[::-1]]) \
            if table.named else EMPTY
        return own, named

    def table_changed(self, request_id: int) -> None:
        """The request's table was rewritten in place (its blocks migrated): what was kept
        of it as arrays no longer holds."""
        table = self._tables.get(request_id)
        if table is not None:
            table.named = table.fresh = None

    def reset(self, request_id: int) -> None:
        """The request lost its blocks (preempted, failed): none of them is named by it."""
        self._tables.pop(request_id, None)

    def forget(self, request_id: int) -> None:
        """The request is done: drop its keys."""
        self._keys.pop(request_id, None)
        self._tables.pop(request_id, None)
