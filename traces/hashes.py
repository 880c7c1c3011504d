"""Prompt block hashes of a trace, stored flat: one int64 array plus row offsets.

A tuple of Python ints per request costs about 60 bytes per id, ten times the bytes the
ids take in a Mooncake file; one int64 per id keeps a loaded trace near the file's size.
Rows come back as tuples of ints (hashable, as the prefix cache needs) on access.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class BlockHashes(Sequence):
    """Row ``i`` is ``ids[offsets[i]:offsets[i + 1]]``, the block ids of request ``i``."""

    ids: np.ndarray  # int64 [total ids]
    offsets: np.ndarray  # int64 [N + 1], offsets[0] == 0, non-decreasing

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[int]]) -> BlockHashes:
        """From per-request id sequences, e.g. ``[(0, 1, 2), (0, 3)]``."""
        rows = [tuple(row) for row in rows]
        counts = np.fromiter(map(len, rows), np.int64, len(rows))
        ids = np.fromiter((block for row in rows for block in row), np.int64, int(counts.sum()))
        return cls.from_counts(ids, counts)

    @classmethod
    def from_counts(cls, ids: np.ndarray, counts: np.ndarray) -> BlockHashes:
        """From the flat ids and the number of ids of each row."""
        offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        if offsets[-1] != ids.size:
            raise ValueError(f"row counts add up to {int(offsets[-1])}, but there are {ids.size} ids")
        return cls(np.asarray(ids, dtype=np.int64), offsets)

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def __getitem__(self, row):  # type: ignore[override]
        if isinstance(row, slice):
            return self.take(np.arange(len(self))[row])
        index = range(len(self))[row]  # negative rows and bounds as a list has them
        return tuple(self.ids[self.offsets[index] : self.offsets[index + 1]].tolist())

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        ids, bounds = self.ids.tolist(), self.offsets.tolist()
        return (tuple(ids[start:end]) for start, end in zip(bounds[:-1], bounds[1:]))

    def counts(self) -> np.ndarray:
        """Number of ids of each row, int64 [N]."""
        return np.diff(self.offsets)

    def take(self, positions: np.ndarray) -> BlockHashes:
        """The rows at ``positions`` (int array), in that order."""
        counts = self.counts()[positions]
        starts = self.offsets[:-1][positions]
        new_offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=new_offsets[1:])
        shift = np.repeat(starts - new_offsets[:-1], counts)
        return BlockHashes(self.ids[np.arange(int(new_offsets[-1])) + shift], new_offsets)
