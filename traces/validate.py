"""Checks shared by every format: token counts, arrival times, BurstGPT failed rows, order.

Each check is one vectorised comparison; only when it fails is the first offending row
located, so the error can name its line.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from traces.columns import RawColumns
from traces.errors import TraceError
from traces.limits import MAX_ABS_ARRIVAL_S, MAX_TOKENS_PER_REQUEST, TOKEN_FIX, too_many_tokens

MAX_LINES_LISTED = 5


def checked_tokens(
    path: str, columns: RawColumns, *, drop_failed: bool
) -> tuple[RawColumns, np.ndarray | None, list[str]]:
    """Columns with failed rows handled, the failed mask (kept rows only), and notes."""
    for tokens, field in ((columns.prompt_tokens, columns.prompt_field),
                          (columns.output_tokens, columns.output_field)):
        _raise_first(path, columns, tokens < 0, field, "negative token count", TOKEN_FIX)
        too_big = np.flatnonzero(tokens > MAX_TOKENS_PER_REQUEST)
        if too_big.size:
            row = int(too_big[0])
            raise too_many_tokens(path, int(columns.line_numbers[row]), field, str(tokens[row]))
    failed, notes = None, []
    if columns.zero_output_means_failed:
        columns, failed, notes = _handle_failed(path, columns, drop_failed=drop_failed)
    _raise_first(path, columns, columns.prompt_tokens == 0, columns.prompt_field,
                 "zero-length prompt", "every request needs >= 1 prompt token; remove the row")
    _raise_first(path, columns, columns.output_tokens == 0, columns.output_field,
                 "zero output tokens",
                 "every request must generate >= 1 token; remove the row")
    return columns, failed, notes


def checked_times(path: str, columns: RawColumns) -> None:
    """Arrival times must be finite and within ``MAX_ABS_ARRIVAL_S`` of the epoch."""
    bad = ~(np.abs(columns.arrival_s) <= MAX_ABS_ARRIVAL_S)  # NaN fails the comparison too
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise TraceError(
            path, f"arrival time {columns.arrival_s[row]:.6g} s is beyond "
                  f"{MAX_ABS_ARRIVAL_S:.0e} s: not a real arrival",
            line=int(columns.line_numbers[row]), field=columns.time_field,
            fix="write seconds (milliseconds for Mooncake) from the trace start or the epoch",
        )


def checked_order(path: str, columns: RawColumns, *, sort: bool) -> tuple[np.ndarray, list[str]]:
    """Row order by arrival, and notes: no notes means the rows are already in order."""
    arrival_s = columns.arrival_s
    backwards = np.flatnonzero(np.diff(arrival_s) < 0)
    if backwards.size == 0:
        return np.arange(arrival_s.size), []
    row = int(backwards[0]) + 1
    line = int(columns.line_numbers[row])
    if not sort:
        raise TraceError(
            path,
            f"timestamps out of order: {arrival_s[row]:.6f} s is earlier than "
            f"{arrival_s[row - 1]:.6f} s on line {int(columns.line_numbers[row - 1])}",
            line=line,
            field=columns.time_field,
            fix="pass sort=True (CLI: --sort) to sort requests by arrival time",
        )
    note = f"sorted by arrival: {backwards.size} rows arrived before their predecessor (first at line {line})"
    return np.argsort(arrival_s, kind="stable"), [note]


def _handle_failed(path, columns: RawColumns, *, drop_failed: bool):
    failed = columns.output_tokens == 0
    num_failed = int(failed.sum())
    if num_failed == 0:
        return columns, None, []
    lines = ", ".join(map(str, columns.line_numbers[failed][:MAX_LINES_LISTED].tolist()))
    more = ", ..." if num_failed > MAX_LINES_LISTED else ""
    what = f"{num_failed} failed rows (0 '{columns.output_field}') at lines {lines}{more}"
    if not drop_failed:
        kept = replace(columns, output_tokens=np.where(failed, 1, columns.output_tokens))
        note = f"kept {what} as 1-output-token requests flagged in Trace.failed"
        return kept, failed, [note]
    if num_failed == failed.size:
        raise TraceError(path, f"every row is a failed request ({what})",
                         fix="pass drop_failed=False to keep them")
    keep = ~failed
    dropped = replace(
        columns,
        arrival_s=columns.arrival_s[keep],
        prompt_tokens=columns.prompt_tokens[keep],
        output_tokens=columns.output_tokens[keep],
        line_numbers=columns.line_numbers[keep],
    )
    return dropped, None, [f"dropped {what}"]


def _raise_first(path, columns: RawColumns, bad: np.ndarray, field: str, problem: str, fix: str):
    if not bad.any():
        return
    row = int(np.flatnonzero(bad)[0])
    values = {columns.prompt_field: columns.prompt_tokens, columns.output_field: columns.output_tokens}
    raise TraceError(path, f"{problem} ({int(values[field][row])})",
                     line=int(columns.line_numbers[row]), field=field, fix=fix)
