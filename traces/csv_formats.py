"""The CSV trace formats: Azure (2023 and 2024), BurstGPT and Vidur."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.columns import RawColumns
from traces.csvscan import CsvTable, scan_csv
from traces.errors import TraceError
from traces.numbers import parse_column
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


def read_csv_trace(path: str, raw: bytes, fmt: str) -> RawColumns:
    spec = CSV_FORMATS[fmt]
    table = scan_csv(path, raw)
    time_index = table.require(spec.time_column, fmt)
    prompt_index = table.require(spec.prompt_column, fmt)
    output_index = table.require(spec.output_column, fmt)
    if spec.time_is_datetime:
        arrival_s, origin = _datetime_column_s(table, time_index)
        notes = [f"time origin {origin}"]
    else:
        arrival_s, notes = parse_column(table, time_index, integer=False), []
    return RawColumns(
        format=fmt,
        arrival_s=np.asarray(arrival_s, dtype=np.float64),
        prompt_tokens=parse_column(table, prompt_index, integer=True),
        output_tokens=parse_column(table, output_index, integer=True),
        line_numbers=table.line_numbers,
        time_field=table.columns[time_index],
        prompt_field=table.columns[prompt_index],
        output_field=table.columns[output_index],
        zero_output_means_failed=spec.zero_output_means_failed,
        notes=notes,
    )


def _datetime_column_s(table: CsvTable, index: int) -> tuple[np.ndarray, str]:
    """Seconds since the first row's timestamp, and that timestamp's text."""
    starts, ends = table.spans(index)
    micros, ok = parse_datetimes_us(table.data, starts, ends)
    if not ok.all():
        row = int(np.flatnonzero(~ok)[0])
        raise TraceError(
            table.path,
            f"unparseable timestamp {table.text(row, index)!r}",
            line=int(table.line_numbers[row]),
            field=table.columns[index],
            fix="write 'YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]', e.g. '2023-11-16 18:17:03.9799600'",
        )
    return (micros - micros[0]) / US_PER_S, table.text(0, index)
