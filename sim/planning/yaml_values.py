"""Typed readers of a sweep YAML's values: each returns the value read or raises ValueError
saying what was expected; `read` and `axis` add the key, and `load_sweep` the file.

The readers check types, and the ranges of the values an engine config does not hold (grid
axes, replicas, workers, trace options). An engine setting's range is the engine's own check
(sim.core.engine_checks), run on each grid point's config before the first case
(sim.planning.spec); a valid value that one configuration cannot run (a model too large for
a GPU) is left to that case's row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sim.core.config_flags import given_once
from sim.core.settings import FLOAT, INT

Reader = Callable[[Any], Any]


def read(data: Mapping, key: str, reader: Reader, where: str, default: Any) -> Any:
    """data[key] read by `reader` (None or absent: `default`); a wrong type names the key."""
    value = data.get(key)
    if value is None:
        return default
    try:
        return reader(value)
    except ValueError as exc:
        raise ValueError(f"{where}.{key}: {exc}") from None


def axis(grid: Mapping, key: str, reader: Reader, default: tuple) -> tuple:
    """grid[key] as a tuple, each value read by `reader` and given once (absent or null:
    `default`; an empty list is refused, not taken for the default)."""
    values = as_list(grid.get(key))
    if not values:
        if key in grid and grid[key] is not None:
            raise ValueError(f"grid.{key} is an empty list: give one or more values, or leave "
                             "the key out for its default")
        return default
    out = []
    for i, value in enumerate(values):
        try:
            out.append(reader(value))
        except ValueError as exc:
            raise ValueError(f"grid.{key}[{i}]: {exc}") from None
    given_once(out, values, f"grid.{key}")
    return tuple(out)


def text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a name, got {value!r}")
    return value


def positive(value: Any) -> float:
    number = FLOAT.decode(value)
    if not number > 0:
        raise ValueError(f"expected a number above 0, got {value!r}")
    return number


def count(value: Any) -> int:
    """An integer of 1 or more (GPUs, tokens, replicas, workers, requests)."""
    number = INT.decode(value)
    if number < 1:
        raise ValueError(f"give 1 or more, got {value!r}")
    return number


def as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def check_keys(where: str, data: dict, known: tuple[str, ...]) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping, got {data!r}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; known: {list(known)}")
