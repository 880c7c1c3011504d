"""The package's dependency rules, read from the source (every import, including those inside
functions and under TYPE_CHECKING, since each is a real dependency of the module):

* no import cycles between the project's modules;
* `sim.core` is the pure core: it imports nothing else of the project and neither simpy nor
  torch; `sim.recording` (what both executors record) builds on `sim.core` alone;
* `gpu_backend` uses the simulator only through `sim.core` and `sim.recording`;
* `traces` stands alone;
* no library module imports a command-line module (`cli`, `*_cli`, `__main__`): commands are
  thin wrappers over functions a test or a notebook can call.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "gpu_backend", "traces", "validation")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Project modules and external top-level packages `name` imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = _imported(path, name, modules)
        # A package's own submodules importing names from its __init__ is not a dependency
        # edge worth a cycle when the __init__ only re-exports; keep every other edge.
        graph[name] = {d for d in deps if d != name}
    return graph


def _project(dep: str) -> bool:
    return dep.split(".")[0] in PACKAGES


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _is_cli(module: str) -> bool:
    last = module.split(".")[-1]
    return last in ("cli", "__main__") or last.endswith("_cli")


GRAPH = _graph()


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_cycle_finder_sees_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith("sim.core")))
def test_core_is_pure(module):
    bad = {d for d in GRAPH[module]
           if (_project(d) and not d.startswith("sim.core"))
           or d.split(".")[0] in ("simpy", "torch", "triton", "cuda")}
    assert not bad, f"{module} imports {sorted(bad)}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith("sim.recording")))
def test_recording_builds_on_core_only(module):
    bad = {d for d in GRAPH[module] if _project(d)
           and not (d.startswith("sim.core") or d.startswith("sim.recording"))}
    bad |= {d for d in GRAPH[module] if d.split(".")[0] in ("simpy", "torch")}
    assert not bad, f"{module} imports {sorted(bad)}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith("gpu_backend")))
def test_gpu_backend_uses_core_and_recording_only(module):
    bad = {d for d in GRAPH[module] if d.split(".")[0] in ("sim", "validation")
           and not (d.startswith("sim.core") or d.startswith("sim.recording"))}
    assert not bad, f"{module} imports {sorted(bad)}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith("traces")))
def test_traces_stand_alone(module):
    bad = {d for d in GRAPH[module] if _project(d) and not d.startswith("traces")}
    assert not bad, f"{module} imports {sorted(bad)}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if not _is_cli(m)))
def test_libraries_import_no_cli(module):
    bad = {d for d in GRAPH[module] if _project(d) and _is_cli(d)}
    assert not bad, f"{module} imports the command-line module(s) {sorted(bad)}"


def test_nothing_imports_a_main_module():
    bad = {m: d for m, deps in GRAPH.items() for d in deps if d.endswith("__main__")}
    assert not bad
