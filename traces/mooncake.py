"""Mooncake JSON-lines traces: ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``.

The file streams in text chunks (``traces.source``). A chunk's lines are decoded by one
``json.loads`` over a bracketed, comma-joined buffer (several times faster than a call per
line); only when that fails does a per-line pass run, to name the bad line. Each chunk's
records become numpy columns before the next chunk is read, so the dicts never pile up.

Each ``hash_ids`` entry names one 512-token prompt block, and equal leading ids mean a
shared prompt prefix. Either every line has a ``hash_ids`` list of integers or none has:
a trace where only some do would give some requests prefix caching and silently not others.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from traces.columns import ColumnParts, RawColumns
from traces.errors import TraceError, excerpt
from traces.hashes import BlockHashes
from traces.limits import MAX_TOKENS_PER_REQUEST, TOKEN_FIX, too_many_tokens
from traces.mooncake_hashes import HASH_FIELD, chunk_hash_ids, field_values
from traces.source import TextChunk

HASH_BLOCK_TOKENS = 512
MS_PER_S = 1000.0
TIME_FIELD, PROMPT_FIELD, OUTPUT_FIELD = "timestamp", "input_length", "output_length"
LINE_FIX = 'write one JSON object per line: {"timestamp": ..., "input_length": ..., "output_length": ...}'


@dataclass(frozen=True)
class HashPresence:
    """Whether the file's first record has ``hash_ids``, and that record's line."""

    has_hashes: bool
    first_line: int


def read_mooncake_trace(path: str, chunks: Iterable[TextChunk]) -> RawColumns:
    with _gc_paused():
        parts, presence = ColumnParts(), None
        for chunk in chunks:
            records, line_numbers = _chunk_records(path, chunk)
            if not records:
                continue
            if presence is None:
                presence = HashPresence(HASH_FIELD in records[0], int(line_numbers[0]))
            parts.add(
                arrival_ms=_numeric_field(path, records, line_numbers, TIME_FIELD, integer=False),
                prompt_tokens=_numeric_field(path, records, line_numbers, PROMPT_FIELD, integer=True),
                output_tokens=_numeric_field(path, records, line_numbers, OUTPUT_FIELD, integer=True),
                line_numbers=line_numbers,
            )
            ids_counts = chunk_hash_ids(path, chunk, records, line_numbers, presence.has_hashes,
                                        presence.first_line)
            if ids_counts is not None:
                parts.add(hash_ids=ids_counts[0], hash_counts=ids_counts[1])
            del records
    if presence is None:
        raise TraceError(path, "no data rows (the file is empty)",
                         fix="point at a JSON-lines trace with at least one request")
    return _columns(parts, presence.has_hashes)


def _columns(parts: ColumnParts, has_hashes: bool) -> RawColumns:
    prompt_tokens = parts.join("prompt_tokens", np.int64)
    hashes, notes = None, []
    if has_hashes:
        counts = parts.join("hash_counts", np.int64)
        hashes = BlockHashes.from_counts(parts.join("hash_ids", np.int64), counts)
        notes = _hash_count_notes(counts, prompt_tokens)
    return RawColumns(
        format="mooncake",
        arrival_s=parts.join("arrival_ms", np.float64) / MS_PER_S,
        prompt_tokens=prompt_tokens,
        output_tokens=parts.join("output_tokens", np.int64),
        line_numbers=parts.join("line_numbers", np.int64),
        time_field=TIME_FIELD,
        prompt_field=PROMPT_FIELD,
        output_field=OUTPUT_FIELD,
        block_hashes=hashes,
        hash_block_tokens=HASH_BLOCK_TOKENS if hashes is not None else None,
        notes=notes,
    )


@contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while millions of lists and dicts are created.

    None of them can form a cycle, yet each allocation burst triggers a full-generation
    scan; pausing halves the load time of a 1M-row file.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _chunk_records(path: str, chunk: TextChunk) -> tuple[list, np.ndarray]:
    """The chunk's JSON objects and their file lines; blank lines are skipped."""
    lines = chunk.data.split(b"\n")
    kept_rows = np.flatnonzero(np.fromiter(map(len, lines), np.int64, len(lines)))
    kept = [lines[i] for i in kept_rows.tolist()]
    del lines
    try:
        records = json.loads(b"[" + b",".join(kept) + b"]")
    except (ValueError, RecursionError):
        records = None
    line_numbers = kept_rows + chunk.first_line
    if records is None or len(records) != len(kept):
        records, line_numbers = _decode_lines(path, kept, line_numbers)
    if records and set(map(type, records)) != {dict}:
        row = next(i for i, record in enumerate(records) if not isinstance(record, dict))
        raise TraceError(path, f"each line must be one JSON object, not {excerpt(records[row])}",
                         line=int(line_numbers[row]), fix=LINE_FIX)
    return records, line_numbers


