"""The host-side plan of a step with prefill rows for SPLIT attention (split_attention.py):
which rows run where, each SPLIT sequence's padded parts, and the gather buffers they need.

    decode rows     the batch's leading `num_decodes` sequences (one new token each): the
                    Triton paged kernel's decode path, one launch
    paged runs      prefill sequences of fewer than `min_query_len` new tokens (the auto
                    backend: SPLIT_MIN_QUERY), one `PagedRun` per run of adjacent such rows:
                    the Triton paged kernel's prefill path, one launch each
    SPLIT rows      every other prefill sequence, one `PrefillSeq` each: its square (the
                    prefix's absorbed last keys and its own keys) and its prefix segments,
                    padded to the shapes `SplitShapes` allows (sim/core/split_shapes.py)

`plan_split` reads only the step's host lengths (numpy), so the engine makes the plan once per
step without waiting for the device, and every layer shares it. `SplitBuffers` sizes the
step's gather buffers from the plan (the largest square, rows and segment over its
sequences); split_attention.prepare_plan makes them, and the runs' offsets on the device,
from a layer's cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from sim.core.split_shapes import SdpaShape, SplitShapes

__all__ = ["PagedRun", "PrefillSeq", "SplitBuffers", "SplitPlan", "plan_split"]


@dataclass(frozen=True)
class PrefillSeq:
    """One SPLIT row of a step: q[query_start : query_start + query_len] are the sequence's
    positions prefix_len .. prefix_len + query_len - 1 (its row in block_tables: `row`).
    The square holds the prefix's last `absorbed` keys and the own keys, padded to
    `square_rows`; each of `segments` ((first key, keys)) runs `segment_rows` query rows."""
    row: int
    query_start: int
    query_len: int
    prefix_len: int
    absorbed: int
    square_rows: int
    segment_rows: int
    segments: tuple[tuple[int, int], ...]

    @property
    def query_rows(self) -> int:
        """Rows of the q buffer the sequence uses (the square's, and the segments' at row a)."""
        return max(self.square_rows, self.absorbed + self.segment_rows)

    def sdpa_shapes(self) -> list[SdpaShape]:
        return [SdpaShape(self.square_rows, self.square_rows, True),
                *(SdpaShape(self.segment_rows, n, False) for _, n in self.segments)]


@dataclass(frozen=True)
class PagedRun:
    """Adjacent prefill rows [first_row, end_row) (tokens [token_start, token_end)) run through
    the Triton paged kernel's prefill path in one launch; query_start_loc: its offsets from
    token_start ([rows + 1], host)."""
    first_row: int
    end_row: int
    token_start: int
    token_end: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: np.ndarray


@dataclass(frozen=True)
class SplitBuffers:
    """A step's gather buffers, shared by its sequences and layers: q [rows, H, D], the
    square's K and V [blocks, block_size, KVH, D], the segments' K and V (None without a
    prefix segment). Zeroed when made; every use leaves them finite."""
    q: Tensor
    square_k: Tensor
    square_v: Tensor
    segment_k: Tensor | None
    segment_v: Tensor | None

    @classmethod
    def for_plan(cls, plan: SplitPlan, cache: Tensor, num_heads: int) -> SplitBuffers:
        """The buffers `plan` needs, shaped like `cache` (a layer's K cache)."""
        block_size, tail = cache.shape[1], tuple(cache.shape[2:])
        if plan.shapes.min_segment_tokens % block_size:
            raise ValueError(f"segments of {plan.shapes.min_segment_tokens} keys: use a "
                             f"multiple of the cache's block size {block_size}")
        rows = max((s.query_rows for s in plan.seqs), default=0)
        square = max((s.square_rows for s in plan.seqs), default=0)
        segment = max((n for s in plan.seqs for _, n in s.segments), default=0)

        def zeros(*shape: int) -> Tensor:
            return torch.zeros(shape, dtype=cache.dtype, device=cache.device)

        square_blocks = -(-square // block_size)
        seg = (zeros(segment // block_size, block_size, *tail) if segment else None,
               zeros(segment // block_size, block_size, *tail) if segment else None)
        return cls(zeros(rows, num_heads, tail[1]), zeros(square_blocks, block_size, *tail),
                   zeros(square_blocks, block_size, *tail), *seg)

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in (self.q, self.square_k, self.square_v, self.segment_k,
                                      self.segment_v) if x is not None)


@dataclass(frozen=True)
class SplitPlan:
    """A step's SPLIT dispatch, made once per step on the host (shared by every layer)."""
    num_decodes: int  # leading decode rows (one new token each)
    decode_max_seq_len: int  # longest decode row (bounds the decode launch's key split)
    seqs: tuple[PrefillSeq, ...]  # through SPLIT
    runs: tuple[PagedRun, ...]  # through the Triton paged kernel's prefill path
    shapes: SplitShapes
    buffers: SplitBuffers | None = None  # None: made per call (prepare_plan)
    run_starts: tuple[Tensor, ...] | None = None  # runs' query_start_loc on the device

    @property
    def num_tokens(self) -> int:
        ends = [self.num_decodes] + [s.query_start + s.query_len for s in self.seqs]
        return max(ends + [r.token_end for r in self.runs])

    def sdpa_shapes(self) -> set[SdpaShape]:
        return {shape for s in self.seqs for shape in s.sdpa_shapes()}


def _prefill_seq(shapes: SplitShapes, row: int, query_start: int, query_len: int,
                 prefix_len: int) -> PrefillSeq:
    absorbed, segments = shapes.split_prefix(prefix_len)
    return PrefillSeq(row, query_start, query_len, prefix_len, absorbed,
                      shapes.square_rows(absorbed + query_len), shapes.segment_rows(query_len),
                      segments)


def _paged_runs(rows: list[int], qsl: np.ndarray, lens: np.ndarray) -> tuple[PagedRun, ...]:
    """Maximal runs of adjacent rows among `rows` (ascending), one PagedRun each."""
    runs, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i] != rows[i - 1] + 1:
            first, end = rows[start], rows[i - 1] + 1
            starts = (qsl[first:end + 1] - qsl[first]).astype(np.int32)
            runs.append(PagedRun(first, end, int(qsl[first]), int(qsl[end]),
                                 int(np.diff(starts).max()), int(lens[first:end].max()), starts))
            start = i
    return tuple(runs)


def plan_split(query_start_loc: np.ndarray, seq_lens: np.ndarray, num_decodes: int,
               shapes: SplitShapes | None = None, min_query_len: int = 1) -> SplitPlan:
    """The plan of a step from its host lengths: query_start_loc [S+1], seq_lens [S] (the
    context after the step). Prefill rows of fewer than `min_query_len` new tokens go to the
    Triton paged kernel; buffers and device tensors come with `prepare_plan`."""
    shapes = shapes or SplitShapes()
    qsl = np.asarray(query_start_loc, dtype=np.int64)
    lens = np.asarray(seq_lens, dtype=np.int64)
    if qsl.shape != (lens.shape[0] + 1,):
        raise ValueError(f"query_start_loc {qsl.shape} must have one more entry than "
                         f"seq_lens {lens.shape}")
    query_lens = np.diff(qsl)
    if not 0 <= num_decodes <= lens.shape[0] or np.any(query_lens[:num_decodes] != 1):
        raise ValueError(f"the first {num_decodes} rows must be decode rows (one new token), "
                         f"got query lengths {query_lens[:num_decodes].tolist()}")
    if np.any(query_lens > lens) or min_query_len < 1:
        raise ValueError("each row's new tokens must fit its context, and SPLIT rows must "
                         "have at least one")
    prefill = [row for row in range(num_decodes, lens.shape[0]) if query_lens[row] > 0]
    small = [row for row in prefill if query_lens[row] < min_query_len]
    seqs = tuple(_prefill_seq(shapes, row, int(qsl[row]), int(query_lens[row]),
                              int(lens[row] - query_lens[row]))
                 for row in prefill if query_lens[row] >= min_query_len)
    decode_max = int(lens[:num_decodes].max()) if num_decodes else 0
    return SplitPlan(num_decodes, decode_max, seqs, _paged_runs(small, qsl, lens), shapes)
