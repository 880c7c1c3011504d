"""One row per engine step: the `StepTable` and its steps.csv.

A `StepTable` holds one row per engine step (never a fast-forwarded run of steps): what the
step computed (prefill tokens and chunks, decode rows and their context) and how long it took,
measured on the GPU (`steps.csv`), or priced by the cost model (`validation.steps`).

steps.csv columns read (GPU engine; extra columns are ignored):

    step_id, num_prefill_tokens, num_decode_tokens, decode_context_tokens, num_seqs,
    measured_s                                    required
    prefill_chunks                                "new:prefix;new:prefix" per prefill chunk
                                                  (or a JSON list of pairs); without it the
                                                  prefill is priced as one chunk, no prefix
    num_sampled_rows, start_s, num_preempted,
    kv_blocks_used, kv_blocks_usable,
    reserve_lent_blocks, max_decode_context,
    build_s, enqueue_s, device_s                  optional (the last three: a step's phases)
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from validation.csv_rows import CsvRows, read_csv_rows

REQUIRED_COLUMNS = ("num_prefill_tokens", "num_decode_tokens", "decode_context_tokens",
                    "num_seqs")
DURATION_COLUMNS = ("measured_s", "duration_s", "step_s")
# Where a GPU step's time went (replays record it per step): host batch
# build, host enqueue (inputs staged, graph or kernels launched), device span (CUDA events).
PHASE_COLUMNS = ("build_s", "enqueue_s", "device_s")
OPTIONAL_COLUMNS = ("start_s", "num_preempted", "kv_blocks_used", "kv_blocks_usable",
                    "reserve_lent_blocks", "lent_blocks", "oom",
                    "max_decode_context",  # longest decode row's context (GPU runs since 2026-11-30)
                    *PHASE_COLUMNS)


# A step starts this much (relative, at least in seconds) after the step before it ended: more
# than the rounding of the clocks' sums, less than any idle gap or elastic pause.
EXPOSED_GAP_S = 1e-9


@dataclass(frozen=True)
class StepTable:
    """Column arrays, one element per engine step, in execution order."""

    num_prefill_tokens: np.ndarray  # int64 [S]
    num_decode_tokens: np.ndarray  # int64 [S]
    decode_context_tokens: np.ndarray  # int64 [S]: sum of decode rows' context lengths
    num_seqs: np.ndarray  # int64 [S]: scheduled requests
    num_sampled_rows: np.ndarray  # int64 [S]: rows that reach lm_head and sample
    prefill_pairs: np.ndarray  # float64 [S]: sum over chunks of new x (prefix + new / 2)
    duration_s: np.ndarray  # float64 [S]: measured (GPU) or predicted (simulator)
    chunks_exact: bool = True  # False: prefill chunk prefixes were unknown (priced as 0)
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # OPTIONAL_COLUMNS present
    # int64 [S]: the longest query (new tokens of one row) and the longest sequence after the
    # step, which decide whether a step's attention splits its keys (CostModel.splits); None:
    # unknown, no split priced
    max_query_len: np.ndarray | None = None
    max_seq_len: np.ndarray | None = None
    # object [S]: each step's prefill chunks, a tuple of (new tokens, prefix tokens), where the
    # steps recorded them: what a step running SPLIT is priced from (CostModel.split_chunks)
    prefill_chunks: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.duration_s.shape[0])

    @property
    def num_tokens(self) -> np.ndarray:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def has_prefill(self) -> np.ndarray:
        return self.num_prefill_tokens > 0

    @cached_property
    def longest_prefix(self) -> np.ndarray:
        """Per step, the longest cached prefix one of its chunks attends over (int64 [S]; 0
        where the table does not know its chunks' prefixes). Worked out once a table."""
        if self.prefill_chunks is None or not self.chunks_exact:
            return np.zeros(len(self), dtype=np.int64)
        return np.array([max((prefix for _, prefix in chunks or ()), default=0)
                         for chunks in self.prefill_chunks], dtype=np.int64)

    @property
    def start_s(self) -> np.ndarray | None:
        return self.extra.get("start_s")

    def exposed(self) -> np.ndarray:
        """Per step, whether it started later than the step before it ended (bool [S]): the
        first step, one after an idle gap or an elastic pause. Under async scheduling such a
        step has no step in flight to hide its host work behind (sim.engine). All False where
        the table has no start times."""
        start = self.start_s
        if start is None or not len(self):
            return np.zeros(len(self), dtype=bool)
        ends = start[:-1] + self.duration_s[:-1]
        gap = start[1:] - ends > EXPOSED_GAP_S * np.maximum(1.0, np.abs(ends))
        return np.concatenate(([True], gap))

    def take(self, index: np.ndarray | slice) -> StepTable:
        """The rows picked by `index` (a slice, bool mask or positions)."""
        arrays = {f.name: getattr(self, f.name)[index] for f in fields(self)
                  if isinstance(getattr(self, f.name), np.ndarray)}
        extra = {k: v[index] for k, v in self.extra.items()}
        return replace(self, **arrays, extra=extra)

    def with_durations(self, duration_s: np.ndarray) -> StepTable:
        return replace(self, duration_s=np.asarray(duration_s, dtype=np.float64))


def chunk_pairs(chunks: list[tuple[int, int]]) -> float:
    """Attention (query, key) pairs of causal prefill chunks, as the cost model counts them."""
    return float(sum(c * (p + c / 2.0) for c, p in chunks))


def parse_chunks(text: str) -> list[tuple[int, int]]:
    """`"512:0;512:512"` or `"[[512, 0], [512, 512]]"` -> [(512, 0), (512, 512)]."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        return [(int(c), int(p)) for c, p in json.loads(text)]
    pairs = []
    for item in text.replace("|", ";").split(";"):
        if item.strip():
            new, _, prefix = item.partition(":")
            pairs.append((int(new), int(prefix or 0)))
    return pairs


def format_chunks(chunks: list[tuple[int, int]]) -> str:
    return ";".join(f"{c}:{p}" for c, p in chunks)


def read_steps_csv(path: Path) -> StepTable:
    """The steps of a steps.csv (its columns: the module docstring); an empty table where the
    file has no rows. Raises ValueError naming the file where a required column is missing,
    and its line and field where a value is not what the column holds."""
    table = read_csv_rows(path)
    if not table.rows:
        empty = np.zeros(0, dtype=np.int64)
        return StepTable(empty, empty, empty, empty, empty, np.zeros(0), np.zeros(0))
    header = set(table.header)
    duration = _duration_column(path, header)
    prefill, decode = _ints(table, "num_prefill_tokens"), _ints(table, "num_decode_tokens")
    exact = "prefill_chunks" in header
    chunk_lists = _chunk_lists(table, prefill, exact)
    decode_ctx = _ints(table, "decode_context_tokens")
    if "max_decode_context" in header:
        longest_decode = _ints(table, "max_decode_context")
    else:  # the mean decode row: a lower bound of the longest
        longest_decode = -(-decode_ctx // np.maximum(decode, 1))
    max_query, max_seq = _step_extents(table, header, chunk_lists, decode, longest_decode)
    if "num_sampled_rows" in header:
        rows_sampled = _ints(table, "num_sampled_rows")
    else:  # one row per decode token and per prefill chunk
        rows_sampled = decode + np.array([len(c) for c in chunk_lists], dtype=np.int64)
    extra = {c: np.array(table.column(c)) for c in OPTIONAL_COLUMNS if c in header}
    recorded = np.empty(len(chunk_lists), dtype=object)
    recorded[:] = [tuple(chunks) for chunks in chunk_lists]
    pairs = np.array([chunk_pairs(c) for c in chunk_lists])
    return StepTable(prefill, decode, decode_ctx, _ints(table, "num_seqs"),
                     rows_sampled, pairs.astype(np.float64),
                     np.array(table.column(duration, _seconds, "a number of seconds >= 0")),
                     exact, extra,
                     max_query, max_seq, recorded if exact else None)


def _duration_column(path: Path, header: set[str]) -> str:
    """The first of DURATION_COLUMNS in `header`; ValueError naming `path` where it has none
    or lacks one of REQUIRED_COLUMNS."""
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    duration = next((c for c in DURATION_COLUMNS if c in header), None)
    if missing or duration is None:
        raise ValueError(f"{path}: missing columns {missing or list(DURATION_COLUMNS[:1])}; "
                         f"has {sorted(header)}")
    return duration


def _ints(table: CsvRows, name: str) -> np.ndarray:
    """Column `name` as int64 (a value written as a float is truncated); every value a count,
    so a negative one is refused."""
    return np.array(table.column(name, _count, "an integer >= 0"), dtype=np.int64)


def _count(text: str) -> int:
    value = int(float(text))
    if value < 0:
        raise ValueError(text)
    return value


def _seconds(text: str) -> float:
    """A step's measured time: a finite number >= 0 (a NaN would pass every comparison and
    turn the report's errors into NaN)."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


def _chunk_lists(table: CsvRows, prefill: np.ndarray,
                 exact: bool) -> list[list[tuple[int, int]]]:
    """Each step's prefill chunks, (new tokens, prefix tokens): the recorded prefill_chunks
    where `exact`, else one chunk of the step's prefill tokens, no prefix."""
    if exact:
        return table.column("prefill_chunks", parse_chunks,
                            "a list of new:prefix token counts (\"512:0;512:512\")")
    return [[(int(n), 0)] if n else [] for n in prefill]


def _step_extents(table: CsvRows, header: set[str],
                  chunk_lists: list[list[tuple[int, int]]], decode: np.ndarray,
                  longest_decode: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each step's longest query and longest sequence after it (int64 [S]): the columns
    write_steps_csv records, else from the GPU engine's columns, the longest chunk (at least
    1 where the step decodes) and the longest row after the step."""
    if {"max_query_len", "max_seq_len"} <= header:
        return _ints(table, "max_query_len"), _ints(table, "max_seq_len")
    max_query = np.array([max((c for c, _ in chunks), default=0)
                          for chunks in chunk_lists], dtype=np.int64)
    max_query = np.where(decode > 0, np.maximum(max_query, 1), max_query)
    max_seq = np.maximum(np.array([max((c + p for c, p in chunks), default=0)
                                   for chunks in chunk_lists], dtype=np.int64),
                         longest_decode)
    return max_query, max_seq


def write_steps_csv(path: Path, table: StepTable, chunks: list[str] | None = None) -> None:
    """Write a table in the GPU engine's steps.csv layout (`chunks`: formatted per row)."""
    columns = ["step_id", *REQUIRED_COLUMNS, "num_sampled_rows", "measured_s", *table.extra]
    extents = table.max_query_len is not None and table.max_seq_len is not None
    if extents:
        columns += ["max_query_len", "max_seq_len"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns + (["prefill_chunks"] if chunks is not None else []))
        for i in range(len(table)):
            row = [i + 1, int(table.num_prefill_tokens[i]), int(table.num_decode_tokens[i]),
                   int(table.decode_context_tokens[i]), int(table.num_seqs[i]),
                   int(table.num_sampled_rows[i]), repr(float(table.duration_s[i]))]
            row += [repr(float(v[i])) for v in table.extra.values()]
            if extents:
                assert table.max_query_len is not None and table.max_seq_len is not None
                row += [int(table.max_query_len[i]), int(table.max_seq_len[i])]
            writer.writerow(row + ([chunks[i]] if chunks is not None else []))
