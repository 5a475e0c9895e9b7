"""The data assembly layer imports only what its README allows (counting imports inside functions), and its
modules import each other without a loop."""

from __future__ import annotations

import ast
from pathlib import Path

LAYER = Path(__file__).resolve().parents[1] / "src" / "halyard" / "train" / "data_assembly"
ALLOWED = (
    "halyard.train.data_assembly",
    "halyard.train.config",
    "halyard.train.user_errors",
    "halyard.train.checkpoint",
    "halyard.train.corpora",
    "halyard.train.perf",
    "halyard.train.trackers",
    "halyard.train.run_config",
    "halyard.train.mixture.config",
    "halyard.train.eval_config",
    "halyard.train.objectives.config",
    "halyard.train.model_section",
)


def train_imports(path: Path) -> set[str]:
    """Every ``halyard.train`` module that ``path`` imports, at the top or inside a function (for ``from M
    import N``: both M and M.N)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)  # and each name, which may be a module: from package import module
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name == "halyard.train" or name.startswith("halyard.train.")}


def test_the_layer_imports_only_its_own_modules_the_layers_below_and_lower_packages() -> None:
    forbidden = {
        f"{path.name} -> {name}"
        for path in LAYER.glob("*.py")
        for name in train_imports(path)
        if not any(name == allowed or name.startswith(f"{allowed}.") for allowed in ALLOWED)
    }
    assert not forbidden, f"data_assembly imports above layer 2: {sorted(forbidden)}"


def test_the_layer_modules_import_each_other_without_a_loop() -> None:
    prefix = "halyard.train.data_assembly."
    graph = {
        path.stem: {
            name.removeprefix(prefix).split(".")[0] for name in train_imports(path) if name.startswith(prefix)
        }
        for path in LAYER.glob("*.py")
    }
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import loop: {' -> '.join((*path, module))}"
        if module not in done:
            for imported in graph.get(module, set()):
                visit(imported, (*path, module))
            done.add(module)

    for module in graph:
        visit(module, ())
    assert graph["mixture_build"] >= {"single_source"} and "run_data" not in graph["mixture_build"]
