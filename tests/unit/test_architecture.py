"""The layering of docs/architecture.md §Layers, derived from the source with `ast`.

domain < planner, simulator < profiling < learn < pipeline < report < experiments < cli: a module
imports only from its own package or a lower layer, and the import graph has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "memx"
RANK = {"domain": 0, "planner": 1, "simulator": 1, "profiling": 2, "learn": 3, "pipeline": 4, "report": 5,
        "experiments": 6, "cli": 7}
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    base = ROOT.parent / Path(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _imports(path: Path) -> set[str]:
    """memx modules imported anywhere in the file (top level or inside functions)."""
    out: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "memx")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "memx":
                continue
            # `from memx.pkg import module` depends on that module; `from memx.mod import name` on mod
            submodules = {f"{mod}.{a.name}" for a in node.names if _is_module(f"{mod}.{a.name}")}
            out.update(submodules)
            if len(submodules) < len(node.names):
                out.add(mod)
    return out


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    return {name: {m for m in _imports(p) if m in modules and m != name} for name, p in modules.items()}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else None


def test_every_package_has_a_layer():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(RANK), f"packages without a layer in docs/architecture.md: {packages ^ set(RANK)}"
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside the layered packages: {loose}"


def test_no_upward_imports():
    bad = []
    for mod, deps in _graph().items():
        src = _layer(mod)
        for dep in deps:
            dst = _layer(dep)
            if src and dst and dst != src and RANK[dst] >= RANK[src]:
                bad.append(f"{mod} ({src}) imports {dep} ({dst})")
    assert not bad, "imports against docs/architecture.md §Layers:\n" + "\n".join(sorted(bad))


def test_simulator_never_imports_planner():
    bad = [f"{m} -> {d}" for m, deps in _graph().items() if _layer(m) == "simulator" for d in deps if _layer(d) == "planner"]
    assert not bad, bad


def test_import_graph_has_no_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_modules_stay_small():
    big = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"
