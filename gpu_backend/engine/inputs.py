"""Executor-side request state and the host arrays of one forward pass.

The executor sees only `SchedulerOutput`s, as vLLM's worker does, so it keeps its own mirror
of every running request's block table and token ids:

    new_table      replace the table with new_block_ids (admitted or re-admitted)
    otherwise      extend it with new_block_ids
    migrations     rewrite elastic ids to their base targets (before the step runs)
    preempted      drop the table, keep the tokens (recompute prefills them again)
    finished/OOM   drop both

Under async scheduling (`EngineConfig.async_scheduling`) a step is built while the one before
it still runs, so a request that samples in that step has its next input id on the device
only: `launched` names those requests, and `build` marks their rows (`HostBatch.pending_rows`
and `pending_sources`: the row in the launched step's sampled ids) for the runner to fill on
the device. `append_sampled` brings the host tokens up once the step is collected.

A request admitted with prefix-cache hits arrives with `num_computed_tokens` > 0 and a table
whose first blocks another request wrote. Their KV is right only if both requests have the
same token ids there, so prompt ids follow the trace's block hashes (`prompt_token_ids`): the
ids under a hash depend on that hash alone, the rest on the request. Shared blocks need no
care here beyond that: the pool counts their references, and a table only names them.

Core block ids are shifted by `block_id_offset` on the device: the executor's pool keeps its
first block(s) as a scratch block that padded rows of a CUDA-graph batch write into, so the
scheduler never hands it out. `check_usable` refuses any table that points at or beyond the
scheduler pool's usable blocks (`SchedulerStats.num_usable_blocks`: a detached elastic range
must never be touched).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from gpu_backend.engine.block_tables import BlockTables
from gpu_backend.engine.prompts import PromptError, PromptSpec, prompt_token_ids
from sim.core.step import ScheduledRequest, SchedulerOutput

if TYPE_CHECKING:
    from gpu_backend.batch import HostLens

T = TypeVar("T")
SCRATCH_BLOCK_ID = 0  # device block id of the scratch block (core ids are shifted past it)


class BlockTableError(RuntimeError):
    """A block table would point at a block the pool does not hold right now."""


def decode_rows_first(items: Sequence[T], num_new: Callable[[T], int]) -> list[T]:
    """`items` with those of one new token (decode rows) first, each group in its order."""
    return [x for x in items if num_new(x) == 1] + [x for x in items if num_new(x) != 1]


def leading_decodes(query_lens: np.ndarray) -> int:
    """How many rows of one new token lead the batch (all of them: a decode-only step)."""
    others = np.flatnonzero(query_lens != 1)
    return int(others[0]) if others.size else len(query_lens)


def token_layout(lens: np.ndarray, starts: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each row's new tokens sit in a step, from each row's new tokens (`lens`) and
    computed tokens (`starts`), both [S] int64: query_start_loc ([S+1] int32), each token's
    row ([T]) and each token's position in its sequence ([T] int64)."""
    query_start_loc = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=query_start_loc[1:], dtype=np.int32)
    row_of_token = np.repeat(np.arange(len(lens)), lens)  # [T]
    # token t of row r sits at starts[r] + (t - query_start_loc[r])
    positions = (np.arange(int(lens.sum()), dtype=np.int64)
                 + (starts - query_start_loc[:-1])[row_of_token])  # [T]
    return query_start_loc, row_of_token, positions


@dataclass
class HostBatch:
    """One forward pass as host arrays (numpy); `to_device` packs them into one copy."""

    request_ids: list[int]  # [S] scheduled requests, in batch order (real rows only)
    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64, device slot = block_id * block_size + offset
    block_tables: np.ndarray  # [S, max_blocks] int32, device block ids
    seq_lens: np.ndarray  # [S] int32, context length after this step
    query_start_loc: np.ndarray  # [S+1] int32
    logits_indices: np.ndarray  # [R] int64, token rows that sample
    sample_request_ids: list[int]  # [R] request of each sampled row
    max_query_len: int
    max_seq_len: int
    num_decodes: int = 0  # leading rows of one new token (decode rows come first)
    # token rows whose id is a sampled id of the step launched before this one (still on the
    # device: async scheduling), and which of that step's sampled rows each takes
    pending_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pending_sources: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.request_ids)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1 and self.num_seqs > 0

    def host_lens(self) -> HostLens:
        """The lengths (and block tables) the split and flashinfer attention backends launch
        by (`ForwardBatch.host_lens`): this batch's own arrays, no copy."""
        from gpu_backend.batch import HostLens  # torch's side; this module stays numpy-only

        return HostLens(query_start_loc=self.query_start_loc, seq_lens=self.seq_lens,
                        block_tables=self.block_tables)


