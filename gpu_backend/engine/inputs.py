"""Executor-side request state and the host arrays of one forward pass.

The executor sees only `SchedulerOutput`s, as vLLM's worker does, so it keeps its own mirror
of every running request's block table and token ids:

    new_table      replace the table with new_block_ids (admitted or re-admitted)
    otherwise      extend it with new_block_ids
    migrations     rewrite elastic ids to their base targets (before the step runs)
    preempted      drop the table, keep the tokens (recompute prefills them again)
    finished/OOM   drop both

Core block ids are shifted by `block_id_offset` on the device: the executor's pool keeps its
first block(s) as a scratch block that padded rows of a CUDA-graph batch write into, so the
scheduler never hands it out. `check_usable` refuses any table that points at or beyond the
scheduler pool's usable blocks (a detached elastic range must never be touched).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from sim.core.step import SchedulerOutput

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

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.request_ids)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1 and self.num_seqs > 0


class RequestMirror:
    """Block tables and token ids of the requests the executor knows, keyed by request id."""

    def __init__(self, vocab_size: int, block_size: int, *, block_id_offset: int = 1,
                 seed: int = 0, keep_outputs: bool = False) -> None:
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.block_id_offset = block_id_offset
        self.seed = seed
        self.tables: dict[int, list[int]] = {}  # core block ids
        self.tokens: dict[int, list[int]] = {}  # prompt then sampled ids
        self.keep_outputs = keep_outputs
        self.outputs: dict[int, list[int]] = {}  # finished requests' prompt + sampled ids

    # ------------------------------------------------------------------ updates
    def apply(self, out: SchedulerOutput, prompt_len: dict[int, int]) -> None:
        """Bring the tables up to the state `out` describes (before its forward runs)."""
        if out.elastic is not None and out.elastic.migrations:
            self._migrate(dict(out.elastic.migrations))
        for request_id in out.preempted_ids:
            self.tables.pop(request_id, None)
        if out.oom is not None:
            self.drop(out.oom.failed_ids)
        for item in out.scheduled:
            if item.new_table:
                self.tables[item.request_id] = list(item.new_block_ids)
            else:
                self.tables[item.request_id].extend(item.new_block_ids)
            if item.request_id not in self.tokens:
                self.tokens[item.request_id] = self._prompt(item.request_id,
                                                            prompt_len[item.request_id])

    def _migrate(self, moves: dict[int, int]) -> None:
        for table in self.tables.values():
            for i, block_id in enumerate(table):
                if block_id in moves:
                    table[i] = moves[block_id]

    def _prompt(self, request_id: int, num_tokens: int) -> list[int]:
        rng = np.random.default_rng((self.seed, request_id))
        return rng.integers(0, self.vocab_size, num_tokens).tolist()

    def append_sampled(self, request_ids: list[int], token_ids: Iterable[int]) -> None:
        for request_id, token_id in zip(request_ids, token_ids, strict=True):
            self.tokens[request_id].append(int(token_id))

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

    # ------------------------------------------------------------------- checks
    def check_usable(self, request_ids: Iterable[int], num_usable_blocks: int) -> None:
        """Raise unless every table of `request_ids` stays below `num_usable_blocks`."""
        for request_id in request_ids:
            table = self.tables[request_id]
            if table and max(table) >= num_usable_blocks:
                raise BlockTableError(
                    f"request {request_id}'s block table holds block {max(table)} but the pool "
                    f"holds only {num_usable_blocks} usable blocks now (the elastic range "
                    "beyond is detached); running it would touch unmapped memory")

    # ------------------------------------------------------------------- batch
    def build(self, out: SchedulerOutput) -> HostBatch:
        """Host arrays of `out`'s forward pass (one step; decode runs are not executed)."""
        if out.num_steps != 1:
            raise ValueError("the GPU executor runs one step per schedule(); got a decode run")
        self.check_usable((s.request_id for s in out.scheduled), out.num_usable_blocks)
        # decode rows (one new token) first, as the attention of a mixed step expects
        items = decode_rows_first(out.scheduled, lambda s: s.num_new_tokens)
        lens = np.array([s.num_new_tokens for s in items], dtype=np.int64)  # [S]
        starts = np.array([s.num_computed_tokens for s in items], dtype=np.int64)  # [S]
        query_start_loc = np.zeros(len(items) + 1, dtype=np.int32)
        np.cumsum(lens, out=query_start_loc[1:], dtype=np.int32)
        positions = np.concatenate([np.arange(c, c + n) for c, n in zip(starts, lens)]
                                   or [np.zeros(0, np.int64)]).astype(np.int64)  # [T]
        input_ids = np.concatenate(
            [self.tokens[s.request_id][s.num_computed_tokens:s.num_computed_tokens + s.num_new_tokens]
             for s in items] or [[]]).astype(np.int64)  # [T]
        tables = self._table_array([self.tables[s.request_id] for s in items])  # [S, max_blocks]
        row_of_token = np.repeat(np.arange(len(items)), lens)  # [T]
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
        )

    def _table_array(self, tables: list[list[int]], width: int | None = None) -> np.ndarray:
        """[S, width] int32 device ids; rows padded with the scratch block."""
        width = width or max((len(t) for t in tables), default=1) or 1
        array = np.full((len(tables), width), SCRATCH_BLOCK_ID, dtype=np.int32)
        for row, table in enumerate(tables):
            array[row, :len(table)] = np.asarray(table, dtype=np.int32) + self.block_id_offset
        return array
