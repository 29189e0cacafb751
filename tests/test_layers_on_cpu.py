"""The import floors (rpg/floors.py, docs/README.md#layout): every import of a module of rpg/, function-local ones
included, goes to its own floor or a lower one, and no imports close a cycle. Read from the source (AST), so nothing
is imported; `importlib.import_module` of a computed name (rpg.install's installers) is not seen."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rpg.floors import FLOORS, floor_of

RPG = Path(__file__).resolve().parents[1] / "rpg"


def module_name(path: Path, root: Path) -> str:
    """`rpg/preflight/doctor.py` -> `rpg.preflight.doctor`; a folder's `__init__.py` is the folder."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.AST, package: str, modules: set[str]) -> list[str]:
    """The rpg modules an import statement imports (`from rpg.x import y`: rpg.x.y if it is a module, else rpg.x)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {imported rpg module: line of the first such import} for every module under `root`."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, package, set(paths)):
                    if target.split(".")[0] == root.name and target != name:
                        edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def arrows_up(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import of a module on a higher floor than the importer's (floor 0 is the top)."""
    found = []
    for name, edges in graph.items():
        for target, line in edges.items():
            up, own = floor_of(target), floor_of(name)
            if up is not None and own is not None and up < own:
                above, own = FLOORS[up].name, FLOORS[own].name
                found.append(f"{name}:{line} imports {target} (floor {above!r} is above {own!r})")
    return found


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph(RPG)


def test_every_module_has_a_floor(graph):
    missing = [name for name in graph if floor_of(name) is None]
    assert not missing, f"add these modules to a floor of rpg/floors.py (FLOORS): {missing}"


def test_no_module_imports_a_higher_floor(graph):
    floors = "; ".join(f"{i} {f.name}" for i, f in enumerate(FLOORS))
    assert not arrows_up(graph), "\n".join(arrows_up(graph)) + f"\nfloors (0 is the top): {floors}"


def test_no_import_cycles(graph):
    assert not cycles(graph), cycles(graph)


def test_preflight_never_imports_launch(graph):
    """The one arrow up there was (doctor composed through rpg.launch): named on its own."""
    up = {name: edges for name, edges in graph.items() if name.startswith("rpg.preflight") and "rpg.launch" in edges}
    assert not up, up


MUTANTS = {
    "function-local arrow up": ("preflight/doctor.py", "def f():\n    from rpg.launch import main\n"),
    "relative arrow up": ("preflight/doctor.py", "from ..launch import main\n"),
    "plain import up": ("divergences.py", "import rpg.losses\n"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_check_sees_a_mutant(tmp_path, mutant):
    """A copy of rpg/ with one import added: the floor check names it (the layer test can fail)."""
    rel, code = MUTANTS[mutant]
    copy = tmp_path / "rpg"
    for path in RPG.rglob("*.py"):
        (copy / path.relative_to(RPG)).parent.mkdir(parents=True, exist_ok=True)
        (copy / path.relative_to(RPG)).write_text(path.read_text())
    (copy / rel).write_text((copy / rel).read_text() + code)
    found = arrows_up(import_graph(copy))
    assert len(found) == 1 and found[0].startswith(module_name(copy / rel, copy)), found


def test_the_check_sees_a_cycle():
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []
