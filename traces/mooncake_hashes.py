"""Mooncake ``hash_ids``: one chunk's lists flattened to int64, or the line that breaks them.

The prefix cache hashes each request's ids, so an id must be a plain integer: a nested
list, a string, a float or a bool would load and then fail (or silently match) later.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import NoReturn

import numpy as np

from traces.errors import TraceError, excerpt
from traces.source import TextChunk

HASH_FIELD = "hash_ids"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
HASH_FIX = f"give every line a '{HASH_FIELD}' list of integers, or leave it out on every line"


def field_values(records: list[dict], name: str) -> list:
    """The ``name`` value of every record; None where a record lacks it."""
    try:
        return list(map(itemgetter(name), records))  # C-speed when every record has it
    except KeyError:
        return [record.get(name) for record in records]


def chunk_hash_ids(path: str, chunk: TextChunk, records: list[dict], line_numbers: np.ndarray,
                   has_hashes: bool, first_line: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(flat ids int64, ids per record int64) when the file has hashes; None when it has not.

    ``has_hashes`` and ``first_line`` describe the file's first record: every record
    must agree with it.
    """
    if not has_hashes:
        if b'"hash_ids"' in chunk.data:  # only then can a record hold the key
            row = next((i for i, record in enumerate(records) if HASH_FIELD in record), None)
            if row is not None:
                _raise(path, line_numbers, row,
                       f"'{HASH_FIELD}' here, but line {first_line} has none")
        return None
    values = field_values(records, HASH_FIELD)
    if set(map(type, values)) != {list}:
        row = next(i for i, value in enumerate(values) if type(value) is not list)
        problem = (f"no '{HASH_FIELD}' here, but line {first_line} has one"
                   if values[row] is None
                   else f"'{HASH_FIELD}' must be a list of integers, got {excerpt(values[row])}")
        _raise(path, line_numbers, row, problem)
    counts = np.fromiter(map(len, values), np.int64, len(values))
    flat = list(chain.from_iterable(values))
    ids = _int64_or_none(flat, maybe_bools=b"true" in chunk.data or b"false" in chunk.data)
    if ids is None:
        _raise_first_bad_id(path, values, line_numbers)
    return ids, counts


def _int64_or_none(flat: list, *, maybe_bools: bool) -> np.ndarray | None:
    """The ids as int64 when every one is an int in range; numpy's inferred dtype tells
    (floats, strings, lists and huge ints all infer something else), except for bools."""
    if not flat:
        return np.empty(0, dtype=np.int64)
    try:
        ids = np.array(flat)
    except (ValueError, TypeError):  # e.g. a list beside ints: an inhomogeneous shape
        return None
    if ids.dtype.kind != "i" or ids.ndim != 1:
        return None
    if maybe_bools and bool in set(map(type, flat)):
        return None
    return ids.astype(np.int64, copy=False)


def _raise_first_bad_id(path: str, values: list[list], line_numbers: np.ndarray) -> NoReturn:
    for row, ids in enumerate(values):
        for block_id in ids:
            if type(block_id) is not int:
                _raise(path, line_numbers, row,
                       f"'{HASH_FIELD}' must hold integers, found {excerpt(block_id)}")
            if not INT64_MIN <= block_id <= INT64_MAX:
                _raise(path, line_numbers, row,
                       f"block id {excerpt(block_id)} does not fit in 64 bits")
    raise AssertionError("numpy refused ids that each pass the check")


def _raise(path: str, line_numbers: np.ndarray, row: int, problem: str) -> NoReturn:
    raise TraceError(path, problem, line=int(line_numbers[row]), field=HASH_FIELD, fix=HASH_FIX)
