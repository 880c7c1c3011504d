"""A run folder's CSV files read row by row with their line numbers.

Validation reads folders a user hands it (`compare --gpu-dir`, `adopt`), so a row with the
wrong number of fields, or a value that is not a number where one is needed, is a ValueError
naming the file, the line and the field, never a bare conversion error or a column silently
read as text or NaN.
"""

from __future__ import annotations

import csv
import gzip
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO


def open_csv(path: Path) -> TextIO:
    """A CSV for reading, gzip-compressed when its name ends in .gz (the committed replays
    under validation/evidence are kept compressed: `gzip -n` of the engine's CSVs)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="")
    return path.open(newline="")


@dataclass(frozen=True)
class CsvRows:
    """A CSV's header and rows (each a dict of its fields' text), with each row's line."""

    path: Path
    header: tuple[str, ...]
    rows: list[dict[str, str]]
    lines: list[int]

    def column(self, name: str, convert: Callable[[str], Any] = float,
               what: str = "a number") -> list:
        """Field `name` of every row through `convert`; ValueError naming the file, line and
        field of the first value it refuses (`what` says what the value should be)."""
        values = []
        for row, line in zip(self.rows, self.lines):
            try:
                values.append(convert(row[name]))
            except (TypeError, ValueError, OverflowError):
                raise ValueError(f"{self.path}, line {line}, field {name}: {row[name]!r} is not "
                                 f"{what}; fix or remove the row") from None
        return values

    def is_numeric(self, name: str) -> bool:
        """Whether field `name` holds numbers (then `column` checks every value is one) or
        text: ValueError naming the file, the field and a line of each kind where its first
        value is text and a later one a number, since a column holds one or the other."""
        if not self.rows or _is_number(self.rows[0][name]):
            return True
        for row, line in zip(self.rows, self.lines):
            if _is_number(row[name]):
                raise ValueError(f"{self.path}, field {name}: line {self.lines[0]} has "
                                 f"{self.rows[0][name]!r}, not a number, but line {line} has "
                                 f"{row[name]!r}; a column holds numbers or text, not both")
        return False


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_csv_rows(path: Path) -> CsvRows:
    """Every row of the CSV at `path` (plain or .gz); blank lines are skipped, as
    csv.DictReader skips them. ValueError naming the file and line where a row has more or
    fewer fields than the header, or the file cannot be read as CSV text."""
    rows: list[dict[str, str]] = []
    lines: list[int] = []
    line = 0
    try:
        with open_csv(path) as f:
            reader = csv.reader(f)
            header = tuple(next(reader, ()))
            for fields in reader:
                line = reader.line_num
                if not fields:
                    continue
                if len(fields) != len(header):
                    raise ValueError(f"{path}, line {line}: {len(fields)} fields where the "
                                     f"header has {len(header)}; fix or remove the row")
                rows.append(dict(zip(header, fields)))
                lines.append(line)
    except (csv.Error, UnicodeDecodeError, EOFError, OSError, zlib.error) as exc:
        where = f", after line {line}" if line else ""
        raise ValueError(f"{path}{where}: not a readable CSV ({exc})") from None
    return CsvRows(path, header, rows, lines)
