"""Build script: the package as pyproject.toml describes it, with the simulator's hot core
compiled to C by mypyc where the machine can build it.

The modules below run once or more per engine step (scheduling, the block pool, the step
pricing, the latency distributions); compiled, a run takes about two thirds of the
instructions (Azure conv, Llama-3.1-8B on an H200: 2,110 M -> 1,456 M over the first 3,000
requests, the same summaries to the bit; `benchmarks/sim_speed.py` reports which build it
timed). Each extension is optional: without a C compiler, or with ELASTIC_KV_PURE=1 in the
environment, the build keeps the pure-Python modules, which behave the same.

An editable install (`pip install -e .`) builds the extensions into the source tree, beside
the modules they stand for; `sim.core` refuses to import one older than its source (rebuild
with the same install command, or build with ELASTIC_KV_PURE=1 while editing them).
"""

import importlib.util
import os
import sys

from setuptools import setup


def _compiled_module():
    """sim/core/compiled.py loaded by its path: importing it through the package would run
    sim.core's check for stale builds, which refuses the very tree this rebuilds."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sim", "core", "compiled.py")
    spec = importlib.util.spec_from_file_location("_elastic_kv_compiled", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_compiled = _compiled_module()
COMPILED_MODULES, source_path = _compiled.COMPILED_MODULES, _compiled.source_path


def ext_modules() -> list:
    if os.environ.get("ELASTIC_KV_PURE") == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:  # no mypy in the build environment: the pure modules
        return []
    root = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.relpath(source_path(name), root) for name in COMPILED_MODULES]
    try:
        extensions = mypycify(paths, opt_level="3")
    except (Exception, SystemExit) as exc:  # mypyc refused a module: the pure ones serve
        print(f"warning: building the pure-Python simulator core: mypyc failed: {exc}",
              file=sys.stderr)
        return []
    for extension in extensions:
        extension.optional = True  # a failed C build leaves the pure module in its place
    return extensions


setup(ext_modules=ext_modules())
