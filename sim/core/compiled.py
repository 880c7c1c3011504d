"""Which modules of the simulator's core the build compiles with mypyc (setup.py), and a
check that none of those compiled into the source tree is older than its source.

A compiled module stands in for its `.py` file wherever both sit side by side, so after an
edit the old build would run instead of the edited code; `check_fresh` (run when sim.core is
imported) refuses that with a message saying how to rebuild.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

COMPILED_MODULES = (
    "sim.core.scheduler", "sim.core.decode_run", "sim.core.block_pool", "sim.core.block_cache",
    "sim.core.elastic_region",
    "sim.core.controller", "sim.core.cost_model", "sim.core.operator_costs",
    "sim.core.request", "sim.core.step", "sim.core.prefix_cache",
    "sim.recording.distribution",
)
ROOT = Path(__file__).resolve().parents[2]


def source_path(name: str, root: Path = ROOT) -> Path:
    """The source file of module `name` under `root` (what setup.py hands mypyc)."""
    return root / (name.replace(".", "/") + ".py")


def compiled_files(source: Path) -> list[Path]:
    """The extension files built for `source` beside it."""
    built = (source.with_name(source.stem + suffix)
             for suffix in importlib.machinery.EXTENSION_SUFFIXES)
    return [path for path in built if path.exists()]


def stale_modules(root: Path = ROOT) -> list[str]:
    """Compiled modules under `root` whose source changed after they were built."""
    stale = []
    for name in COMPILED_MODULES:
        source = source_path(name, root)
        built = compiled_files(source)
        if built and source.exists() and any(
                b.stat().st_mtime < source.stat().st_mtime for b in built):
            stale.append(name)
    return stale


def check_fresh(root: Path = ROOT) -> None:
    """ImportError if a module compiled into the source tree under `root` is older than its
    source. Outside a source tree (an installed wheel: no pyproject.toml above the package)
    the files come from one build and nothing is checked."""
    if not (root / "pyproject.toml").exists():
        return
    stale = stale_modules(root)
    if stale:
        raise ImportError(
            f"{', '.join(stale)}: compiled before its source last changed, so the old build "
            "would run instead: rebuild with `pip install -e .` (ELASTIC_KV_PURE=1 in the "
            "environment builds none), or delete the .so files beside the sources")


def is_compiled(name: str = "sim.core.scheduler") -> bool:
    """Is module `name` running compiled (for the benchmarks' records)?"""
    import importlib

    module = importlib.import_module(name)
    return not str(getattr(module, "__file__", "")).endswith(".py")
