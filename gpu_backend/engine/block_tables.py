"""The executor's block tables: each running request's core block ids (inputs.RequestMirror
keeps them; the step's table array is copied out of them row by row)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BlockTables:
    """Each request's block table (core block ids) as a growing int32 array, with its largest id.

    A step appends a few blocks per request; keeping the tables as arrays (capacity doubles)
    with their maxima makes a step's table array a row copy per request and the usable-blocks
    check one lookup per request. Python lists cost a conversion and a `max` over every block
    of every scheduled request each step: 3.8 ms of host time per step at 256 sequences of 8k
    tokens on a 2-core CPU (`benchmarks/host_build.py`), 6.4 ms on the H200 host.
    Reads return read-only views; write through `tables[id] = ids`, `extend`, `remap`.
    """

    def __init__(self) -> None:
        self._ids: dict[int, np.ndarray] = {}  # capacity >= length
        self._len: dict[int, int] = {}
        self._max: dict[int, int] = {}

    def __setitem__(self, request_id: int, block_ids: Sequence[int] | np.ndarray) -> None:
        ids = np.array(block_ids, dtype=np.int32)  # a copy: the caller keeps its own
        self._ids[request_id] = ids
        self._len[request_id] = len(ids)
        self._max[request_id] = int(ids.max()) if len(ids) else -1

    def extend(self, request_id: int, block_ids: Sequence[int]) -> None:
        if not len(block_ids):
            return
        n, new = self._len[request_id], np.asarray(block_ids, dtype=np.int32)
        ids = self._ids[request_id]
        if n + len(new) > len(ids):
            grown = np.empty(max(2 * len(ids), n + len(new), 8), dtype=np.int32)
            grown[:n] = ids[:n]
            self._ids[request_id] = ids = grown
        ids[n:n + len(new)] = new
        self._len[request_id] = n + len(new)
        self._max[request_id] = max(self._max[request_id], int(new.max()))

    def __getitem__(self, request_id: int) -> np.ndarray:
        view = self._ids[request_id][:self._len[request_id]]
        view.flags.writeable = False
        return view

    def length(self, request_id: int) -> int:
        return self._len[request_id]

    def max_id(self, request_id: int) -> int:
        """The table's largest block id (-1 when empty)."""
        return self._max[request_id]

    def pop(self, request_id: int, default=None):
        if request_id not in self._ids:
            return default
        table = self[request_id]
        del self._ids[request_id], self._len[request_id], self._max[request_id]
        return table

    def remap(self, moves: dict[int, int]) -> None:
        """Rewrite every id in `moves` to its target (migrated elastic blocks)."""
        if not moves:
            return
        old = np.fromiter(moves.keys(), dtype=np.int64, count=len(moves))
        new = np.fromiter(moves.values(), dtype=np.int64, count=len(moves))
        order = np.argsort(old)
        old, new = old[order], new[order]
        for request_id, ids in self._ids.items():
            table = ids[:self._len[request_id]]
            where = np.searchsorted(old, table)
            hit = (where < len(old)) & (old[np.minimum(where, len(old) - 1)] == table)
            if hit.any():
                table[hit] = new[where[hit]]
                self._max[request_id] = int(table.max())

    def fill_rows(self, out: np.ndarray, request_ids: Sequence[int], offset: int) -> None:
        """out[row, :len] = table + offset for each request, in order (the rest untouched)."""
        for row, request_id in enumerate(request_ids):
            n = self._len[request_id]
            np.add(self._ids[request_id][:n], offset, out=out[row, :n])

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self):
        return iter(self._ids)

    def keys(self):
        return self._ids.keys()

    def items(self):
        return ((request_id, self[request_id]) for request_id in self._ids)

    def values(self):
        return (self[request_id] for request_id in self._ids)
