"""Column-wise request trace: numpy arrays rather than a million ``Request`` objects.

Loading, windowing and scaling stay vectorised; ``requests()`` builds the per-request
objects only when a consumer wants them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from traces.hashes import BlockHashes
from traces.limits import MAX_ABS_ARRIVAL_S
from traces.request import Request


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests in arrival order, one array element per request.

    ``failed`` is set only for BurstGPT traces loaded with ``drop_failed=False``: True
    marks a request the original service failed (0 response tokens), kept with
    ``output_tokens == 1`` so its prefill load stays in the trace. ``block_hashes`` may be
    given as a list of id tuples; it is stored flat (see ``traces.hashes``).
    """

    arrival_s: np.ndarray  # float64 [N], non-decreasing
    prompt_tokens: np.ndarray  # int64 [N], >= 1
    output_tokens: np.ndarray  # int64 [N], >= 1
    block_hashes: BlockHashes | None = None
    hash_block_tokens: int | None = None
    source: str = ""
    format: str = ""
    notes: list[str] = field(default_factory=list)
    failed: np.ndarray | None = None  # bool [N]

    def __post_init__(self) -> None:
        if self.block_hashes is not None and not isinstance(self.block_hashes, BlockHashes):
            object.__setattr__(self, "block_hashes", BlockHashes.from_rows(self.block_hashes))

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    def requests(self) -> list[Request]:
        """Per-request objects with ids 0..N-1 in arrival order."""
        hashes: list[tuple[int, ...] | None] = (
            list(self.block_hashes) if self.block_hashes is not None else [None] * len(self)
        )
        rows = zip(
            self.arrival_s.tolist(),
            self.prompt_tokens.tolist(),
            self.output_tokens.tolist(),
            hashes,
            strict=True,
        )
        return [
            Request(request_id, arrival_s, prompt, output, block_hashes)
            for request_id, (arrival_s, prompt, output, block_hashes) in enumerate(rows)
        ]

    def select(self, index: np.ndarray, *, note: str | None = None) -> Trace:
        """A sub-trace of the rows picked by ``index`` (bool mask or sorted positions)."""
        positions = np.flatnonzero(index) if index.dtype == bool else index
        hashes = None if self.block_hashes is None else self.block_hashes.take(positions)
        return replace(
            self,
            arrival_s=self.arrival_s[positions],
            prompt_tokens=self.prompt_tokens[positions],
            output_tokens=self.output_tokens[positions],
            block_hashes=hashes,
            failed=None if self.failed is None else self.failed[positions],
            notes=self.notes + ([note] if note else []),
        )

    def window(self, start_s: float, end_s: float) -> Trace:
        """Requests arriving in [start_s, end_s), with arrivals re-based to start_s."""
        if not end_s > start_s:
            raise ValueError(f"window end {end_s} s must be after start {start_s} s")
        keep = (self.arrival_s >= start_s) & (self.arrival_s < end_s)
        note = f"window [{start_s:g}, {end_s:g}) s kept {int(keep.sum())} of {len(self)} requests"
        sub = self.select(keep, note=note)
        return replace(sub, arrival_s=sub.arrival_s - start_s)

    def head(self, num_requests: int) -> Trace:
        """The first ``num_requests`` requests."""
        if num_requests < 0:
            raise ValueError(f"head needs num_requests >= 0, got {num_requests}")
        if num_requests >= len(self):
            return self
        note = f"limited to the first {num_requests} of {len(self)} requests"
        return self.select(np.arange(num_requests), note=note)

    def scaled(self, rate_scale: float) -> Trace:
        """Same requests at ``rate_scale`` times the request rate (arrivals divided by it)."""
        if not 0 < rate_scale < np.inf:
            raise ValueError(f"rate_scale must be > 0 and finite (--rate-scale 2.0 = twice the "
                             f"rate), got {rate_scale}")
        if rate_scale == 1.0:
            return self
        arrival_s = self.arrival_s / rate_scale
        if len(arrival_s) and arrival_s[-1] > MAX_ABS_ARRIVAL_S:
            raise ValueError(f"rate_scale (--rate-scale) {rate_scale:g} stretches the trace to "
                             f"{arrival_s[-1]:.3g} s, beyond {MAX_ABS_ARRIVAL_S:g} s: give a "
                             "larger rate scale")
        note = f"request rate scaled x{rate_scale:g} (arrivals divided by {rate_scale:g})"
        return replace(self, arrival_s=arrival_s, notes=self.notes + [note])

    def describe(self) -> dict[str, float | int]:
        """Count, span, rate, inter-arrival CV and prompt/output length percentiles."""
        count = len(self)
        span_s = float(self.arrival_s[-1] - self.arrival_s[0]) if count else 0.0
        gaps_s = np.diff(self.arrival_s)
        mean_gap_s = float(gaps_s.mean()) if gaps_s.size else 0.0
        summary: dict[str, float | int] = {
            "count": count,
            "span_s": span_s,
            "rate_per_s": (count - 1) / span_s if span_s > 0 else 0.0,
            "interarrival_cv": float(gaps_s.std() / mean_gap_s) if mean_gap_s > 0 else 0.0,
        }
        for name in ("prompt_tokens", "output_tokens"):
            summary.update(_length_stats(name, getattr(self, name)))
        return summary


def _length_stats(name: str, lengths: np.ndarray) -> dict[str, float | int]:
    if lengths.size == 0:
        return {f"{name}_{stat}": 0 for stat in ("mean", "p50", "p99", "max")}
    p50, p99 = np.percentile(lengths, [50, 99])
    return {
        f"{name}_mean": float(lengths.mean()),
        f"{name}_p50": float(p50),
        f"{name}_p99": float(p99),
        f"{name}_max": int(lengths.max()),
    }
