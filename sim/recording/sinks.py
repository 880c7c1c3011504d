"""Where a recorder's per-request rows and per-step timeline rows go as a run produces them.

A run of millions of requests cannot hold a row object per request and per step, so a
`ReplicaRecorder` hands rows out in blocks as they are made: requests as they finish (or are
rejected, or fail), steps every `TIMELINE_BLOCK_ROWS` steps. By default the timeline blocks are
kept in memory (`TimelineMemory`) and the request states in the recorder's own list; point the
recorder at `RequestCsv` and `TimelineCsv` to stream both to files instead. One sink may serve
every replica of a fleet: timeline rows carry the replica id, request rows their request id.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Protocol

import numpy as np

from sim.core.request import RequestState

REQUEST_COLUMNS = (
    "request_id", "arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
    "cached_tokens", "preemptions", "recomputed_tokens", "status", "reject_reason",
)
TIMELINE_COLUMNS = (
    "start_s", "duration_s", "num_steps", "prefill_tokens", "decode_tokens", "num_seqs",
    "kv_blocks_used", "kv_blocks_usable", "reserve_lent_blocks", "num_preempted", "oom",
)


def request_row(req: RequestState) -> tuple:
    """One request's REQUEST_COLUMNS: NaN for a time that never came, "" for no reason."""
    nan = math.nan
    return (
        req.request_id, req.arrival_s,
        nan if req.first_token_s is None else req.first_token_s,
        nan if req.finish_s is None else req.finish_s,
        req.num_prompt_tokens, req.num_output_tokens, req.num_cached_tokens,
        req.num_preemptions, req.num_recomputed_tokens, req.status.value,
        "" if req.reject_reason is None else req.reject_reason.value,
    )


class RequestSink(Protocol):
    def write(self, rows: list[tuple]) -> None:
        """Rows of REQUEST_COLUMNS, in the order the requests ended."""

    def close(self) -> None: ...


class TimelineSink(Protocol):
    def write(self, replica_id: int, rows: np.ndarray) -> None:
        """float64 [steps, len(TIMELINE_COLUMNS)] of one replica, in step order."""

    def close(self) -> None: ...


class RequestCsv:
    """Request rows appended to a CSV file (header first) as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("w", newline="")
        self._writer = csv.writer(self._file)
        self._writer.writerow(REQUEST_COLUMNS)

    def write(self, rows: list[tuple]) -> None:
        self._writer.writerows(rows)

    def close(self) -> None:
        self._file.close()


class TimelineCsv:
    """Timeline rows appended to a CSV file, with the replica id as the first column."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("w")
        self._file.write(",".join(("replica",) + TIMELINE_COLUMNS) + "\n")

    def write(self, replica_id: int, rows: np.ndarray) -> None:
        data = np.column_stack([np.full(len(rows), replica_id, dtype=np.float64), rows])
        np.savetxt(self._file, data, delimiter=",", fmt="%.9g")

    def close(self) -> None:
        self._file.close()


class TimelineMemory:
    """Timeline blocks kept in memory (the default: plots and validation read them back)."""

    def __init__(self) -> None:
        self.blocks: list[np.ndarray] = []

    def write(self, replica_id: int, rows: np.ndarray) -> None:
        self.blocks.append(rows)

    def close(self) -> None:
        pass

    def array(self) -> np.ndarray:
        if not self.blocks:
            return np.zeros((0, len(TIMELINE_COLUMNS)))
        if len(self.blocks) > 1:
            self.blocks = [np.concatenate(self.blocks)]
        return self.blocks[0]
