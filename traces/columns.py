"""What a format reader hands the loader: raw columns plus where each row came from."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


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
    block_hashes: list[tuple[int, ...]] | None = None
    hash_block_tokens: int | None = None
    zero_output_means_failed: bool = False
    notes: list[str] = field(default_factory=list)