class RequestMirror:
    """Block tables and token ids of the requests the executor knows, keyed by request id."""

    def __init__(self, vocab_size: int, block_size: int, *, block_id_offset: int = 1,
                 seed: int = 0, keep_outputs: bool = False) -> None:
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.block_id_offset = block_id_offset
        self.seed = seed
        self.tables = BlockTables()  # core block ids
        self.tokens: dict[int, list[int]] = {}  # prompt then sampled ids
        self.keep_outputs = keep_outputs
        self.outputs: dict[int, list[int]] = {}  # finished requests' prompt + sampled ids
        self._prompts: dict[int, PromptSpec] = {}  # added, not yet scheduled
        self._in_flight: dict[int, int] = {}  # request -> its row in the launched step's ids

    # ------------------------------------------------------------------ updates
    def add_prompt(self, request_id: int, spec: PromptSpec) -> None:
        """Fix a request's prompt before it is scheduled (needed for prefix hashes)."""
        self._prompts[request_id] = spec

    def apply(self, out: SchedulerOutput, prompt_len: dict[int, int]) -> None:
        """Bring the tables up to the state `out` describes (before its forward runs).

        A request's prompt comes from `add_prompt`, else from `prompt_len` (no hashes)."""
        if out.elastic is not None and out.elastic.migrations:
            self._migrate(dict(out.elastic.migrations))
        for request_id in out.preempted_ids:
            self.tables.pop(request_id, None)
        if out.oom is not None:
            self.drop(out.oom.failed_ids)
        for item in out.scheduled:
            if item.new_table:
                self.tables[item.request_id] = item.new_block_ids
            else:
                self.tables.extend(item.request_id, item.new_block_ids)
            if item.request_id not in self.tokens:
                self.tokens[item.request_id] = self._first_prompt(item, prompt_len)

    def _first_prompt(self, item, prompt_len: dict[int, int]) -> list[int]:
        spec = self._prompts.pop(item.request_id, None)
        if spec is None:
            spec = PromptSpec(prompt_len[item.request_id])
        if item.num_computed_tokens and not spec.block_hashes:
            raise PromptError(
                f"request {item.request_id} was admitted with {item.num_computed_tokens} "
                "prefix-cached tokens, but its prompt ids were not derived from its block "
                "hashes, so the cached KV belongs to other tokens: give the mirror its "
                "PromptSpec (add_prompt) before it is scheduled")
        return prompt_token_ids(spec, item.request_id, self.vocab_size, self.seed)

    def _migrate(self, moves: dict[int, int]) -> None:
        self.tables.remap(moves)

    def launched(self, sample_request_ids: Sequence[int]) -> None:
        """A step was launched and is not collected yet: its sampled ids stay on the device
        until then, and the next step's rows that need them say where to take them from."""
        self._in_flight = {r: i for i, r in enumerate(sample_request_ids)}

    def append_sampled(self, request_ids: list[int], token_ids: Iterable[int], *,
                       known_only: bool = False) -> None:
        """Add each request's sampled id to its tokens. `known_only`: skip the requests
        dropped since the step was launched (under async scheduling, a later step's
        out-of-memory or preemption may come first)."""
        tokens = self.tokens
        for request_id, token_id in zip(request_ids, token_ids, strict=True):
            if known_only and request_id not in tokens:
                continue
            tokens[request_id].append(int(token_id))

    def finish(self, request_ids: Iterable[int]) -> None:
        """Forget finished requests (keeping their token ids when keep_outputs is set)."""
        request_ids = list(request_ids)
        for request_id in request_ids:
            tokens = self.tokens.get(request_id)
            if self.keep_outputs and tokens is not None:
                self.outputs[request_id] = tokens
        self.drop(request_ids)

    def drop(self, request_ids: Iterable[int]) -> None:
        for request_id in request_ids:
            self.tables.pop(request_id, None)
            self.tokens.pop(request_id, None)
            self._prompts.pop(request_id, None)

    # ------------------------------------------------------------------- checks
    def check_usable(self, request_ids: Iterable[int], num_usable_blocks: int) -> None:
        """Raise unless every table of `request_ids` stays below `num_usable_blocks`."""
        for request_id in request_ids:
            largest = self.tables.max_id(request_id)
            if largest >= num_usable_blocks:
                raise BlockTableError(
                    f"request {request_id}'s block table holds block {largest} but the pool "
                    f"holds only {num_usable_blocks} usable blocks now (the elastic range "
                    "beyond is detached); running it would touch unmapped memory")

    # ------------------------------------------------------------------- batch
    def build(self, out: SchedulerOutput, num_usable_blocks: int) -> HostBatch:
        """Host arrays of `out`'s forward pass (one step; decode runs are not executed).
        `num_usable_blocks`: the pool's usable blocks at this step (`SchedulerStats`)."""
        if out.num_steps != 1:
            raise ValueError("the GPU executor runs one step per schedule(); got a decode run")
        self.check_usable((s.request_id for s in out.scheduled), num_usable_blocks)
        # decode rows (one new token) first, as the attention of a mixed step expects
        items = decode_rows_first(out.scheduled, lambda s: s.num_new_tokens)
        lens = np.array([s.num_new_tokens for s in items], dtype=np.int64)  # [S]
        starts = np.array([s.num_computed_tokens for s in items], dtype=np.int64)  # [S]
        query_start_loc, row_of_token, positions = token_layout(lens, starts)
        input_ids, pending_rows, pending_sources = self._input_ids(items, out.step_id)
        tables = self._table_array([s.request_id for s in items])  # [S, max_blocks]
        block_ids = tables[row_of_token, positions // self.block_size]
        slot_mapping = block_ids.astype(np.int64) * self.block_size + positions % self.block_size
        sampled = [i for i, s in enumerate(items) if s.samples]
        logits_indices = query_start_loc[1:][sampled].astype(np.int64) - 1  # [R]
        seq_lens = (starts + lens).astype(np.int32)  # [S]
        return HostBatch(
            request_ids=[s.request_id for s in items], input_ids=input_ids, positions=positions,
            slot_mapping=slot_mapping, block_tables=tables, seq_lens=seq_lens,
            query_start_loc=query_start_loc, logits_indices=logits_indices,
            sample_request_ids=[items[i].request_id for i in sampled],
            max_query_len=int(lens.max()) if len(items) else 0,
            max_seq_len=int(seq_lens.max()) if len(items) else 0,
            num_decodes=leading_decodes(lens),
            pending_rows=pending_rows, pending_sources=pending_sources,
        )

    def _input_ids(self, items: Sequence[ScheduledRequest], step_id: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The step's token ids in row order ([T] int64), and where a row's last id is the
        launched step's sample (async scheduling): its token row, left 0 here, and that id's
        row in the launched step's sampled ids (each [P] int64)."""
        flat: list[int] = []
        pending_rows: list[int] = []
        pending_sources: list[int] = []
        for s in items:
            tokens = self.tokens[s.request_id]
            end = s.num_computed_tokens + s.num_new_tokens
            flat += tokens[s.num_computed_tokens:end]
            if end > len(tokens):  # its last id is the launched step's sample
                source = self._in_flight.get(s.request_id)
                if source is None or end != len(tokens) + 1:
                    raise RuntimeError(
                        f"request {s.request_id}: step {step_id} reads tokens up to "
                        f"{end} but {len(tokens)} are known and the launched step samples "
                        f"{'one more' if source is not None else 'none'} for it")
                pending_rows.append(len(flat))
                pending_sources.append(source)
                flat.append(0)  # filled on the device from the launched step's ids
        return (np.array(flat, dtype=np.int64), np.array(pending_rows, dtype=np.int64),
                np.array(pending_sources, dtype=np.int64))

    def _table_array(self, request_ids: list[int]) -> np.ndarray:
        """[S, longest table] int32 device ids; rows padded with the scratch block."""
        width = max((self.tables.length(r) for r in request_ids), default=1) or 1
        array = np.full((len(request_ids), width), SCRATCH_BLOCK_ID, dtype=np.int32)
        self.tables.fill_rows(array, request_ids, self.block_id_offset)
        return array
