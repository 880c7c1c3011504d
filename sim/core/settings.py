"""What an engine setting is besides its value: its flag, its help, and how it is read and
written.

`EngineConfig`'s fields carry a `Setting` in their metadata, so a setting's flag name, default
and help live beside the field itself (as Vidur's flat_dataclass builds flags from config
dataclasses); `sim.core.config_flags` makes every command's flags from them, and
`EngineConfig.to_dict`/`from_dict` read and write JSON through the same codecs. A `Codec`
reads a command-line word (`parse`), reads a JSON or YAML value with its type checked
(`decode`), and writes a JSON value (`encode`). Both readers raise ValueError with a message
saying what was expected; the callers add the flag, file or key.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.core.catalog import MIB


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Codec:
    parse: Callable[[str], Any]  # a command-line word -> value
    decode: Callable[[Any], Any]  # a JSON/YAML value -> value, type-checked
    encode: Callable[[Any], Any] = _same  # value -> a JSON value
    show: Callable[[Any], str] = str  # value -> how help text shows it


@dataclass(frozen=True)
class Setting:
    help: str
    flags: tuple[str, ...]  # the first is the name (vLLM's where vLLM has it), then aliases
    codec: Codec
    # the default as help shows it, where it is a rule rather than the field's value
    default_text: str | None = None
    choices: tuple[str, ...] = ()
    # what a recorded configuration (a replay's config.json) without this key ran, where that
    # is not the default: the setting came after records written by engines with one fixed
    # behaviour. A configuration a user writes takes the default for a key left out.
    absent: Any = None

    @property
    def flag(self) -> str:
        return self.flags[0]


def setting(help: str, *flags: str, codec: Codec, default_text: str | None = None,
            choices: tuple[str, ...] = (), absent: Any = None) -> dict:
    """Field metadata: `field(default=..., metadata=setting("...", "--name", codec=INT))`."""
    return {"setting": Setting(help, flags, codec, default_text, choices, absent)}


def setting_of(field: dataclasses.Field) -> Setting:
    return field.metadata["setting"]


# ------------------------------------------------------------------------------ readers
def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def _parse_count(text: str) -> int:
    value = _parse_int(text)
    if value < 1:
        raise ValueError(f"give 1 or more, got {text!r}")
    return value


def _decode_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _parse_float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def _decode_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word not in ("true", "false", "on", "off", "1", "0", "yes", "no"):
        raise ValueError(f"expected true or false, got {text!r}")
    return word in ("true", "on", "1", "yes")


def _decode_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def optional(codec: Codec) -> Codec:
    """The codec's values or None (JSON null; help shows the default rule)."""
    return Codec(codec.parse, lambda v: None if v is None else codec.decode(v), codec.encode,
                 lambda v: "none" if v is None else codec.show(v))


def choice(names: tuple[str, ...]) -> Codec:
    def parse(text: str) -> str:
        word = text.strip().lower()
        if word not in names:
            raise ValueError(f"unknown value {text!r}; known: {', '.join(names)}")
        return word

    def decode(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"expected one of {', '.join(names)}, got {value!r}")
        return parse(value)

    return Codec(parse, decode)


def enum_codec(cls: type[enum.Enum], parse: Callable[[str], Any]) -> Codec:
    def decode(value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"expected one of {', '.join(m.value for m in cls)}, got {value!r}")
        return parse(value)

    return Codec(parse, decode, lambda v: v.value, lambda v: v.value)


def _parse_sizes(text: str) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8), sorted, repeats dropped; '' or 'none' -> ()."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 1:
        raise ValueError(f"expected positive sizes separated by commas (e.g. 1,2,4,8) or "
                         f"'none', got {text!r}")
    return sizes


def _decode_sizes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"expected a list of positive integers, got {value!r}")
    return tuple(sorted({_decode_int(v) for v in value}))


def _show_sizes(sizes: tuple[int, ...]) -> str:
    return ",".join(map(str, sizes)) or "none"


def _parse_mib(text: str) -> int:
    return _parse_int(text) * MIB


def _show_mib(num_bytes: int) -> str:
    return f"{num_bytes / MIB:g} MiB"


INT = Codec(_parse_int, _decode_int)
COUNT = Codec(_parse_count, _decode_int)  # a flag refuses 0; JSON is checked by the config
FLOAT = Codec(_parse_float, _decode_float, show=lambda v: f"{v:g}")
BOOL = Codec(_parse_bool, _decode_bool, show=lambda v: "on" if v else "off")
SIZES = Codec(_parse_sizes, _decode_sizes, list, _show_sizes)
MIB_BYTES = Codec(_parse_mib, _decode_int, show=_show_mib)  # flags in MiB, JSON in bytes


def spec_codec(cls: type, lookup: Callable[[str], Any]) -> Codec:
    """A catalog spec (ModelSpec, GpuSpec): named on the command line (`lookup`), written to
    JSON in full so that a configuration reads back the same whatever the catalog holds; a
    JSON string is looked up by name."""
    def decode(value: Any) -> Any:
        if isinstance(value, str):
            return lookup(value)
        if not isinstance(value, dict):
            raise ValueError(f"expected a name or an object of {cls.__name__} fields, "
                             f"got {value!r}")
        return dataclass_from_dict(cls, value)

    return Codec(lookup, decode, dataclasses.asdict, lambda v: v.name)


def dataclass_from_dict(cls: type, data: dict) -> Any:
    """`cls(**data)` with nested dataclasses rebuilt and lists made tuples (the inverse of
    `dataclasses.asdict` for frozen specs); unknown or missing keys are named."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; known: {names}")
    values = {}
    for name, value in data.items():
        nested = _dataclass_in(hints[name])
        if isinstance(value, dict) and nested is not None:
            value = dataclass_from_dict(nested, value)
        elif nested is not None and value is not None:
            raise ValueError(f"{cls.__name__}.{name}: expected an object of {nested.__name__} "
                             f"fields, got {value!r}")
        elif isinstance(value, list):
            value = tuple(value)
        values[name] = value
    try:
        return cls(**values)
    except TypeError as exc:  # a required field missing
        raise ValueError(f"{cls.__name__}: {exc}") from None


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field's type names (alone or in an Optional), else None."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        for arg in typing.get_args(hint):
            if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                return arg
    return None
