"""Vectorised ISO-8601 datetime parsing for the Azure traces.

Accepted per field (``[...]`` optional)::

    2023-11-16 18:17:03[.9799600][+00:00 | Z]
    0123456789012345678 <- fixed part, 19 bytes; 'T' may replace the space

Fractional digits beyond microseconds are truncated; a ``+HH:MM``/``-HH:MM`` offset is
subtracted so mixed zones still order correctly. The result is int64 microseconds since
the Unix epoch; rows that do not match come back flagged, so the caller can name the
first bad line.
"""

from __future__ import annotations

import numpy as np

from traces.numbers import DIGIT_0, DIGIT_9, DOT, byte_column

FIXED_WIDTH = 19
DIGIT_POSITIONS = (0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18)
SEPARATORS = {4: b"-", 7: b"-", 10: b" T", 13: b":", 16: b":"}
MAX_FRACTION_DIGITS = 12
US_PER_S = 1_000_000


def parse_datetimes_us(data, starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Microseconds since the epoch and an ok mask, one per ``[start, end)`` span."""
    lengths = ends - starts
    ok = lengths >= FIXED_WIDTH
    digits = {}
    for k in DIGIT_POSITIONS:
        byte = byte_column(data, starts, k)
        ok &= (byte >= DIGIT_0) & (byte <= DIGIT_9)
        digits[k] = byte - DIGIT_0
    for k, allowed in SEPARATORS.items():
        ok &= np.isin(byte_column(data, starts, k), list(allowed))

    def number(*positions: int) -> np.ndarray:
        value = np.zeros(starts.size, dtype=np.int64)
        for k in positions:
            value = value * 10 + digits[k]
        return value

    hour, minute, second = number(11, 12), number(14, 15), number(17, 18)
    ok &= (hour < 24) & (minute < 60) & (second < 61)
    days, days_ok = _epoch_days(number(0, 1, 2, 3), number(5, 6), number(8, 9), ok)
    micro, suffix_start = _fraction_us(data, starts, lengths)
    offset_s, suffix_ok = _zone_offset_s(data, starts, lengths, suffix_start)
    ok &= days_ok & suffix_ok
    seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_s
    return seconds * US_PER_S + micro, ok


def _epoch_days(year, month, day, ok) -> tuple[np.ndarray, np.ndarray]:
    """Days since 1970-01-01; rejects month 13 and day 31 of a 30-day month."""
    ok = ok & (month >= 1) & (month <= 12) & (day >= 1) & (day <= 31)
    year = np.where(ok, year, 1970)  # placeholders keep bad rows from overflowing
    month, day = np.where(ok, month, 1), np.where(ok, day, 1)
    month_start = (year - 1970).astype("datetime64[Y]").astype("datetime64[M]") + (month - 1)
    date = month_start.astype("datetime64[D]") + (day - 1)
    ok &= date.astype("datetime64[M]") == month_start
    return date.astype(np.int64), ok


def _fraction_us(data, starts, lengths) -> tuple[np.ndarray, np.ndarray]:
    """Microseconds from an optional ``.digits`` after the seconds, and where it ends."""
    has_dot = (lengths > FIXED_WIDTH) & (byte_column(data, starts, FIXED_WIDTH) == DOT)
    micro = np.zeros(starts.size, dtype=np.int64)
    count = np.zeros(starts.size, dtype=np.int64)
    in_run = has_dot.copy()
    for k in range(MAX_FRACTION_DIGITS):
        position = FIXED_WIDTH + 1 + k
        byte = byte_column(data, starts, position)
        in_run &= (position < lengths) & (byte >= DIGIT_0) & (byte <= DIGIT_9)
        if not in_run.any():
            break
        if k < 6:
            micro = np.where(in_run, micro * 10 + (byte - DIGIT_0), micro)
        count += in_run
    micro *= 10 ** (6 - np.minimum(count, 6))
    suffix_start = np.where(has_dot, FIXED_WIDTH + 1 + count, FIXED_WIDTH)
    return micro, suffix_start


def _zone_offset_s(data, starts, lengths, suffix_start) -> tuple[np.ndarray, np.ndarray]:
    """UTC offset from an optional ``Z`` or ``+HH:MM``/``-HH:MM`` suffix, and an ok mask."""
    suffix_length = lengths - suffix_start
    sign_byte = byte_column(data, starts, suffix_start)
    zulu = (suffix_length == 1) & (sign_byte == ord("Z"))
    signed = (suffix_length == 6) & np.isin(sign_byte, [ord("+"), ord("-")])
    signed &= byte_column(data, starts, suffix_start + 3) == ord(":")
    offset_digits = []
    for k in (1, 2, 4, 5):
        byte = byte_column(data, starts, suffix_start + k)
        signed &= (byte >= DIGIT_0) & (byte <= DIGIT_9)
        offset_digits.append(byte - DIGIT_0)
    hours = offset_digits[0] * 10 + offset_digits[1]
    minutes = offset_digits[2] * 10 + offset_digits[3]
    sign = np.where(sign_byte == ord("-"), -1, 1)
    offset_s = np.where(signed, sign * (hours * 3_600 + minutes * 60), 0)
    ok = (suffix_length == 0) | zulu | signed
    return offset_s, ok
