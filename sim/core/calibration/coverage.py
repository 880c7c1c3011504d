"""How far a calibration's grid reaches, and whether a run's steps went past it.

A profile times a grid of steps (gpu_backend/engine/profile_grid.py) and fits the cost model's
rates to them; the fitted model prices any step, but one larger than every grid step is priced
by carrying the fitted rates beyond what was timed. The shipped grids stop at 16,384 tokens a
step, so a run at chunk 32,768 prices its largest steps that way (the study slice's 32,768-token
first step came out 10-12% short). Three extents say how large a step is:

    tokens          tokens one step computes (prefill tokens and decode rows)
    sequence_keys   the keys one sequence of a step attends over: a prefill chunk's cached
                    prefix and new tokens, or a decode row's context
    decode_keys     the keys one decode-only step reads, over all its rows

A calibration's extents are its grid's largest (`grid_extent`); a run's, its largest steps'
(the recorder's `step_extent` summary, sim.recording.metrics). `extrapolation_note` names every
extent a run went past, so the output says which prices are extrapolated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import reduce

EXTENT_PHRASES = {
    "tokens": "tokens in one step",
    "sequence_keys": "keys of one sequence",
    "decode_keys": "keys one decode step reads",
}


@dataclass(frozen=True)
class StepExtent:
    """The largest step in each dimension (0: no such step)."""

    tokens: int = 0
    sequence_keys: int = 0
    decode_keys: int = 0

    def widest(self, other: StepExtent) -> StepExtent:
        """Each extent the larger of the two."""
        return StepExtent(*(max(getattr(self, f.name), getattr(other, f.name))
                            for f in fields(StepExtent)))

    def past(self, grid: StepExtent) -> list[str]:
        """The extents where this one goes past `grid`'s, each with both figures; an extent
        the grid does not record (0: records without decode contexts) is not compared."""
        return [f"{getattr(self, f.name):,} {EXTENT_PHRASES[f.name]} (the grid's most: "
                f"{getattr(grid, f.name):,})"
                for f in fields(StepExtent) if 0 < getattr(grid, f.name) < getattr(self, f.name)]

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(StepExtent)}

    @classmethod
    def from_dict(cls, values: Mapping | None) -> StepExtent | None:
        """A summary's `step_extent` (None where the summary has none)."""
        if not isinstance(values, Mapping):
            return None
        return cls(**{f.name: _count(values.get(f.name)) for f in fields(StepExtent)})

    @classmethod
    def from_row(cls, row: Mapping) -> StepExtent | None:
        """A sweep or plan row's (its summary flattened: `step_extent_tokens`, ...)."""
        if "step_extent_tokens" not in row:
            return None
        return cls.from_dict({f.name: row.get(f"step_extent_{f.name}", 0)
                              for f in fields(StepExtent)})


def _count(value: object) -> int:
    """A count as a summary, a row or a CSV read back holds it (int, float or text); 0 where
    there is none (an empty cell, a row from before the extent was recorded)."""
    try:
        return int(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0


def grid_extent(data: Mapping, source: str = "calibration") -> StepExtent | None:
    """The largest step of a calibration's grid in each dimension (its `measurements`, as
    `python -m gpu_backend profile` records them); None where it records no grid. A record
    that does not read as a step is a ValueError naming `source` and the record."""
    steps = []
    for index, record in enumerate(data.get("measurements") or ()):
        try:
            steps.append(record_extent(record))
        except (AttributeError, TypeError, ValueError):
            raise ValueError(
                f"{source}: measurements[{index}] is not a grid step: it needs \"prefills\" "
                "as [new tokens, prefix tokens] pairs and \"decode_groups\" as [rows, context] "
                f"pairs (or \"num_decodes\" and \"decode_context\"); got {record!r}") from None
    return widest(steps)


def widest(extents: Sequence[StepExtent]) -> StepExtent | None:
    """Each extent the largest of `extents`' (None where there are none)."""
    return reduce(StepExtent.widest, extents) if extents else None


def record_extent(record: Mapping) -> StepExtent:
    """The extents of one grid record: its prefills' (new tokens, prefix) pairs and its decode
    rows (`decode_groups`: [rows, context] pairs; older records: `num_decodes` rows of
    `decode_context` keys)."""
    prefills = [(int(new), int(prefix)) for new, prefix in record.get("prefills") or ()]
    groups = record.get("decode_groups")
    if groups is None:
        groups = [[record.get("num_decodes", 0), record.get("decode_context", 0)]]
    rows = [(int(n), int(context)) for n, context in groups if int(n) > 0]
    decode_rows = sum(n for n, _ in rows)
    keys = [new + prefix for new, prefix in prefills] + [context for _, context in rows]
    return StepExtent(
        tokens=sum(new for new, _ in prefills) + decode_rows,
        sequence_keys=max(keys, default=0),
        decode_keys=0 if prefills else sum(n * context for n, context in rows))


def extrapolation_note(label: str, run: StepExtent | None, grid: StepExtent | None,
                       source: str) -> str | None:
    """The line an output prints where `run`'s steps went past the grid of calibration
    `source`; None where they did not (or either extent is unknown)."""
    if run is None or grid is None:
        return None
    past = run.past(grid)
    if not past:
        return None
    return (f"{label}: steps past the grid of {source}, priced by carrying its fitted rates "
            f"beyond what it timed: {'; '.join(past)}")
