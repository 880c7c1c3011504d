"""``load_trace``: read any supported trace file into a validated, column-wise ``Trace``.

Order of work: detect format -> read raw columns -> check token counts -> handle BurstGPT
failed rows -> check (or, when asked, fix) arrival order -> re-base the first arrival to
0.0 -> window -> limit -> rate scale. Out-of-order timestamps are an error unless
``sort=True``: silently reordering would hide a broken file.
"""

from __future__ import annotations

from pathlib import Path

from traces.bundled import resolve_trace_path
from traces.columns import RawColumns
from traces.csv_formats import CSV_FORMATS, matches_header, read_csv_trace
from traces.csvscan import header_columns
from traces.errors import TraceError
from traces.mooncake import read_mooncake_trace
from traces.trace import Trace
from traces.validate import checked_order, checked_tokens

FORMATS = ("azure", "burstgpt", "mooncake", "vidur")


def load_trace(
    path: str | Path,
    fmt: str | None = None,
    *,
    sort: bool = False,
    window_s: tuple[float, float] | None = None,
    limit: int | None = None,
    rate_scale: float = 1.0,
    drop_failed: bool = True,
) -> Trace:
    """Load a trace file (or bundled trace name); ``fmt`` overrides format detection.

    ``drop_failed`` concerns BurstGPT rows with 0 response tokens (requests the service
    failed): True drops them; False keeps them as 1-output-token requests flagged in
    ``Trace.failed``, since their prompts still loaded the server. Either way ``notes``
    says how many there were.
    """
    file_path = resolve_trace_path(path)
    raw = file_path.read_bytes()
    name = str(file_path)
    fmt = _checked_format(name, fmt) if fmt else detect_format(name, raw)
    columns = read_mooncake_trace(name, raw) if fmt == "mooncake" else read_csv_trace(name, raw, fmt)
    trace = _build_trace(name, columns, sort=sort, drop_failed=drop_failed)
    if window_s is not None:
        trace = trace.window(*window_s)
    if limit is not None:
        trace = trace.head(limit)
    return trace.scaled(rate_scale)


def detect_format(path: str, raw: bytes) -> str:
    """The format named by the header (CSV) or first line (``{`` means Mooncake JSONL)."""
    if not raw.strip():
        raise TraceError(path, "the file is empty (0 bytes or only blank lines)",
                         fix="point at a trace file with a header and request rows")
    if raw.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        return "mooncake"
    columns = header_columns(raw)
    for fmt, spec in CSV_FORMATS.items():
        if matches_header(spec, columns):
            return fmt
    raise TraceError(path, f"unknown trace format; header columns found: {columns}", line=1,
                     fix=f"pass the format explicitly (--format / fmt=), one of {list(FORMATS)}")


def _checked_format(path: str, fmt: str) -> str:
    fmt = fmt.strip().lower()
    if fmt not in FORMATS:
        raise TraceError(path, f"unknown format '{fmt}'", fix=f"use one of {list(FORMATS)}")
    return fmt


def _build_trace(path: str, columns: RawColumns, *, sort: bool, drop_failed: bool) -> Trace:
    columns, failed, notes = checked_tokens(path, columns, drop_failed=drop_failed)
    order, order_notes = checked_order(path, columns, sort=sort)
    arrival_s = columns.arrival_s[order]
    if arrival_s.size:
        arrival_s = arrival_s - arrival_s[0]
    hashes = columns.block_hashes
    if hashes is not None and order_notes:
        hashes = [hashes[i] for i in order.tolist()]
    return Trace(
        arrival_s=arrival_s,
        prompt_tokens=columns.prompt_tokens[order],
        output_tokens=columns.output_tokens[order],
        block_hashes=hashes,
        hash_block_tokens=columns.hash_block_tokens,
        source=path,
        format=columns.format,
        notes=columns.notes + notes + order_notes,
        failed=None if failed is None else failed[order],
    )
