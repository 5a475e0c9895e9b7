"""Each package's public API is what its ``__init__`` files export; removing a name is a visible change.

The names are listed in tests/public_api.json (a package -> module -> names snapshot). After an intended
change, regenerate it with ``HALYARD_UPDATE_PUBLIC_API=1 .venv/bin/python -m pytest tests/test_public_api.py``
and follow docs/versioning.md: a removed or renamed name is a breaking change (bump the package's minor
version while it is 0.x, widen no range, and say so in its CHANGELOG.md); an added name is a feature.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import wheelhouse  # tools/wheelhouse.py: the packages and their folders

SNAPSHOT = Path(__file__).with_name("public_api.json")
UPDATE = os.environ.get("HALYARD_UPDATE_PUBLIC_API") == "1"


def public_modules() -> dict[str, list[str]]:
    """Distribution name -> the modules of its ``__init__.py`` files (``halyard.named``, ``halyard.named.nn``)."""
    modules = {}
    for name, package in wheelhouse.read_packages().items():
        src = package.folder / "src"
        modules[name] = sorted(".".join(p.parent.relative_to(src).parts) for p in src.rglob("__init__.py"))
    return modules


def exported_names(module: ModuleType) -> list[str]:
    """``__all__``, or where a module has none, its public attributes that are not submodules."""
    if hasattr(module, "__all__"):
        return sorted(module.__all__)
    return sorted(
        n for n, v in vars(module).items() if not n.startswith("_") and not isinstance(v, ModuleType)
    )


def current_api() -> dict[str, dict[str, list[str]]]:
    return {
        package: {name: exported_names(importlib.import_module(name)) for name in names}
        for package, names in public_modules().items()
    }


def test_public_api_matches_the_snapshot() -> None:
    current = current_api()
    if UPDATE:
        SNAPSHOT.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(SNAPSHOT.read_text())
    changes = []
    for package in sorted(set(current) | set(recorded)):
        now, before = current.get(package, {}), recorded.get(package, {})
        for module in sorted(set(now) | set(before)):
            removed = sorted(set(before.get(module, [])) - set(now.get(module, [])))
            added = sorted(set(now.get(module, [])) - set(before.get(module, [])))
            if module not in now:
                changes.append(f"{package}: module {module} removed (breaking)")
            elif module not in before:
                changes.append(f"{package}: module {module} added: {', '.join(now[module]) or 'no names'}")
            if removed and module in now:
                changes.append(f"{package}: {module} no longer exports {', '.join(removed)} (breaking)")
            if added and module in before:
                changes.append(f"{package}: {module} now also exports {', '.join(added)}")
    assert not changes, (
        "the public API changed:\n  " + "\n  ".join(changes) + "\nIf intended: bump the version as "
        "docs/versioning.md says, note it in the package's CHANGELOG.md and regenerate the snapshot with "
        "HALYARD_UPDATE_PUBLIC_API=1 .venv/bin/python -m pytest tests/test_public_api.py"
    )


@pytest.mark.parametrize("package", sorted(public_modules()))
def test_every_exported_name_exists(package: str) -> None:
    for name in public_modules()[package]:
        module = importlib.import_module(name)
        exported = list(getattr(module, "__all__", []))
        missing = [n for n in exported if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ lists {missing}, which {name} does not define"
        assert len(exported) == len(set(exported)), f"{name}.__all__ lists a name twice"
