"""How report.md writes a number, so that every table of a report writes it the same way."""

from __future__ import annotations


def number(value: float | None) -> str:
    """Four significant digits in the usual range, thousands whole, '-' for none."""
    if value is None:
        return "-"
    if value == 0 or 1e-2 <= abs(value) < 1e6:
        return f"{value:,.4g}" if abs(value) < 1e3 else f"{value:,.0f}"
    return f"{value:.3g}"


def recorded(value: float | None) -> str:
    """A value a side may lack: 'not recorded' rather than a number."""
    return "not recorded" if value is None else number(value)


def signed_pct(value: float | None) -> str:
    """An error or a gain, with its sign ('+4.2%')."""
    return "-" if value is None else f"{value:+.1%}"


def abs_pct(value: float | None) -> str:
    """A magnitude (|error|, a deviation), without a sign."""
    return "-" if value is None else f"{value:.1%}"


def nonempty(line: str) -> list[str]:
    """A line and the blank one after it; nothing for an empty line (a table that had no data)."""
    return [line, ""] if line else []