def _decode_lines(path: str, lines: list[bytes], line_numbers: np.ndarray) -> tuple[list, np.ndarray]:
    """One ``json.loads`` per line, to name the line that fails; whitespace lines skipped."""
    records, kept = [], []
    for line, number in zip(lines, line_numbers.tolist(), strict=True):
        if line.strip():
            records.append(_decode_line(path, line, number))
            kept.append(number)
    return records, np.asarray(kept, dtype=np.int64)


def _decode_line(path: str, line: bytes, line_number: int):
    try:
        records = json.loads(b"[" + line + b"]")
    except json.JSONDecodeError as error:
        raise TraceError(path, f"invalid JSON ({error.msg} at column {error.colno - 1})",
                         line=line_number, fix=LINE_FIX) from None
    except RecursionError:
        raise TraceError(path, "JSON nested too deeply to read", line=line_number,
                         fix=LINE_FIX) from None
    except ValueError as error:  # e.g. an integer of more than 4300 digits
        raise TraceError(path, f"unreadable JSON ({excerpt(str(error))})", line=line_number,
                         fix=LINE_FIX) from None
    if len(records) != 1:
        raise TraceError(path, "more than one JSON value on a line", line=line_number, fix=LINE_FIX)
    return records[0]


def _numeric_field(path, records, line_numbers, name: str, *, integer: bool) -> np.ndarray:
    values = field_values(records, name)
    kind = "token count" if integer else "timestamp"
    if not set(map(type, values)) <= {int, float}:
        row = next(i for i, value in enumerate(values) if type(value) not in (int, float))
        problem = (f"missing field '{name}'" if values[row] is None
                   else f"non-numeric {kind} {excerpt(values[row])}")
        raise TraceError(path, problem, line=int(line_numbers[row]), field=name,
                         fix=f"give every line a numeric '{name}'")
    try:
        floats = np.asarray(values, dtype=np.float64)
    except OverflowError:  # an integer beyond float64
        row = _first_beyond_float(values)
        if integer:
            raise too_many_tokens(path, int(line_numbers[row]), name, excerpt(values[row])) from None
        _raise_row(path, line_numbers, row, name, f"{kind} {excerpt(values[row])} is out of range")
    bad = ~np.isfinite(floats)
    if integer:
        bad |= floats != np.round(floats)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        _raise_row(path, line_numbers, row, name,
                   f"not a finite {'whole ' if integer else ''}number: {excerpt(values[row])}")
    if not integer:
        return floats
    too_big = np.abs(floats) > MAX_TOKENS_PER_REQUEST  # before int64 could overflow
    if too_big.any():
        row = int(np.flatnonzero(too_big)[0])
        raise too_many_tokens(path, int(line_numbers[row]), name, excerpt(values[row]))
    return floats.astype(np.int64)


def _first_beyond_float(values: list) -> int:
    for row, value in enumerate(values):
        try:
            float(value)
        except OverflowError:
            return row
    raise AssertionError("numpy could not convert values that each convert")


def _raise_row(path, line_numbers, row: int, name: str, problem: str):
    fix = TOKEN_FIX if name != TIME_FIELD else "write the arrival time in milliseconds"
    raise TraceError(path, problem, line=int(line_numbers[row]), field=name, fix=fix)


def _hash_count_notes(counts: np.ndarray, prompt_tokens: np.ndarray) -> list[str]:
    """Flag rows whose hash count is not ceil(prompt / 512); they are kept as given."""
    expected = -(-prompt_tokens // HASH_BLOCK_TOKENS)
    mismatched = int((counts != expected).sum())
    if not mismatched:
        return []
    return [f"{mismatched} rows have a hash_ids count other than ceil(input_length / "
            f"{HASH_BLOCK_TOKENS}); kept as given"]
