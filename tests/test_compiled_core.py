"""The compiled core (setup.py, sim.core.compiled): an old build never runs in place of
edited sources."""

from __future__ import annotations

import importlib.machinery
import os

import pytest

from sim.core.compiled import COMPILED_MODULES, check_fresh, stale_modules

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def tree(tmp_path, *, checkout: bool = True):
    """A source tree holding every compiled module's source, each built 10 s after it."""
    if checkout:
        (tmp_path / "pyproject.toml").write_text("")
    for name in COMPILED_MODULES:
        source = tmp_path / (name.replace(".", "/") + ".py")
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text("")
        built = source.with_name(source.stem + SUFFIX)
        built.write_bytes(b"")
        os.utime(source, (1_000, 1_000))
        os.utime(built, (1_010, 1_010))
    return tmp_path


def test_a_build_newer_than_its_sources_imports(tmp_path):
    root = tree(tmp_path)
    assert stale_modules(root) == []
    check_fresh(root)


def test_a_source_edited_after_its_build_is_refused_with_how_to_rebuild(tmp_path):
    root = tree(tmp_path)
    os.utime(root / "sim/core/scheduler.py", (1_020, 1_020))
    assert stale_modules(root) == ["sim.core.scheduler"]
    with pytest.raises(ImportError, match=r"sim\.core\.scheduler: compiled before its source "
                                          r"last changed.*pip install -e \."):
        check_fresh(root)


def test_sources_without_a_build_and_installed_packages_are_not_checked(tmp_path):
    root = tree(tmp_path)
    for built in root.rglob("*" + SUFFIX):
        built.unlink()
    os.utime(root / "sim/core/step.py", (2_000, 2_000))
    assert stale_modules(root) == []  # no build beside them: the sources run
    installed = tree(tmp_path / "site", checkout=False)
    os.utime(installed / "sim/core/step.py", (2_000, 2_000))
    check_fresh(installed)  # a wheel's files come from one build: not checked
