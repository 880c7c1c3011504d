"""Mooncake JSON-lines traces: ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``.

All lines are decoded by one ``json.loads`` over a bracketed, comma-joined buffer (several
times faster than a call per line); only when that fails does a per-line pass run, to
name the bad line. Each ``hash_ids`` entry names one 512-token prompt block, and equal
leading ids mean a shared prompt prefix.
"""

from __future__ import annotations

import gc
import json
from contextlib import contextmanager
from operator import itemgetter

import numpy as np

from traces.columns import RawColumns
from traces.errors import TraceError

HASH_BLOCK_TOKENS = 512
MS_PER_S = 1000.0
TIME_FIELD, PROMPT_FIELD, OUTPUT_FIELD, HASH_FIELD = (
    "timestamp", "input_length", "output_length", "hash_ids",
)


def read_mooncake_trace(path: str, raw: bytes) -> RawColumns:
    with _gc_paused():
        return _read_records(path, raw)


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


def _read_records(path: str, raw: bytes) -> RawColumns:
    records, line_numbers = _load_records(path, raw)
    arrival_ms = _numeric_field(path, records, line_numbers, TIME_FIELD, integer=False)
    prompt_tokens = _numeric_field(path, records, line_numbers, PROMPT_FIELD, integer=True)
    hashes, notes = None, []
    if HASH_FIELD in records[0]:
        hashes = _hash_field(path, records, line_numbers)
        notes = _hash_count_notes(hashes, prompt_tokens)
    return RawColumns(
        format="mooncake",
        arrival_s=arrival_ms / MS_PER_S,
        prompt_tokens=prompt_tokens,
        output_tokens=_numeric_field(path, records, line_numbers, OUTPUT_FIELD, integer=True),
        line_numbers=line_numbers,
        time_field=TIME_FIELD,
        prompt_field=PROMPT_FIELD,
        output_field=OUTPUT_FIELD,
        block_hashes=hashes,
        hash_block_tokens=HASH_BLOCK_TOKENS if hashes is not None else None,
        notes=notes,
    )


def _load_records(path: str, raw: bytes) -> tuple[list, np.ndarray]:
    lines = raw.replace(b"\r\n", b"\n").split(b"\n")
    line_numbers = np.flatnonzero(np.fromiter(map(len, lines), np.int64, len(lines))) + 1
    kept = [lines[i - 1] for i in line_numbers.tolist()]
    if not kept:
        raise TraceError(path, "no data rows (the file is empty)",
                         fix="point at a JSON-lines trace with at least one request")
    try:
        records = json.loads(b"[" + b",".join(kept) + b"]")
    except json.JSONDecodeError:
        records = None
    if records is None or len(records) != len(kept):
        records = [_decode_line(path, line, number) for line, number in zip(kept, line_numbers.tolist(), strict=True)]
    if set(map(type, records)) != {dict}:
        row = next(i for i, record in enumerate(records) if not isinstance(record, dict))
        raise TraceError(path, "each line must be one JSON object", line=int(line_numbers[row]),
                         fix='write {"timestamp": ..., "input_length": ..., "output_length": ...}')
    return records, line_numbers


def _decode_line(path: str, line: bytes, line_number: int):
    try:
        records = json.loads(b"[" + line + b"]")
    except json.JSONDecodeError as error:
        raise TraceError(path, f"invalid JSON ({error.msg} at column {error.colno - 1})",
                         line=int(line_number), fix="write one JSON object per line") from None
    if len(records) != 1:
        raise TraceError(path, "more than one JSON value on a line", line=int(line_number),
                         fix="write one JSON object per line")
    return records[0]


def _field_values(records: list[dict], name: str) -> list:
    """The ``name`` value of every record; None where a record lacks it."""
    try:
        return list(map(itemgetter(name), records))  # C-speed when every record has it
    except KeyError:
        return [record.get(name) for record in records]


def _numeric_field(path, records, line_numbers, name: str, *, integer: bool) -> np.ndarray:
    values = _field_values(records, name)
    if not set(map(type, values)) <= {int, float}:
        row = next(i for i, value in enumerate(values) if type(value) not in (int, float))
        problem = (f"missing field '{name}'" if values[row] is None
                   else f"non-numeric {'token count' if integer else 'timestamp'} {values[row]!r}")
        raise TraceError(path, problem, line=int(line_numbers[row]), field=name,
                         fix=f"give every line a numeric '{name}'")
    floats = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(floats)
    if integer:
        bad |= floats != np.round(floats)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise TraceError(path, f"not a finite {'whole ' if integer else ''}number: {values[row]!r}",
                         line=int(line_numbers[row]), field=name,
                         fix=f"write a finite {'whole ' if integer else ''}number")
    return floats.astype(np.int64) if integer else floats


def _hash_field(path, records, line_numbers) -> list[tuple[int, ...]]:
    values = _field_values(records, HASH_FIELD)
    if set(map(type, values)) != {list}:
        row = next(i for i, value in enumerate(values) if type(value) is not list)
        raise TraceError(path, f"'{HASH_FIELD}' must be a list of block ids, got {values[row]!r}",
                         line=int(line_numbers[row]), field=HASH_FIELD,
                         fix=f"give every line a '{HASH_FIELD}' list (or none on any line)")
    return list(map(tuple, values))


def _hash_count_notes(hashes: list[tuple[int, ...]], prompt_tokens: np.ndarray) -> list[str]:
    """Flag rows whose hash count is not ceil(prompt / 512); they are kept as given."""
    counts = np.fromiter(map(len, hashes), np.int64, len(hashes))
    expected = -(-prompt_tokens // HASH_BLOCK_TOKENS)
    mismatched = int((counts != expected).sum())
    if not mismatched:
        return []
    return [f"{mismatched} rows have a hash_ids count other than ceil(input_length / "
            f"{HASH_BLOCK_TOKENS}); kept as given"]
