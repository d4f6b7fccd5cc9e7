"""The layout shows the wire: every ``import`` under ``rollmux/`` (those inside functions and
``TYPE_CHECKING`` blocks too) keeps the packages in layers, and a failure names the chain.

Only the module a statement names counts: a parent package runs on import too, but
``rollmux/__init__`` reaches the job side only when ``rollmux.phase`` is read.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "rollmux"
JOB_SIDE = "rollmux.sdk"
CONTROL_PLANE = "rollmux.service"
CORE = "rollmux.core"
CORE_LIBRARIES = frozenset({"numpy", "scipy"})
"""What the pure core may import besides the standard library: numbers, no I/O."""


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@cache
def imports(module: str) -> tuple[frozenset[str], frozenset[str]]:
    """The rollmux modules ``module`` imports, and the other top-level names it imports."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                base = f"{package.rsplit('.', node.level - 1)[0]}.{base}".rstrip(".")
            for alias in node.names:
                named.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else base)
    ours = {name for name in named if name == "rollmux" or name.startswith("rollmux.")}
    return frozenset(ours - {module}), frozenset(name.partition(".")[0] for name in named - ours)


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def chain(names: list[str]) -> str:
    return " → ".join(names)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as the path that closes it (first node repeated), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == 1:
                return path[path.index(successor) :] + [successor]
            if successor not in state and (found := visit(successor)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def module_graph() -> dict[str, set[str]]:
    return {module: set(imports(module)[0]) for module in modules()}


def test_no_module_imports_itself_through_others():
    cycle = find_cycle(module_graph())
    assert cycle is None, f"import cycle: {chain(cycle)}"


def test_the_top_level_packages_form_layers():
    """No package imports, through any of its modules, a package that imports it back."""
    graph: dict[str, set[str]] = {}
    example: dict[tuple[str, str], str] = {}
    for module, targets in module_graph().items():
        for target in targets:
            edge = (package_of(module), package_of(target))
            if edge[0] != edge[1]:
                graph.setdefault(edge[0], set()).add(edge[1])
                example.setdefault(edge, f"{module} → {target}")
    cycle = find_cycle(graph)
    assert cycle is None, "package cycle: " + ", then ".join(
        f"{a} → {b} ({example[a, b]})" for a, b in zip(cycle, cycle[1:], strict=False)
    )


def test_the_control_plane_reaches_nothing_of_the_job_side():
    """The service drives the data plane; the job side's code reaches it from the entry
    points (``rollmux.sdk.jobcode``), never by an import of the service's."""
    graph = module_graph()
    came_from: dict[str, str | None] = {m: None for m in graph if package_of(m) == CONTROL_PLANE}
    queue = deque(sorted(came_from))
    while queue:
        module = queue.popleft()
        if package_of(module) == JOB_SIDE:
            path = [module]
            while (previous := came_from[path[-1]]) is not None:
                path.append(previous)
            raise AssertionError(f"{CONTROL_PLANE} reaches {JOB_SIDE}: {chain(path[::-1])}")
        for target in sorted(graph[module]):
            if target not in came_from:
                came_from[target] = module
                queue.append(target)


def test_the_core_is_pure():
    """The core imports itself, the standard library and numerics: no Ray, no web service,
    no database, no torch, nothing else of RollMux."""
    wrong = []
    for module in sorted(m for m in modules() if package_of(m) == CORE):
        ours, others = imports(module)
        wrong += [f"{module} → {target}" for target in sorted(ours) if package_of(target) != CORE]
        allowed = CORE_LIBRARIES | sys.stdlib_module_names | {"__future__"}
        wrong += [f"{module} → {name}" for name in sorted(others) if name not in allowed]
    assert not wrong, "the core imports beyond itself, the standard library and numerics: " + "; ".join(wrong)
