"""Ranges a real request lies in: past them a value is a damaged file, not a workload.

Nothing valid comes near them: the longest context windows hold ~10^7 tokens, and a trace's
arrivals are seconds to years from their origin (epoch seconds are ~1.7e9).
"""

from __future__ import annotations

from traces.errors import TraceError

MAX_TOKENS_PER_REQUEST = 100_000_000
MAX_ABS_ARRIVAL_S = 1e11  # ~3,200 years; float64 still resolves ~15 us there
TOKEN_FIX = f"write a whole number from 1 to {MAX_TOKENS_PER_REQUEST:,}"


def too_many_tokens(path: str, line: int, field: str, shown: str) -> TraceError:
    """The error for a token count beyond ``MAX_TOKENS_PER_REQUEST`` either way (which also
    keeps it inside int64); ``shown`` is the value as the file writes it, cut short."""
    return TraceError(path, f"token count {shown} is out of range (a request has at most "
                            f"{MAX_TOKENS_PER_REQUEST:,})", line=line, field=field, fix=TOKEN_FIX)
