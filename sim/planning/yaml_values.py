"""Typed readers of a sweep YAML's values: each returns the value read or raises ValueError
saying what was expected; `read` and `axis` add the key, and `load_sweep` the file.

A value is refused here when no case could run it (a TP degree of 0, a share of memory above
1), so that a sweep stops before its first case; a valid value that one configuration cannot
run (a model too large for a GPU) is left to that case's row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sim.core.memory_plan import BLOCK_SIZES
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
    given_once(f"grid.{key}", out, values)
    return tuple(out)


def given_once(where: str, values: list, shown: list) -> None:
    """Refuse a value given twice (it would run the same cases twice); `shown`: the values as
    the file gives them."""
    for i, value in enumerate(values):
        if value in values[:i]:
            raise ValueError(f"{where}: {shown[i]!r} is given twice: give each value once")


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
    """An integer of 1 or more (GPUs, tokens, sequences, replicas, workers)."""
    number = INT.decode(value)
    if number < 1:
        raise ValueError(f"give 1 or more, got {value!r}")
    return number


def share(value: Any) -> float:
    """A share of the GPU's memory: above 0 and at most 1."""
    number = FLOAT.decode(value)
    if not 0.0 < number <= 1.0:
        raise ValueError(f"give a share of the GPU's memory above 0 and at most 1 (e.g. 0.9), "
                         f"got {value!r}")
    return number


def block_size(value: Any) -> int:
    number = INT.decode(value)
    if number not in BLOCK_SIZES:
        raise ValueError(f"give one of {', '.join(map(str, BLOCK_SIZES))} (vLLM's choices), "
                         f"got {value!r}")
    return number


def not_negative(value: Any) -> int:
    number = INT.decode(value)
    if number < 0:
        raise ValueError(f"give 0 or more, got {value!r}")
    return number


def sizes(value: Any) -> list:
    """A list of sizes, each 1 or more."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of positive integers, got {value!r}")
    for size in value:
        count(size)
    return value


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
