"""Engine settings to and from JSON, through each field's `Setting` codec (sim.core.settings).

`EngineConfig.to_dict`/`from_dict`/`to_json`/`from_json` call the functions of the same name
here, so the configuration a run used (a GPU replay's config.json) is written and read by the
same codecs as its flags. Errors name the source (a file, or what the caller says) and the key.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

from sim.core.settings import setting_of

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Config = TypeVar("Config", bound="DataclassInstance")


def to_dict(config: DataclassInstance) -> dict[str, Any]:
    """Every field of `config` (a dataclass whose fields carry Settings) as JSON values."""
    return {f.name: setting_of(f).codec.encode(getattr(config, f.name)) for f in fields(config)}


def to_json(config: DataclassInstance) -> str:
    """`to_dict` as indented JSON text."""
    return json.dumps(to_dict(config), indent=2)


def from_dict(cls: type[Config], data: object, source: object, recorded: bool = False) -> Config:
    """The inverse of `to_dict`; a missing key takes the field's default, or, in a `recorded`
    configuration (what a run ran), its Setting's `absent` value where it has one. Errors name
    `source` and the key."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected an object of engine settings, got "
                         f"{type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{source}: unknown setting(s) {unknown}; known: {list(known)}")
    values = {name: setting_of(f).absent for name, f in known.items()
              if recorded and name not in data and setting_of(f).absent is not None}
    for name, value in data.items():
        try:
            values[name] = setting_of(known[name]).codec.decode(value)
        except ValueError as exc:
            raise ValueError(f"{source}: {name}: {exc}") from None
    try:
        return cls(**values)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def from_json(cls: type[Config], text: str, source: object, recorded: bool = False) -> Config:
    """`from_dict` of a JSON text; text that is not JSON is an error naming `source`."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ValueError(f"{source} is not valid JSON: {exc}") from None
    return from_dict(cls, data, source, recorded)
