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

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim.core.compiled import COMPILED_MODULES, source_path  # noqa: E402


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
