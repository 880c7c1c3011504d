"""The one exception every trace problem raises, with a message a user can act on."""

from __future__ import annotations

from pathlib import Path

MAX_QUOTED_CHARS = 80


class TraceError(ValueError):
    """A trace file cannot be used as given.

    The message names the file, the line (1-based, counting the header), the field, the
    problem and what to change, e.g.::

        conv.csv: line 17: field 'GeneratedTokens': non-numeric token count 'abc'.
        Fix: write a whole number >= 1.

    The parts stay available as attributes so callers and tests need not parse the text.
    """

    def __init__(
        self,
        path: str | Path | None,
        problem: str,
        *,
        line: int | None = None,
        field: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(self._compose())

    def _compose(self) -> str:
        parts = []
        if self.path is not None:
            parts.append(self.path)
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.field is not None:
            parts.append(f"field '{self.field}'")
        where = ": ".join(parts)
        text = f"{where}: {self.problem}" if where else self.problem
        if self.fix:
            text += f". Fix: {self.fix}"
        return text


def excerpt(value: object, max_chars: int = MAX_QUOTED_CHARS) -> str:
    """``repr(value)`` cut to about ``max_chars``: a 50 MB field must not fill a terminal."""
    if isinstance(value, (str, bytes)):
        value = value[: 2 * max_chars]  # repr of a huge string would copy it whole
    try:
        text = repr(value)
    except RecursionError:
        return "(a value nested too deeply to show)"
    return text if len(text) <= max_chars else f"{text[:max_chars]}... (cut)"
