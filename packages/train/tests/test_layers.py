"""halyard-train's layers hold: no module imports a layer above its own, and no modules import each other
in a loop; imports inside functions and under ``TYPE_CHECKING`` count like the others.

The layers, bottom to top, are written down in docs/train/internals.md ("The layers").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "halyard.train"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("config",)),
    (
        "components",
        (
            "user_errors",
            "checkpoint",
            "optim",
            "trackers",
            "perf",
            "corpora",
            "plot",
            "plot_layers",
            "step",
            "invariant",
            "watch",
        ),
    ),
    (
        "schema",
        (
            "run_config",
            "eval_config",
            "builtin_configs",
            "mixture.config",
            "objectives.config",
            "doremi.config",
            "rl.config",
            "rl.spec",
        ),
    ),
    ("data", ("data_assembly", "mixture", "rl.prompts")),
    ("features", ("lora", "objectives", "doremi", "rl")),
    ("run", ("run",)),
    ("harness", ("harness",)),
    ("trainer", ("trainer", "rl.session", "rl.loop", "rl.fit")),
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


LAZY_THIRD_PARTY = {
    "torch": "optional (tests, Hugging Face parity)",
    "peft": "optional",
    "ray": "optional",
    "lm_eval": "optional (halyard eval --tasks)",
    "wandb": "heavy, only with the wandb tracker",
    "tensorboardX": "heavy, only with the tensorboard tracker",
    "matplotlib": "heavy, only for halyard plot",
    "draccus": "halyard.train.optim and its config classes import without it",
    "math_verify": "heavy (sympy), only with the math reward",
    "latex2sympy2_extended": "heavy (sympy), only with the math reward",
}
"""Packages a function may import where it uses them, and why."""

LAZY_HALYARD = {
    "halyard.train.user_errors": "the `halyard` CLI starts without importing jax (`halyard configs`, --help)",
    "halyard.train.trainer.harness_eval": "halyard.train.harness imports lm_eval, an optional install",
    "halyard.train.commands.evaluate": "halyard.train.harness imports lm_eval, an optional install",
    "halyard.train.checkpoint.preemption": "`train` installs the Ctrl-C / SIGTERM handler before jax is imported",
    "halyard.train.commands.serve": "`halyard serve` starts JAX's backend, then imports the server and the "
    "checkpoint readers while it starts (issue 53)",
}
"""Modules of halyard-train that may import Halyard modules inside a function, and why."""


def imports_inside_functions(path: Path) -> list[tuple[str, int]]:
    found = []
    for function in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    found += [(alias.name, node.lineno) for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    found.append((node.module, node.lineno))
    return found


def test_imports_inside_functions_only_for_optional_or_heavy_packages() -> None:
    """An import inside a function hides a dependency from the layer checks' reader: kept only for the
    reasons of `LAZY_THIRD_PARTY` and `LAZY_HALYARD`."""
    wrong = []
    for name, path in modules().items():
        for module, line in imports_inside_functions(path):
            top = module.split(".")[0]
            allowed = name in LAZY_HALYARD if top == "halyard" else top in LAZY_THIRD_PARTY
            if not allowed:
                wrong.append(f"{path.relative_to(SOURCE)}:{line} imports {module} inside a function")
    assert not wrong, "\n".join(wrong)


def test_functions_are_short() -> None:
    """No function of halyard-train over 80 lines; ``Trainer.fit`` (the loop a reader starts from) at most 60."""
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                limit = 60 if (name, node.name) == ("halyard.train.trainer.trainer", "fit") else 80
                if lines > limit:
                    long.append(f"{path.relative_to(SOURCE)}:{node.lineno} {node.name} has {lines} lines")
    assert not long, "\n".join(long)
