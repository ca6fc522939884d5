"""The package's layering, as imports: reading and checking a config pulls in no training code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_importing_config_imports_no_engine_module():
    code = ("import sys, json, accordion_repro.config; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('accordion_repro'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    loaded = json.loads(out)
    assert "accordion_repro.config" in loaded
    assert not [m for m in loaded if m.startswith(("accordion_repro.engine", "accordion_repro.launch"))], loaded


# ---- floors: every import goes down, or stays inside its own package; no import circle ----------
# A module of the package (its first name below accordion_repro) may import the modules of a
# lower floor, and those of its own package (one folder or file) so long as no circle forms.
# docs/architecture.md's "Layers" section is this table in words (issue 57).
FLOORS = [
    {"errors"},
    {"options", "utils", "transfer", "env", "torch_apis", "costmodel", "run_layout"},
    {"run_settings", "runlog", "forkserver_guard", "compare_runs", "models", "data", "comm"},
    {"accordion"},
    {"ddp", "engine"},
    {"settings"},
    {"rundir", "config"},
    {"launch"},
    {"analysis", "train"},
    {"reproduce_cpu"},
    {"study_status"},
]
FLOOR_OF = {name: floor for floor, names in enumerate(FLOORS) for name in names}


def import_graph(root: Path = REPO / "accordion_repro") -> dict[str, set[str]]:
    """module -> the package's modules it imports (at any depth: inside functions too)."""
    import ast

    modules = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] \
                    if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    found.add(full if full in modules else target)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while component[-1:] != [node]:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    def top(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "__init__"

    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = top(module), top(target)
            if a != b and a != "__init__" and FLOOR_OF[a] <= FLOOR_OF[b]:
                found.append(f"{module} (floor {FLOOR_OF[a]}) imports {target} (floor {FLOOR_OF[b]})")
    return found


def test_every_module_of_the_package_has_a_floor():
    tops = {m.split(".")[1] for m in import_graph() if "." in m}
    assert tops - {"__init__", "__main__"} == set(FLOOR_OF), "give each new module a floor"


def test_the_package_has_no_import_circle_and_no_import_goes_up():
    graph = import_graph()
    assert import_circles(graph) == []
    assert upward_imports(graph) == []


def test_the_layering_checks_catch_a_circle_and_an_upward_import():
    """The two checks fail on what they are for: a module of comm/ importing the catalog
    (settings.py, the top of the configuration) goes up, and two modules importing each
    other make a circle."""
    graph = import_graph()
    graph["accordion_repro.comm.powersgd"] = graph["accordion_repro.comm.powersgd"] | {
        "accordion_repro.settings"}
    assert any(u.startswith("accordion_repro.comm.powersgd (floor 2) imports "
                            "accordion_repro.settings") for u in upward_imports(graph))
    graph["accordion_repro.accordion.schedules"] |= {"accordion_repro.accordion.auto"}
    assert any({"accordion_repro.accordion.auto", "accordion_repro.accordion.schedules"} <= set(c)
               for c in import_circles(graph))
