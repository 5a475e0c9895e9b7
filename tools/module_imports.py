"""What a Python file imports, read from its syntax tree: every import statement, wherever it stands.

Imports inside functions and under ``if TYPE_CHECKING:`` count like the others: a lazy import still ties
the two modules together. The tests of the package arrows (tests/test_dependency_arrows.py) and of import
circles (tests/test_import_circles.py) read imports through `file_imports`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """One imported module.

    Attributes:
        module: the dotted module name, absolute (``halyard.named.core``); a relative import is resolved
            against the importing module when its name is known, else skipped.
        line: the line of the import statement.
        names: for ``from module import a, b`` the names ``a`` and ``b`` (each may be a submodule); empty
            for ``import module``.
    """

    module: str
    line: int
    names: tuple[str, ...] = ()


def file_imports(path: Path, module_name: str | None = None) -> list[Import]:
    """Every import in ``path``, at any depth of the file.

    Args:
        path: a Python source file.
        module_name: the file's dotted module name (``halyard.named.core``; a package's ``__init__.py`` is
            the package itself), needed to resolve relative imports; without it they are skipped.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = None
    if module_name is not None:
        package = module_name if path.name == "__init__.py" else module_name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            if node.level == 0 and node.module:
                found.append(Import(node.module, node.lineno, names))
            elif node.level and package is not None:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
                found.append(Import(module, node.lineno, names))
    return found
