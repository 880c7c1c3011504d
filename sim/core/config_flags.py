"""Command-line flags made from `EngineConfig`'s fields, and configurations made from them.

Every command that takes engine settings calls `add_engine_flags` once and then
`engine_configs` (or `engine_config`): a flag's name, type, default and help come from its
field's `Setting` (sim.core.settings), so they are the same in every command. The flags'
argparse default is SUPPRESS: a flag left out is absent from the namespace, and the
configuration takes the field's default, or the value of the `--engine-config` file.

Settings named in `multi` take comma-separated values (`--chunk 2048,8192`, `--policy all`)
and the commands run every combination. `--piecewise-graphs` and `--piecewise-max-tokens` set
`piecewise_graph_sizes` at each configuration's own chunk.
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import MISSING, Field, fields, replace
from pathlib import Path
from typing import Any

from sim.core.cost_model import piecewise_sizes_for
from sim.core.engine_config import EngineConfig
from sim.core.settings import FLOAT, INT, Setting, setting_of

PIECEWISE = "piecewise_graph_sizes"


class UsageError(ValueError):
    """A command line argparse refused (an unknown flag, a value of the wrong type)."""


class CommandParser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting, so that a
    command's main() says it in one line, `error: ...`, and returns exit code 2 as it does for
    every other ValueError (`--help` still prints and exits)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


def engine_fields(include: Collection[str] | None = None,
                  exclude: Collection[str] = ()) -> list[Field]:
    """EngineConfig's fields that have flags, `include`d (None: all) and not `exclude`d."""
    unknown = set(include or ()) | set(exclude)
    unknown -= {f.name for f in fields(EngineConfig)}
    if unknown:
        raise ValueError(f"no engine setting(s) {sorted(unknown)}")
    return [f for f in fields(EngineConfig)
            if (include is None or f.name in include) and f.name not in exclude
            and (setting_of(f).flags or f.name == PIECEWISE)]


def add_engine_flags(parser: argparse.ArgumentParser, *, multi: Collection[str] = (),
                     multi_defaults: Mapping[str, str] | None = None,
                     keep_text: Collection[str] = (), include: Collection[str] | None = None,
                     exclude: Collection[str] = (), config_file: bool = True,
                     defaults_shown: Mapping[str, str] | None = None) -> None:
    """The engine flags, in one argument group. `multi`: settings that take several values
    (a list in the namespace); `multi_defaults`: a command's own default list for some of
    them (e.g. policy 'static,elastic'); `keep_text`: settings kept as the words given, each
    checked (the model and GPU names a sweep passes on to its cases); `config_file`: add
    `--engine-config FILE`, a JSON configuration the flags given then change;
    `defaults_shown`: what help says the default is, where the command's differs (e.g. a
    compare's GPU: the runs' own)."""
    unknown = (set(multi) | set(keep_text) | set(multi_defaults or ())) - {
        f.name for f in fields(EngineConfig)}
    if unknown:
        raise ValueError(f"no engine setting(s) {sorted(unknown)}")
    group = parser.add_argument_group("engine (vLLM's names and defaults)")
    multi_defaults = dict(multi_defaults or {})
    for f in engine_fields(include, exclude):
        if f.name == PIECEWISE:
            _add_piecewise_flags(group)
            continue
        shown = (defaults_shown or {}).get(f.name) or multi_defaults.get(f.name)
        kwargs = _flag_kwargs(f, f.name in multi, f.name in keep_text, shown)
        if f.name in multi_defaults:
            kwargs["default"] = kwargs["type"](multi_defaults[f.name])
        group.add_argument(*setting_of(f).flags, **kwargs)
    if config_file:
        group.add_argument("--engine-config", type=Path, default=None, metavar="FILE",
                           help="start from this engine configuration (JSON, as a GPU replay's "
                                "config.json); the engine flags given change it")


def _flag_kwargs(f: Field, multi: bool, keep: bool, shown: str | None) -> dict:
    """argparse's keywords for the field's flag: its type (a list of them if `multi`), metavar
    and help with the default (`shown`, else the field's)."""
    s = setting_of(f)
    kwargs: dict = {"dest": f.name, "default": argparse.SUPPRESS}
    if isinstance(f.default, bool):
        kwargs["action"] = argparse.BooleanOptionalAction
    elif multi:
        kwargs["type"] = _list_type(s, keep)
        kwargs["metavar"] = _metavar(f, s) + "[,...]"
    else:
        kwargs["type"] = _value_type(s, keep)
        kwargs["metavar"] = _metavar(f, s)
    several = "; several, comma-separated, run each" if multi else ""
    default = shown or _default_text(f, s)
    kwargs["help"] = f"{s.help}{several} (default: {default})".replace("%", "%%")
    return kwargs


