"""Split a numeric CSV into field spans with numpy, without a Python object per row.

The file is one ``uint8`` buffer. Newline and comma positions come from two vectorised
scans; every data row must hold exactly ``len(header) - 1`` commas, so the commas reshape
into an ``[N, C-1]`` matrix and field ``j`` of row ``i`` is the byte span between them.
Numbers are then parsed by ``traces.numbers`` straight from those spans. A million rows
take well under a second.

Quoted CSV (a comma inside a quoted text field) is rare in traces; when a file holds any
double quote the rows go through the ``csv`` module once and are rewritten unquoted.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import numpy as np

from traces.errors import TraceError

NEWLINE = 10
COMMA = 44


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

    def column_index(self, name: str) -> int | None:
        """Position of column ``name``, matched exactly, then case-insensitively."""
        if name in self.columns:
            return self.columns.index(name)
        folded = [column.casefold() for column in self.columns]
        return folded.index(name.casefold()) if name.casefold() in folded else None

    def require(self, name: str, fmt: str) -> int:
        index = self.column_index(name)
        if index is None:
            raise TraceError(
                self.path,
                f"missing column '{name}' for format '{fmt}'; columns found: {self.columns}",
                line=1,
                field=name,
                fix=f"add the column to the header, or pass the right format (found {self.columns})",
            )
        return index

    def spans(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Start and end byte offsets of column ``index`` in every row."""
        last = self.commas.shape[1]
        starts = self.line_starts if index == 0 else self.commas[:, index - 1] + 1
        ends = self.line_ends if index == last else self.commas[:, index]
        return starts, ends

    def text(self, row: int, index: int) -> str:
        starts, ends = self.spans(index)
        return self.data[starts[row] : ends[row]].tobytes().decode("utf-8", "replace")


def header_columns(raw: bytes) -> list[str]:
    """Column names of the first line of ``raw``."""
    first_line = _normalise_newlines(raw).split(b"\n", 1)[0].decode("utf-8", "replace")
    return [name.strip().strip('"') for name in next(csv.reader([first_line]), [])]


def scan_csv(path: str, raw: bytes) -> CsvTable:
    """Split ``raw`` (a whole CSV file) into rows and fields; raise on ragged rows."""
    raw = _normalise_newlines(raw)
    line_numbers = None
    if b'"' in raw:
        raw, line_numbers = _unquote(raw)
    columns = header_columns(raw)
    header_end = raw.find(b"\n")
    body_start = len(raw) if header_end < 0 else header_end + 1
    data = np.frombuffer(raw, dtype=np.uint8)
    starts, ends = _line_spans(data, body_start)
    if line_numbers is None:
        line_numbers = np.arange(2, starts.size + 2, dtype=np.int64)
    nonempty = ends > starts
    starts, ends, line_numbers = starts[nonempty], ends[nonempty], line_numbers[nonempty]
    if starts.size == 0:
        raise TraceError(path, "no data rows (the file is empty or holds only a header)",
                         fix="point at a trace file with at least one request row")
    commas = _comma_matrix(path, data, columns, starts, ends, line_numbers)
    return CsvTable(path, data, columns, line_numbers, starts, ends, commas)


def _normalise_newlines(raw: bytes) -> bytes:
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    return raw.replace(b"\r\n", b"\n") if b"\r" in raw else raw


def _line_spans(data: np.ndarray, body_start: int) -> tuple[np.ndarray, np.ndarray]:
    ends = np.flatnonzero(data[body_start:] == NEWLINE) + body_start
    if data.size > body_start and (ends.size == 0 or ends[-1] != data.size - 1):
        ends = np.append(ends, data.size)  # last line without a trailing newline
    starts = np.empty_like(ends)
    if ends.size:
        starts[0] = body_start
        starts[1:] = ends[:-1] + 1
    return starts, ends


def _comma_matrix(path, data, columns, starts, ends, line_numbers) -> np.ndarray:
    commas = np.flatnonzero(data == COMMA)
    per_row = np.searchsorted(commas, ends) - np.searchsorted(commas, starts)
    expected = len(columns) - 1
    bad = np.flatnonzero(per_row != expected)
    if bad.size:
        row = int(bad[0])
        raise TraceError(
            path,
            f"expected {expected + 1} comma-separated fields ({','.join(columns)}), "
            f"found {int(per_row[row]) + 1}",
            line=int(line_numbers[row]),
            fix="give every row one value per header column",
        )
    body = commas[np.searchsorted(commas, starts[0]) :]
    return body.reshape(starts.size, expected)


def _unquote(raw: bytes) -> tuple[bytes, np.ndarray]:
    """Rewrite a quoted CSV without quotes; commas inside fields become semicolons."""
    reader = csv.reader(io.StringIO(raw.decode("utf-8", "replace")))
    out_lines, line_numbers = [], []
    for row in reader:
        out_lines.append(",".join(field.replace(",", ";").replace("\n", " ") for field in row))
        line_numbers.append(reader.line_num)
    text = "\n".join(out_lines) + "\n"
    return text.encode(), np.asarray(line_numbers[1:], dtype=np.int64)
