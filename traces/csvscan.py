"""Split a numeric CSV into field spans with numpy, without a Python object per row.

The file is one ``uint8`` buffer. Newline and comma positions come from two vectorised
scans; every data row must hold exactly ``len(header) - 1`` commas, so the commas reshape
into an ``[N, C-1]`` matrix and field ``j`` of row ``i`` is the byte span between them.
Numbers are then parsed by ``traces.numbers`` straight from those spans. A million rows
take well under a second.

The file arrives as text chunks (``traces.source``), each scanned on its own. Quoted CSV
(a comma inside a quoted text field) is rare in traces; from the first chunk holding a
double quote on, rows go through the ``csv`` module and are rewritten unquoted.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from traces.errors import TraceError, excerpt
from traces.source import TextChunk, prepended

NEWLINE = 10
COMMA = 44
MAX_FIELD_BYTES = 131_072  # the csv module's default field limit
FIELD_FIX = "a trace field holds a number or a short text; check that this is a trace file"


@dataclass(frozen=True, eq=False)
class CsvTable:
    """Field spans of a headed CSV; row ``i`` is file line ``line_numbers[i]``."""

    path: str
    data: np.ndarray  # uint8 [bytes]
    columns: list[str]  # header names, stripped
    line_numbers: np.ndarray  # int64 [N], 1-based, the header is line 1
    line_starts: np.ndarray  # int64 [N]
    line_ends: np.ndarray  # int64 [N], exclusive
    commas: np.ndarray  # int64 [N, C-1]

    def __len__(self) -> int:
        return int(self.line_starts.shape[0])

    def spans(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Start and end byte offsets of column ``index`` in every row."""
        last = self.commas.shape[1]
        starts = self.line_starts if index == 0 else self.commas[:, index - 1] + 1
        ends = self.line_ends if index == last else self.commas[:, index]
        return starts, ends

    def text(self, row: int, index: int) -> str:
        starts, ends = self.spans(index)
        return self.data[starts[row] : ends[row]].tobytes().decode("utf-8", "replace")


def header_columns(path: str, line: bytes, line_number: int) -> list[str]:
    """Column names of a header line."""
    text = line.split(b"\n", 1)[0].decode("utf-8", "replace")
    try:
        names = next(csv.reader([text]), [])
    except csv.Error as error:
        raise _csv_error(path, error, line_number) from None
    return [name.strip().strip('"') for name in names]


def require_column(path: str, columns: list[str], name: str, fmt: str, header_line: int) -> int:
    """Position of column ``name``, matched exactly, then case-insensitively; a name the
    header holds twice is an error (which one holds the data cannot be told)."""
    folded = [column.casefold() for column in columns]
    if folded.count(name.casefold()) > 1:
        raise TraceError(path, f"column '{name}' appears {folded.count(name.casefold())} times "
                               f"in the header {excerpt(columns)}",
                         line=header_line, field=name, fix="keep one column of that name")
    if name in columns:
        return columns.index(name)
    if name.casefold() in folded:
        return folded.index(name.casefold())
    found = excerpt(columns)
    raise TraceError(
        path, f"missing column '{name}' for format '{fmt}'; columns found: {found}",
        line=header_line, field=name,
        fix=f"add the column to the header, or pass the right format (found {found})",
    )


def csv_tables(path: str, chunks: Iterator[TextChunk], columns: list[str]) -> Iterator[CsvTable]:
    """The body chunks as tables; chunks run through ``csv`` from the first double quote on.

    A quoted field may span lines and chunks, so once a quote appears the rest of the
    file goes through one ``csv`` reader, which carries its state from chunk to chunk.
    """
    for chunk in chunks:
        if b'"' in chunk.data:
            first = [chunk]
            del chunk  # handed on: the csv path lets go of it once read
            yield from _quoted_tables(path, first, chunks, columns)
            return
        table = scan_rows(path, chunk.data, columns, _line_numbers(chunk))
        del chunk  # the table holds the bytes it needs
        if table is not None:
            yield table
        del table


def scan_rows(path: str, raw: bytes, columns: list[str], line_numbers: np.ndarray) -> CsvTable | None:
    """Split ``raw`` (rows ending in newlines, row ``i`` on file line ``line_numbers[i]``)
    into fields; None when every line is empty; raise on ragged rows and huge fields."""
    data = np.frombuffer(raw, dtype=np.uint8)
    starts, ends = _line_spans(data)
    nonempty = ends > starts
    starts, ends, line_numbers = starts[nonempty], ends[nonempty], line_numbers[: nonempty.size][nonempty]
    if starts.size == 0:
        return None
    commas = _comma_matrix(path, data, columns, starts, ends, line_numbers)
    table = CsvTable(path, data, columns, line_numbers, starts, ends, commas)
    _check_field_sizes(table)
    return table


