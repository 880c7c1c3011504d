"""``load_trace``: read any supported trace file into a validated, column-wise ``Trace``.

Order of work: detect the format from the first non-blank line -> stream raw columns chunk
by chunk (``traces.source`` checks the bytes) -> check arrival times and token counts ->
handle BurstGPT failed rows -> check (or, when asked, fix) arrival order -> re-base the
first arrival to 0.0 -> window -> limit -> rate scale. Out-of-order timestamps are an error
unless ``sort=True``: silently reordering would hide a broken file. A window or limit that
leaves no request is an error too: an empty run would look like a finished one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from traces.bundled import resolve_trace_path
from traces.columns import RawColumns
from traces.csv_formats import CSV_FORMATS, matches_header, read_csv_trace
from traces.csvscan import header_columns
from traces.errors import TraceError, excerpt
from traces.mooncake import read_mooncake_trace
from traces.source import TextChunk, prepended, text_chunks
from traces.trace import Trace
from traces.validate import checked_order, checked_times, checked_tokens

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
    says how many there were. A window or limit that leaves no request is an error.
    """
    file_path = resolve_trace_path(path)
    name = str(file_path)
    columns = read_columns(file_path, fmt)
    trace = _build_trace(name, columns, sort=sort, drop_failed=drop_failed)
    del columns
    return cut_trace(trace, window_s=window_s, limit=limit).scaled(rate_scale)


def read_columns(path: Path, fmt: str | None = None, *, chunk_bytes: int | None = None) -> RawColumns:
    """A file's raw columns, streamed in chunks of about ``chunk_bytes`` (default: by size)."""
    name = str(path)
    chunks = text_chunks(path, chunk_bytes)
    try:
        leading, first_line = _first_line(chunks)
        if first_line is None:
            raise TraceError(name, "the file is empty (0 bytes or only blank lines)",
                             fix="point at a trace file with a header and request rows")
        header_line = leading[0].first_line
        fmt = _checked_format(name, fmt) if fmt else detect_format(name, first_line, header_line)
        stream = prepended(leading, chunks)
        if fmt == "mooncake":
            return read_mooncake_trace(name, stream)
        return read_csv_trace(name, stream, fmt)
    finally:
        chunks.close()


def cut_trace(trace: Trace, *, window_s: tuple[float, float] | None, limit: int | None) -> Trace:
    """``trace`` windowed then limited; raise when that leaves no request, naming the options."""
    if limit is not None and limit < 1:
        raise TraceError(trace.source or None, f"limit {limit} (--limit {limit}, limit=) keeps "
                         "no request", fix="pass a limit >= 1, or leave it out to keep all")
    if window_s is not None:
        windowed = trace.window(*window_s)
        if len(windowed) == 0:
            start_s, end_s = window_s
            span_s = float(trace.arrival_s[-1]) if len(trace) else 0.0
            raise TraceError(
                trace.source or None,
                f"window [{start_s:g}, {end_s:g}) s (--window {start_s:g}:{end_s:g}, "
                f"window_s=) holds no request; arrivals span 0 to {span_s:g} s",
                fix="pick a window inside that span (python -m traces describe shows it)",
            )
        trace = windowed
    if limit is not None:
        trace = trace.head(limit)
    return trace


def detect_format(path: str, first_line: bytes, line: int = 1) -> str:
    """The format named by the file's first non-blank line, file line ``line``: a CSV
    header, or ``{`` for Mooncake JSONL."""
    if first_line.lstrip().startswith(b"{"):
        return "mooncake"
    columns = header_columns(path, first_line, line)
    for fmt, spec in CSV_FORMATS.items():
        if matches_header(spec, columns):
            return fmt
    raise TraceError(path, f"unknown trace format; header columns found: {excerpt(columns)}",
                     line=line,
                     fix=f"pass the format explicitly (--format / fmt=), one of {list(FORMATS)}")


def _first_line(chunks: Iterator[TextChunk]) -> tuple[list[TextChunk], bytes | None]:
    """The chunks read so far, leading blank lines dropped, and the first line that is not
    blank (None: the file is all blank)."""
    for chunk in chunks:
        content = chunk.data.lstrip()
        if content:
            cut = chunk.data.rfind(b"\n", 0, len(chunk.data) - len(content)) + 1
            start = TextChunk(chunk.data[cut:], chunk.first_line + chunk.data.count(b"\n", 0, cut))
            return [start], content.split(b"\n", 1)[0]
    return [], None


def _checked_format(path: str, fmt: str) -> str:
    fmt = fmt.strip().lower()
    if fmt not in FORMATS:
        raise TraceError(path, f"unknown format {excerpt(fmt)}", fix=f"use one of {list(FORMATS)}")
    return fmt


def _build_trace(path: str, columns: RawColumns, *, sort: bool, drop_failed: bool) -> Trace:
    checked_times(path, columns)
    columns, failed, notes = checked_tokens(path, columns, drop_failed=drop_failed)
    order, order_notes = checked_order(path, columns, sort=sort)
    reorder = (lambda array: array[order]) if order_notes else (lambda array: array)
    arrival_s = reorder(columns.arrival_s)
    if arrival_s.size:
        arrival_s = arrival_s - arrival_s[0]
    hashes = columns.block_hashes
    if hashes is not None and order_notes:
        hashes = hashes.take(order)
    return Trace(
        arrival_s=arrival_s,
        prompt_tokens=reorder(columns.prompt_tokens),
        output_tokens=reorder(columns.output_tokens),
        block_hashes=hashes,
        hash_block_tokens=columns.hash_block_tokens,
        source=path,
        format=columns.format,
        notes=columns.notes + notes + order_notes,
        failed=None if failed is None else reorder(failed),
    )