def _add_piecewise_flags(group) -> None:
    group.add_argument("--piecewise-graphs", action="store_true",
                       help="steps with prefill tokens run piecewise CUDA graphs (the layers "
                            "between attentions) captured at piecewise_capture_sizes of the "
                            "chunk, and are priced padded to them (default: off, fully eager)")
    group.add_argument("--piecewise-max-tokens", type=positive_int,
                       default=None, metavar="N", help="with --piecewise-graphs: the graphs stop at N tokens; a longer step "
                          "runs fully eager, as vLLM's default cap of 512 does (default: the "
                          "chunk)")


def _default_text(f: Field, s: Setting) -> str:
    if s.default_text is not None:
        return s.default_text
    return s.codec.show(setting_default(f.name))


def _metavar(f: Field, s: Setting) -> str:
    if s.choices:
        return "{" + ",".join(s.choices) + "}"
    return s.flag.split("-")[-1].upper()


def _value_type(s: Setting, keep: bool = False):
    """The flag's argparse type: its codec's reading (checked and kept as given if `keep`)."""
    def parse(text: str):
        try:
            value = s.codec.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text.strip() if keep else value

    return parse


def _list_type(s: Setting, keep: bool):
    one = _value_type(s, keep)

    def parse(text: str) -> list:
        words = [w.strip() for w in text.split(",") if w.strip()]
        if s.choices and [w.lower() for w in words] == ["all"]:
            words = list(s.choices)
        if not words:
            raise argparse.ArgumentTypeError(f"give one or more values separated by commas, "
                                             f"got {text!r}")
        values = [one(w) for w in words]
        try:
            given_once(values, words)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return values

    return parse


def given_once(values: Sequence, shown: Sequence, where: str = "") -> None:
    """Refuse a value given twice (a command or sweep would run the same configurations twice),
    saying it as `shown` gives it (the words of a flag, the values of a file), after `where`
    (the key that gave them; a flag's error is named by argparse)."""
    for i, value in enumerate(values):
        if value in values[:i]:
            said = f"{shown[i]!r} is given twice: give each value once"
            raise ValueError(f"{where}: {said}" if where else said)


def engine_configs(args: argparse.Namespace) -> list[EngineConfig]:
    """One configuration per combination of the multi-valued flags (in field order: model >
    gpu > tp > chunk > ... > policy), each from the `--engine-config` file or the defaults,
    changed by the flags given. Raises ValueError for a setting EngineConfig refuses."""
    base = _base(args)
    fixed: dict[str, Any] = {}
    axes: dict[str, list] = {}
    for f in engine_fields():
        if f.name in vars(args) and f.name != PIECEWISE:
            value = getattr(args, f.name)
            (axes if isinstance(value, list) else fixed)[f.name] = value
    configs = [replace(base, **fixed, **dict(zip(axes, combo)))
               for combo in itertools.product(*axes.values())]
    return [_with_piecewise(c, args) for c in configs]


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The one configuration of a command whose engine flags take single values."""
    (config,) = engine_configs(args)
    return config


def _base(args: argparse.Namespace) -> EngineConfig:
    path = getattr(args, "engine_config", None)
    if path is None:
        return EngineConfig()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read engine config {path}: {exc.strerror}") from None
    return EngineConfig.from_json(text, source=path)


def _with_piecewise(config: EngineConfig, args: argparse.Namespace) -> EngineConfig:
    cap = getattr(args, "piecewise_max_tokens", None)
    graphs = getattr(args, "piecewise_graphs", False)
    if cap is not None and not graphs:
        raise ValueError("--piecewise-max-tokens caps the piecewise graphs: add --piecewise-graphs")
    if not graphs:
        return config
    return replace(config, piecewise_graph_sizes=piecewise_sizes_for(config.chunk_tokens, cap))


def setting_default(name: str):
    """A setting's default (the field's; None where a rule resolves it)."""
    f = next(f for f in fields(EngineConfig) if f.name == name)
    if f.default is not MISSING:
        return f.default
    assert f.default_factory is not MISSING, f"{name} has no default"
    return f.default_factory()


def engine_flag_names() -> set[str]:
    """Every engine flag and alias (to tell engine flags from a command's own)."""
    names = {"--piecewise-graphs", "--piecewise-max-tokens", "--engine-config"}
    for f in engine_fields():
        for flag in setting_of(f).flags:
            names.add(flag)
            if isinstance(f.default, bool):
                names.add("--no-" + flag[2:])
    return names


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = _value_type(Setting("", (), INT))(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"give 1 or more, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0."""
    value = _value_type(Setting("", (), FLOAT))(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"give a number above 0, got {text!r}")
    if value == math.inf:
        raise argparse.ArgumentTypeError(f"give a finite number, got {text!r}")
    return value
