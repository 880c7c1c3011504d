"""What a format reader hands the loader: raw columns plus where each row came from."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from traces.hashes import BlockHashes


@dataclass(frozen=True, eq=False)
class RawColumns:
    """One trace file's rows in file order, before validation, sorting and re-basing.

    ``line_numbers`` and the ``*_field`` names exist so that a check failing on row ``i``
    can say "line 17, field 'GeneratedTokens'" in the file's own terms.
    """

    format: str
    arrival_s: np.ndarray  # float64 [N], any origin
    prompt_tokens: np.ndarray  # int64 [N]
    output_tokens: np.ndarray  # int64 [N]
    line_numbers: np.ndarray  # int64 [N], 1-based file lines
    time_field: str
    prompt_field: str
    output_field: str
    block_hashes: BlockHashes | None = None
    hash_block_tokens: int | None = None
    zero_output_means_failed: bool = False
    notes: list[str] = field(default_factory=list)


class ColumnParts:
    """Per-chunk arrays gathered while a file streams, each column joined once at the end.

    Joining one column at a time and dropping its parts right away keeps the peak at the
    parts plus a single joined column, not twice the whole table.
    """

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = {}

    def add(self, **arrays: np.ndarray) -> None:
        for name, array in arrays.items():
            self._parts.setdefault(name, []).append(array)

    def join(self, name: str, dtype: type) -> np.ndarray:
        parts = self._parts.pop(name, [])
        if not parts:
            return np.empty(0, dtype=dtype)
        joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
        parts.clear()
        return joined.astype(dtype, copy=False)
