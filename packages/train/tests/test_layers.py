"""halyard-train's layers hold: no module imports a layer above its own, and no modules import each other
in a loop; imports inside functions and under ``TYPE_CHECKING`` count like the others.

The layers, bottom to top, are written down in packages/train/README.md ("Inside halyard-train").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "halyard.train"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("config",)),
    ("components", ("user_errors", "checkpoint", "optim", "trackers", "perf", "corpora", "plot", "step")),
    (
        "schema",
        (
            "run_config",
            "eval_config",
            "builtin_configs",
            "mixture.config",
            "objectives.config",
        ),
    ),
    ("data", ("data_assembly", "mixture")),
    ("features", ("lora", "objectives")),
    ("run", ("run",)),
    ("harness", ("harness",)),
    ("trainer", ("trainer",)),
    ("commands", ("commands", "plan", "cli", "")),
]
"""(layer, the modules in it as prefixes below ``halyard.train``); the longest matching prefix wins, and
``""`` is ``halyard.train`` itself (its public names)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((SOURCE / "halyard" / "train").rglob("*.py"))}


def layer_of(module: str) -> int:
    """The index in `LAYERS` of ``module`` (a full name under ``halyard.train``)."""
    relative = module.removeprefix(PACKAGE).removeprefix(".")
    best, best_length = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = relative == prefix or relative.startswith(prefix + ".") or prefix == ""
            if matches and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    assert best is not None, f"{module} is in no layer of LAYERS: add it"
    return best


def imported_modules(path: Path, known: set[str]) -> list[tuple[str, int]]:
    """The ``halyard.train`` modules ``path`` imports anywhere (a name imported from a package counts as
    its submodule when it is one), with the line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.append((submodule if submodule in known else node.module, node.lineno))
    return [(name, line) for name, line in found if name == PACKAGE or name.startswith(PACKAGE + ".")]


def import_graph() -> dict[str, set[str]]:
    known = set(modules())
    return {
        name: {m for m, _ in imported_modules(path, known) if m != name} for name, path in modules().items()
    }


def test_every_module_has_a_layer() -> None:
    for name in modules():
        layer_of(name)


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_import_from_a_layer_above(name: str) -> None:
    path = modules()[name]
    own = layer_of(name)
    upward = [
        f"{path.relative_to(SOURCE)}:{line} imports {target} ({LAYERS[layer_of(target)][0]} is above "
        f"{LAYERS[own][0]})"
        for target, line in imported_modules(path, set(modules()))
        if layer_of(target) > own
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycles() -> None:
    graph = import_graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checks_see_a_cycle_and_an_upward_import(tmp_path: Path) -> None:
    """The rules above fail on what they forbid (the trainer importing a command; a loop)."""
    assert layer_of("halyard.train.trainer.trainer") < layer_of("halyard.train.commands.generate")
    assert layer_of("halyard.train.step") < layer_of("halyard.train.run.setup")
    assert layer_of("halyard.train.mixture.config") < layer_of("halyard.train.mixture.build")
    source = tmp_path / "loop.py"
    source.write_text("def f():\n    from halyard.train.run.setup import RunSetup\n")
    assert imported_modules(source, set(modules())) == [("halyard.train.run.setup", 2)]
