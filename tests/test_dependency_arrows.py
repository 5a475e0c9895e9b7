"""The package arrows of DESIGN.md hold: no module imports a package above its own.

Order: named < shard < models < export < serve < train; data-cache (halyard.data) imports none of the jax
packages, nor jax itself, so a PyTorch user can adopt it alone.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from module_imports import file_imports  # tools/module_imports.py: every import of a file, at any depth

ROOT = Path(__file__).resolve().parents[1]

# folder -> (import name, halyard packages it may import)
ALLOWED = {
    "named": ("named", {"named"}),
    "shard": ("shard", {"named", "shard"}),
    "data-cache": ("data", {"data"}),
    "models": ("models", {"named", "shard", "models"}),
    "export": ("export", {"named", "shard", "models", "export"}),
    "serve": ("serve", {"named", "shard", "data", "models", "export", "serve"}),
    "train": ("train", {"named", "shard", "data", "models", "export", "serve", "train"}),
}
DISTRIBUTION = {
    "named": "halyard-named",
    "shard": "halyard-shard",
    "data": "halyard-data-cache",
    "models": "halyard-models",
    "export": "halyard-export",
    "serve": "halyard-serve",
    "train": "halyard-train",
}
JAX_MODULES = {"jax", "jaxlib", "equinox", "optax", "flax", "orbax"}


def _imports(path: Path) -> list[tuple[str, int]]:
    return [(found.module, found.line) for found in file_imports(path)]


def _package_dirs() -> list[Path]:
    return sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())


def test_known_packages_only() -> None:
    for folder in _package_dirs():
        assert folder.name in ALLOWED, f"packages/{folder.name} is not in the dependency table of this test"


@pytest.mark.parametrize("folder", [p.name for p in _package_dirs()])
def test_no_upward_imports(folder: str) -> None:
    _, allowed = ALLOWED[folder]
    source = ROOT / "packages" / folder / "src" / "halyard"
    assert not (source / "__init__.py").exists(), "halyard is a PEP 420 namespace: no src/halyard/__init__.py"
    violations = []
    for path in sorted(source.rglob("*.py")):
        for module, line in _imports(path):
            parts = module.split(".")
            if parts[0] == "halyard" and len(parts) > 1 and parts[1] not in allowed:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
            if folder == "data-cache" and parts[0] in JAX_MODULES:
                violations.append(
                    f"{path.relative_to(ROOT)}:{line} imports {module} (halyard.data must not need jax)"
                )
    assert not violations, "Upward imports:\n" + "\n".join(violations)


@pytest.mark.parametrize("folder", [p.name for p in _package_dirs()])
def test_declared_dependencies_cover_imports(folder: str) -> None:
    """Each halyard package imported by a package is in its pyproject dependencies."""
    own, _ = ALLOWED[folder]
    meta = tomllib.loads((ROOT / "packages" / folder / "pyproject.toml").read_text())
    declared = {d.split(">")[0].split("=")[0].split("[")[0].strip() for d in meta["project"]["dependencies"]}
    used = set()
    for path in (ROOT / "packages" / folder / "src" / "halyard").rglob("*.py"):
        for module, _ in _imports(path):
            parts = module.split(".")
            if parts[0] == "halyard" and len(parts) > 1 and parts[1] != own:
                used.add(DISTRIBUTION[parts[1]])
    missing = used - declared
    assert not missing, f"packages/{folder}/pyproject.toml does not declare {sorted(missing)}"
