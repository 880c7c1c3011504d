"""Vectorised parsing of numbers and timestamps from byte spans of a CSV buffer.

Each parser walks the spans one byte column at a time (``k``-th byte of every field at
once), so the work is a few numpy operations per character position, not per row. Fields
the fast grammar does not cover (exponents, spaces) fall back to Python's ``float`` for
those rows only; a field neither path accepts raises ``TraceError`` on its own line.
"""

from __future__ import annotations

import math

import numpy as np

from traces.csvscan import CsvTable
from traces.errors import TraceError, excerpt
from traces.limits import MAX_TOKENS_PER_REQUEST, too_many_tokens

MAX_FAST_DIGITS = 18  # int64 holds any 18-digit mantissa
DIGIT_0, DIGIT_9, DOT, MINUS = 48, 57, 46, 45


def byte_column(data: np.ndarray, starts: np.ndarray, offset: np.ndarray | int) -> np.ndarray:
    """The byte at ``starts + offset`` of every row (clamped inside the buffer)."""
    return data[np.minimum(starts + offset, data.size - 1)].astype(np.int64)


def parse_column(table: CsvTable, index: int, *, integer: bool) -> np.ndarray:
    """Column ``index`` as int64 (``integer``) or float64; raise on the first bad field."""
    starts, ends = table.spans(index)
    mantissa, frac_digits, negative, ok = _parse_decimal(table.data, starts, ends)
    if integer:
        scale = 10 ** np.minimum(frac_digits, MAX_FAST_DIGITS)
        ok &= mantissa % scale == 0  # "12.0" is a whole number, "12.5" is not
        values = np.where(negative, -1, 1) * (mantissa // scale)
    else:
        values = np.where(negative, -1.0, 1.0) * mantissa / 10.0**frac_digits
    for row in np.flatnonzero(~ok).tolist():
        values[row] = _parse_slow(table, row, index, integer=integer)
    return values


def _parse_decimal(data, starts, ends):
    """Fields of the form ``-?digits[.digits]``: mantissa, fraction digits, sign, ok."""
    lengths = ends - starts
    mantissa = np.zeros(starts.size, dtype=np.int64)
    frac_digits = np.zeros(starts.size, dtype=np.int64)
    num_digits = np.zeros(starts.size, dtype=np.int64)
    seen_dot = np.zeros(starts.size, dtype=bool)
    negative = np.zeros(starts.size, dtype=bool)
    ok = lengths <= MAX_FAST_DIGITS
    width = min(int(lengths.max(initial=0)), MAX_FAST_DIGITS)
    for k in range(width):
        active = k < lengths
        byte = byte_column(data, starts, k)
        is_digit = active & (byte >= DIGIT_0) & (byte <= DIGIT_9)
        is_dot = active & (byte == DOT) & ~seen_dot
        is_minus = active & (byte == MINUS) if k == 0 else np.zeros_like(active)
        ok &= ~active | is_digit | is_dot | is_minus
        mantissa = np.where(is_digit, mantissa * 10 + (byte - DIGIT_0), mantissa)
        frac_digits += is_digit & seen_dot
        num_digits += is_digit
        seen_dot |= is_dot
        negative |= is_minus
    ok &= num_digits > 0
    return mantissa, frac_digits, negative, ok


def _parse_slow(table: CsvTable, row: int, index: int, *, integer: bool) -> float:
    text = table.text(row, index)
    name = table.columns[index]
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    line = int(table.line_numbers[row])
    overflowed = math.isinf(value) and "inf" not in text.lower()  # e.g. 500 digits
    if integer and (overflowed or math.isfinite(value) and abs(value) > MAX_TOKENS_PER_REQUEST):
        raise too_many_tokens(table.path, line, name, excerpt(text))  # before int64 overflows
    if integer and math.isfinite(value) and value.is_integer():
        return int(value)
    if not integer and math.isfinite(value):
        return value
    kind = "token count" if integer else "number"
    if math.isnan(value):
        problem = f"non-numeric {kind} {excerpt(text)}"
    elif overflowed:
        problem = f"{kind} {excerpt(text)} is out of range"
    elif math.isinf(value):
        problem = f"{kind} {excerpt(text)} is not finite"
    else:
        problem = f"{kind} {excerpt(text)} is not a whole number"
    want = "a whole number" if integer else "a finite number of seconds"
    raise TraceError(table.path, problem, line=line, field=name,
                     fix=f"write {want} in column '{name}'")
