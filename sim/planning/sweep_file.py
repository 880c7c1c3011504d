"""sweep.csv, a row appended (and flushed) the moment each case ends, and read back to resume.

A sweep of hundreds of cases runs for hours; a crash, a Ctrl-C or one bad case must not cost
the rows already computed. So the table is written as it grows:

    append      a row whose columns the file already has is appended and flushed; a row
                with new columns (the first case that ran, after rows of cases that did not
                fit) rewrites the file with the wider header, atomically
    case_id     each row carries a digest of its case's inputs (and what priced it), so a
                rerun with --resume knows which cases are done
    resume      rows of cases that ran or did not fit are kept and those cases skipped;
                rows of cases that failed are dropped, so those cases run again
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from sim.recording.folder import atomic_path

CASE_ID = "case_id"
ERROR = "error"


def case_id(inputs: dict) -> str:
    """A stable digest of a case's input columns (the same in every process and run)."""
    text = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class SweepCsv:
    """The table file of one sweep; `rows` holds what it holds, as values, not text."""

    def __init__(self, path: Path, rows: list[dict] | None = None) -> None:
        self.path = path
        self.rows: list[dict] = list(rows or [])
        self.columns: list[str] = columns(self.rows)
        if self.rows:
            self._rewrite()
        else:
            path.unlink(missing_ok=True)

    @classmethod
    def resume(cls, path: Path) -> SweepCsv:
        """The table at `path` with the rows of failed cases dropped (a new one if none)."""
        if not path.exists():
            return cls(path)
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or CASE_ID not in reader.fieldnames:
                raise ValueError(f"{path}: not a sweep table (no {CASE_ID} column in its "
                                 "header): give the --out of an earlier sweep, or a new one")
            rows = [{k: v if k == CASE_ID else parse_cell(v) for k, v in row.items()}
                    for row in reader]
        return cls(path, [r for r in rows if not r.get(ERROR)])

    def done(self) -> dict[str, dict]:
        """Rows by case id."""
        return {row[CASE_ID]: row for row in self.rows}

    def append(self, row: dict) -> None:
        self.rows.append(row)
        if any(k not in self.columns for k in row):
            self.columns = columns(self.rows)
            self._rewrite()
            return
        with self.path.open("a", newline="") as f:
            _writer(f, self.columns).writerow(_cells(row, self.columns))
            f.flush()

    def _rewrite(self) -> None:
        with atomic_path(self.path) as tmp, tmp.open("w", newline="") as f:
            write_rows(f, self.rows, self.columns)


def columns(rows: Iterable[dict]) -> list[str]:
    """Union of the rows' keys, first-seen order (inputs, then fits, then metrics)."""
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            seen.setdefault(key, None)
    return list(seen)


def write_rows(f, rows: Sequence[dict], names: Sequence[str]) -> None:
    writer = _writer(f, names)
    writer.writeheader()
    for row in rows:
        writer.writerow(_cells(row, names))


def _writer(f, names: Sequence[str]) -> csv.DictWriter:
    return csv.DictWriter(f, fieldnames=list(names))


def _cells(row: dict, names: Sequence[str]) -> dict:
    return {k: "" if row.get(k) is None else row.get(k) for k in names}


def parse_cell(text: str | None):
    """A CSV cell back to the value it was written from: "" -> None, True/False, int,
    float (nan included), else the text."""
    if text is None or text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text
