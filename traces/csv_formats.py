"""The CSV trace formats: Azure (2023 and 2024), BurstGPT and Vidur."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from traces.columns import ColumnParts, RawColumns
from traces.csvscan import CsvTable, csv_tables, header_columns, require_column
from traces.errors import TraceError, excerpt
from traces.numbers import parse_column
from traces.source import TextChunk, prepended
from traces.timestamps import US_PER_S, parse_datetimes_us


@dataclass(frozen=True)
class CsvFormat:
    """Which header columns hold arrival time and token counts, and how time is written."""

    name: str
    time_column: str
    prompt_column: str
    output_column: str
    time_is_datetime: bool  # False: plain seconds from trace start
    zero_output_means_failed: bool = False


CSV_FORMATS = {
    "azure": CsvFormat("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens", True),
    "burstgpt": CsvFormat(
        "burstgpt", "Timestamp", "Request tokens", "Response tokens", False,
        zero_output_means_failed=True,
    ),
    "vidur": CsvFormat(
        "vidur", "arrived_at", "num_prefill_tokens", "num_decode_tokens", False
    ),
}


def matches_header(spec: CsvFormat, columns: list[str]) -> bool:
    folded = {column.casefold() for column in columns}
    wanted = (spec.time_column, spec.prompt_column, spec.output_column)
    return all(name.casefold() in folded for name in wanted)


def read_csv_trace(path: str, chunks: Iterable[TextChunk], fmt: str) -> RawColumns:
    """Columns of a CSV trace read chunk by chunk; the first chunk starts with the header."""
    spec = CSV_FORMATS[fmt]
    chunks = iter(chunks)
    first = next(chunks)
    header_end = first.data.find(b"\n") + 1 or len(first.data)
    columns = header_columns(path, first.data[:header_end], first.first_line)
    indices = [require_column(path, columns, name, fmt, first.first_line)
               for name in (spec.time_column, spec.prompt_column, spec.output_column)]
    body = [TextChunk(first.data[header_end:], first.first_line + 1)]
    del first  # the body is a copy, and ``prepended`` lets go of it once read
    parts = ColumnParts()
    notes: list[str] = []
    origin_us: int | None = None
    for table in csv_tables(path, prepended(body, chunks), columns):
        if spec.time_is_datetime:
            arrival_s, origin_us = _datetime_column_s(table, indices[0], origin_us)
            if not notes:
                notes.append(f"time origin {table.text(0, indices[0])}")
        else:
            arrival_s = parse_column(table, indices[0], integer=False)
        parts.add(arrival_s=np.asarray(arrival_s, dtype=np.float64),
                  prompt_tokens=parse_column(table, indices[1], integer=True),
                  output_tokens=parse_column(table, indices[2], integer=True),
                  line_numbers=table.line_numbers)
    line_numbers = parts.join("line_numbers", np.int64)
    if line_numbers.size == 0:
        raise TraceError(path, "no data rows (the file is empty or holds only a header)",
                         fix="point at a trace file with at least one request row")
    return RawColumns(
        format=fmt,
        arrival_s=parts.join("arrival_s", np.float64),
        prompt_tokens=parts.join("prompt_tokens", np.int64),
        output_tokens=parts.join("output_tokens", np.int64),
        line_numbers=line_numbers,
        time_field=columns[indices[0]],
        prompt_field=columns[indices[1]],
        output_field=columns[indices[2]],
        zero_output_means_failed=spec.zero_output_means_failed,
        notes=notes,
    )


def _datetime_column_s(table: CsvTable, index: int, origin_us: int | None) -> tuple[np.ndarray, int]:
    """Seconds since ``origin_us`` (default: this table's first timestamp), and the origin."""
    starts, ends = table.spans(index)
    micros, ok = parse_datetimes_us(table.data, starts, ends)
    if not ok.all():
        row = int(np.flatnonzero(~ok)[0])
        raise TraceError(
            table.path,
            f"unparseable timestamp {excerpt(table.text(row, index))}",
            line=int(table.line_numbers[row]),
            field=table.columns[index],
            fix="write 'YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]', e.g. '2023-11-16 18:17:03.9799600'",
        )
    origin_us = int(micros[0]) if origin_us is None else origin_us
    return (micros - origin_us) / US_PER_S, origin_us
