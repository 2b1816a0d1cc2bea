"""The two rules that hold the package's shape (docs/architecture.md, "Layers"): **``core/``
imports nothing of the package outside ``core/`` at run time**, so the Django-free core stays
importable by a Spark executor or a plain script; and **no import cycle in the package**.

Read from the source with ``ast``, not by importing it: every ``import`` statement counts
wherever it is (a function's body too, since it runs when the function does), except the body
of an ``if TYPE_CHECKING:`` block (types only: never run; its ``else`` runs). An import of a
package (``from django_delayqueue.core import Queue``) is an import of its ``__init__``; one
of a module through its package (``from django_delayqueue.core import running``), of that
module. Strings given to ``importlib`` are not read (only the root's lazy names use that).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import django_delayqueue

PACKAGE = "django_delayqueue"
CORE = f"{PACKAGE}.core"
SOURCE = Path(django_delayqueue.__file__).resolve().parent


@dataclass(frozen=True)
class Import:
    """One import statement of the package's modules that runs: ``importer`` needs
    ``imported``, at ``line`` of ``path``."""

    importer: str
    imported: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported}"


def package_modules(source: Path, package: str) -> dict[str, Path]:
    """Every module of the package under ``source`` (its folder) by dotted name; a package is
    its ``__init__.py``."""
    found = {}
    for path in sorted(source.rglob("*.py")):
        parts = [package, *path.relative_to(source).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` (not ``not TYPE_CHECKING``, nor a mix)."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def run_time_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of a module that can run: all but those in the body of an
    ``if TYPE_CHECKING:`` block."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def owner(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module that ``name`` is, or is defined in (its nearest enclosing module)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_modules(
    module: str, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Path]
) -> set[str]:
    """The package's modules that ``node`` (in ``module``) imports."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the module's package, one level up per extra dot
            package = module if modules[module].name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        # ``from p import m`` imports module p.m if there is one, else names defined in p.
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names
        ]
    found = set()
    for name in names:
        target = owner(name, modules)
        if target is not None and target != module:
            found.add(target)
    return found


def run_time_imports(source: Path, package: str) -> list[Import]:
    """Every run-time import of one module of the package by another, in file and line order."""
    modules = package_modules(source, package)
    found = []
    for module, path in modules.items():
        shown = f"{package}/{path.relative_to(source).as_posix()}"
        for node in run_time_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for target in sorted(imported_modules(module, node, modules)):
                found.append(Import(module, target, shown, node.lineno))
    return sorted(found, key=lambda i: (i.path, i.line, i.imported))


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def upward_imports(imports: list[Import], core: str) -> list[Import]:
    """The imports by a module of ``core`` of a module outside it (the root package included)."""
    return [i for i in imports if inside(i.importer, core) and not inside(i.imported, core)]


def strongly_connected(graph: Mapping[str, Mapping[str, Import]]) -> list[list[str]]:
    """The groups of two or more modules that each reach each other (Tarjan's algorithm,
    without recursion), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, {})))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return sorted(groups)


def one_cycle(group: list[str], graph: Mapping[str, Mapping[str, Import]]) -> list[Import]:
    """A shortest cycle through the group's first module, as the imports that close it."""
    members, start = set(group), group[0]
    came_by: dict[str, Import] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt, how in sorted(graph[node].items()):
            if nxt not in members or nxt in came_by:
                continue
            came_by[nxt] = how
            if nxt == start:
                path = [how]
                while path[0].importer != start:
                    path.insert(0, came_by[path[0].importer])
                return path
            queue.append(nxt)
    raise AssertionError(f"no cycle through {start}")  # a group's members reach each other


def import_cycles(imports: list[Import]) -> list[tuple[list[str], list[Import]]]:
    """Each group of modules that import each other in a circle, with one cycle through it."""
    graph: dict[str, dict[str, Import]] = {}
    for i in imports:
        graph.setdefault(i.importer, {}).setdefault(i.imported, i)  # an edge's first import
        graph.setdefault(i.imported, {})
    return [(group, one_cycle(group, graph)) for group in strongly_connected(graph)]


def short(module: str) -> str:
    return module.removeprefix(f"{PACKAGE}.")


def test_core_imports_nothing_outside_core_at_run_time() -> None:
    upward = upward_imports(run_time_imports(SOURCE, PACKAGE), CORE)
    if upward:
        pytest.fail(
            f"run-time imports from core/ of modules outside it: {len(upward)}. The Django-free "
            "core may import only itself (move what it needs into core/ and re-export it "
            "above, or import it under `if TYPE_CHECKING:` for types only):\n"
            + "\n".join(f"  {i}" for i in upward),
            pytrace=False,
        )


def test_no_import_cycle_in_the_package() -> None:
    cycles = import_cycles(run_time_imports(SOURCE, PACKAGE))
    lines = []
    for group, cycle in cycles:
        lines.append(f"  a cycle of {len(group)} modules: {', '.join(map(short, group))}")
        way = [short(i.importer) for i in cycle] + [short(cycle[0].importer)]
        lines.append(f"    one way round: {' -> '.join(way)}")
        lines.extend(f"      {i}" for i in cycle)
    if cycles:
        pytest.fail(
            f"import cycles in the package: {len(cycles)}. A module may not need, even "
            "through others, a module that needs it:\n" + "\n".join(lines),
            pytrace=False,
        )


def test_the_checks_read_what_runs(tmp_path: Path) -> None:
    """The checks themselves, on a small package: imports in functions and in the ``else`` of
    ``if TYPE_CHECKING:`` count, its body does not; relative imports and modules imported
    through their package are resolved; a cycle is found and shown with its lines."""
    pkg = tmp_path / "pkg"
    (pkg / "core").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "top.py": "from .core import low\n",
        "side.py": "X = 1\n",
        "core/__init__.py": "",
        "core/low.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from pkg import side\n"
            "else:\n"
            "    from pkg.side import X\n"
            "def f():\n"
            "    from .. import top\n"
        ),
        "core/alone.py": "import typing\nif typing.TYPE_CHECKING:\n    import pkg.top\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    imports = run_time_imports(pkg, "pkg")
    assert [str(i) for i in upward_imports(imports, "pkg.core")] == [
        "pkg/core/low.py:5: pkg.core.low imports pkg.side",
        "pkg/core/low.py:7: pkg.core.low imports pkg.top",
    ]
    ((group, cycle),) = import_cycles(imports)
    assert group == ["pkg.core.low", "pkg.top"]
    assert [str(i) for i in cycle] == [
        "pkg/core/low.py:7: pkg.core.low imports pkg.top",
        "pkg/top.py:1: pkg.top imports pkg.core.low",
    ]
