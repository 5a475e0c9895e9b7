"""No import circles between the modules of one package: every package's modules form layers.

A circle (a.py imports b.py, which imports a.py, directly or through others) means a piece both sides
need lives on the wrong side of one of them: move it down into a module both can import. Function-level
(lazy) imports and imports under ``if TYPE_CHECKING:`` count, since they tie the modules together as much.

An import names the module it loads: ``from halyard.named import reductions`` is an arrow to
``halyard.named.reductions`` (a submodule), ``from halyard.named import NamedArray`` one to the package's
``__init__.py``. Loading a module also runs its parents' ``__init__.py``; that implicit step is not an
arrow (every module would otherwise be in a circle with the package face that re-exports it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from module_imports import file_imports  # tools/module_imports.py: every import of a file, at any depth

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())
Arrow = tuple[str, str, int]  # (importing module, imported module, line)


def package_modules(folder: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages/<folder>`` (a package is its __init__)."""
    source = ROOT / "packages" / folder / "src"
    modules = {}
    for path in sorted(source.rglob("*.py")):
        parts = path.relative_to(source).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_arrows(modules: dict[str, Path]) -> list[Arrow]:
    """Every import between two of ``modules``, resolved to the module it loads."""
    arrows = []
    for name, path in modules.items():
        for found in file_imports(path, name):
            targets = [f"{found.module}.{n}" for n in found.names if f"{found.module}.{n}" in modules]
            if len(targets) < len(found.names) or not found.names:
                targets.append(found.module)  # some names are attributes of the module itself
            arrows += [
                (name, target, found.line) for target in targets if target in modules and target != name
            ]
    return arrows


def circles(arrows: list[Arrow]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm), each sorted."""
    graph: dict[str, set[str]] = {}
    for source, target, _ in arrows:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def describe_circle(group: list[str], arrows: list[Arrow], modules: dict[str, Path]) -> str:
    """The circle's modules and each import that ties two of them (file:line -> module)."""
    members = set(group)
    ties = sorted({(s, t, line) for s, t, line in arrows if s in members and t in members})
    lines = [f"circle of {len(group)} modules: {', '.join(group)}"]
    lines += [f"  {modules[s].relative_to(ROOT)}:{line} imports {t}" for s, t, line in ties]
    return "\n".join(lines)


@pytest.mark.parametrize("folder", PACKAGES)
def test_no_import_circles(folder: str) -> None:
    modules = package_modules(folder)
    arrows = import_arrows(modules)
    found = [describe_circle(group, arrows, modules) for group in circles(arrows)]
    assert not found, (
        f"packages/{folder} has import circles; move what both sides share into a lower module:\n"
        + "\n".join(found)
    )


def test_a_circle_is_found_and_named() -> None:
    """The search itself: a lazy import that closes a loop is a circle, one that does not is not."""
    arrows = [("p.a", "p.b", 3), ("p.b", "p.c", 5), ("p.c", "p.a", 40), ("p.c", "p.d", 6)]
    assert circles(arrows) == [["p.a", "p.b", "p.c"]]
    assert circles(arrows[:2] + arrows[3:]) == []