def _check_field_sizes(table: CsvTable) -> None:
    """No field over ``MAX_FIELD_BYTES``, the limit ``csv`` holds quoted fields to; only
    rows longer than that can hold one, so only those are measured."""
    long_rows = np.flatnonzero(table.line_ends - table.line_starts > MAX_FIELD_BYTES)
    for row in long_rows.tolist():
        for index in range(len(table.columns)):
            starts, ends = table.spans(index)
            if ends[row] - starts[row] > MAX_FIELD_BYTES:
                raise TraceError(table.path, f"a field longer than {MAX_FIELD_BYTES:,} bytes",
                                 line=int(table.line_numbers[row]), field=table.columns[index],
                                 fix=FIELD_FIX)


def _line_numbers(chunk: TextChunk) -> np.ndarray:
    num_lines = chunk.data.count(b"\n") + (not chunk.data.endswith(b"\n"))
    return np.arange(chunk.first_line, chunk.first_line + num_lines, dtype=np.int64)


def _line_spans(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ends = np.flatnonzero(data == NEWLINE)
    if data.size and (ends.size == 0 or ends[-1] != data.size - 1):
        ends = np.append(ends, data.size)  # last line without a trailing newline
    starts = np.empty_like(ends)
    if ends.size:
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    return starts, ends


def _comma_matrix(path, data, columns, starts, ends, line_numbers) -> np.ndarray:
    commas = np.flatnonzero(data == COMMA)
    per_row = np.searchsorted(commas, ends) - np.searchsorted(commas, starts)
    expected = len(columns) - 1
    bad = np.flatnonzero(per_row != expected)
    if bad.size:
        row = int(bad[0])
        raise _ragged(path, columns, int(per_row[row]) + 1, int(line_numbers[row]))
    body = commas[np.searchsorted(commas, starts[0]) :]
    return body.reshape(starts.size, expected)


def _ragged(path: str, columns: list[str], num_fields: int, line: int) -> TraceError:
    return TraceError(path, f"expected {len(columns)} comma-separated fields "
                            f"({excerpt(','.join(columns))}), found {num_fields}",
                      line=line, fix="give every row one value per header column")


def _quoted_tables(path, first: list[TextChunk], rest: Iterator[TextChunk], columns):
    """Rows parsed by ``csv`` and rewritten unquoted (commas inside fields become ';',
    newlines ' '), handed on as tables of about the first chunk's size. Field counts are
    checked here: a row of one empty field would otherwise vanish as a blank line."""
    flush_bytes, first_line = max(len(first[0].data), 1), first[0].first_line
    reader = csv.reader(_text_lines(prepended(first, rest)), strict=True)
    rows: list[str] = []
    numbers: list[int] = []
    size = 0
    for line, row in _rows_with_lines(path, reader, first_line):
        if len(row) != len(columns):
            raise _ragged(path, columns, len(row), line)
        rows.append(",".join(field.replace(",", ";").replace("\n", " ") for field in row))
        numbers.append(line)
        size += len(rows[-1]) + 1
        if size >= flush_bytes:
            yield _unquoted_table(path, rows, numbers, columns)
            rows, numbers, size = [], [], 0
    if rows:
        yield _unquoted_table(path, rows, numbers, columns)


def _rows_with_lines(path, reader, first_line: int) -> Iterator[tuple[int, list[str]]]:
    """(file line where the record starts, fields) for every non-blank record."""
    while True:
        line = first_line + reader.line_num
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise _csv_error(path, error, line) from None
        if row:
            yield line, row


def _csv_error(path: str, error: csv.Error, line: int) -> TraceError:
    if "field limit" in str(error):
        return TraceError(path, f"a field longer than {csv.field_size_limit():,} characters",
                          line=line, fix=FIELD_FIX)
    return TraceError(path, f"malformed quoted CSV ({error}) in the record starting here",
                      line=line, fix='quote a field as "..." with any " inside doubled as ""')


def _text_lines(chunks: Iterator[TextChunk]) -> Iterator[str]:
    for chunk in chunks:
        yield from io.StringIO(chunk.data.decode("utf-8"))


def _unquoted_table(path, rows: list[str], numbers: list[int], columns) -> CsvTable:
    table = scan_rows(path, "\n".join(rows).encode(), columns, np.asarray(numbers, dtype=np.int64))
    assert table is not None  # every row holds len(columns) >= 1 fields, so commas or text
    return table
