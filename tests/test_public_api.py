"""Each package's public API is what its ``__init__`` files export; removing a name is a visible change.

tests/public_api.json records, per package, the version it was taken at and the names each ``__init__``
exports. A name that disappears fails the test unless the package's version was bumped as for a breaking
change (docs/versioning.md: the next minor while 0.x); a new name is a feature and only warns. A release
regenerates the snapshot: ``HALYARD_UPDATE_PUBLIC_API=1 .venv/bin/python -m pytest tests/test_public_api.py``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest
from packaging.version import Version

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


def current_api() -> dict[str, dict]:
    """Distribution name -> its version and, per ``__init__`` module, the names it exports."""
    return {
        package: {
            "version": str(wheelhouse.read_packages()[package].version),
            "exports": {name: exported_names(importlib.import_module(name)) for name in names},
        }
        for package, names in public_modules().items()
    }


def api_changes(before: dict[str, list[str]], now: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """(removed, added): modules and ``module.name`` entries of ``before`` missing in ``now``, and the reverse."""
    removed, added = [], []
    for module in sorted(set(before) | set(now)):
        if module not in now:
            removed.append(f"module {module}")
        elif module not in before:
            added.append(f"module {module} ({', '.join(now[module]) or 'no names'})")
        else:
            removed += [f"{module}.{name}" for name in sorted(set(before[module]) - set(now[module]))]
            added += [f"{module}.{name}" for name in sorted(set(now[module]) - set(before[module]))]
    return removed, added


def is_breaking_bump(old: Version, new: Version) -> bool:
    """Whether ``old`` -> ``new`` is allowed to break: a new major, or a new minor while 0.x."""
    return new.major > old.major or (new.major == old.major == 0 and new.minor > old.minor)


def next_breaking(version: Version) -> str:
    """The first version allowed to break ``version``'s API."""
    return f"0.{version.minor + 1}.0" if version.major == 0 else f"{version.major + 1}.0.0"


if UPDATE:
    SNAPSHOT.write_text(json.dumps(current_api(), indent=1, sort_keys=True) + "\n")
RECORDED = json.loads(SNAPSHOT.read_text())


def test_the_snapshot_lists_every_package() -> None:
    assert sorted(RECORDED) == sorted(public_modules()), f"regenerate {SNAPSHOT.name}: {__doc__}"


@pytest.mark.parametrize("package", sorted(public_modules()))
def test_no_public_name_disappears_without_a_breaking_version(package: str) -> None:
    current, recorded = current_api()[package], RECORDED.get(package, {"version": "0", "exports": {}})
    removed, added = api_changes(recorded["exports"], current["exports"])
    if added:  # a feature: allowed in any release; the snapshot is regenerated when it is released
        warnings.warn(
            f"{package} exports new names since {recorded['version']}: {', '.join(added)}", stacklevel=1
        )
    old, new = Version(recorded["version"]), Version(current["version"])
    assert not removed or is_breaking_bump(old, new), (
        f"{package} {new} no longer exports {', '.join(removed)}, which {old} did: a breaking change. "
        f"Restore them, or bump the version as docs/versioning.md says (to {next_breaking(old)}), "
        f"move the ranges of the packages above it, note it under '### Breaking' in its CHANGELOG.md, and "
        f"regenerate {SNAPSHOT.name} with HALYARD_UPDATE_PUBLIC_API=1 .venv/bin/python -m pytest tests/{Path(__file__).name}"
    )


def test_version_rule() -> None:
    assert is_breaking_bump(Version("0.2.3"), Version("0.3.0"))
    assert not is_breaking_bump(Version("0.2.0"), Version("0.2.5"))
    assert is_breaking_bump(Version("1.4.0"), Version("2.0.0")) and not is_breaking_bump(
        Version("1.4.0"), Version("1.5.0")
    )
    assert next_breaking(Version("0.2.3")) == "0.3.0" and next_breaking(Version("1.4.0")) == "2.0.0"
    assert api_changes({"m": ["a", "b"], "gone": []}, {"m": ["b", "c"], "new": ["x"]}) == (
        ["module gone", "m.a"],
        ["m.c", "module new (x)"],
    )


@pytest.mark.parametrize("package", sorted(public_modules()))
def test_every_exported_name_exists(package: str) -> None:
    for name in public_modules()[package]:
        module = importlib.import_module(name)
        exported = list(getattr(module, "__all__", []))
        missing = [n for n in exported if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ lists {missing}, which {name} does not define"
        assert len(exported) == len(set(exported)), f"{name}.__all__ lists a name twice"


ENTRY_MODULES = {"halyard.train", "halyard.train.cli", "halyard.train.harness"}
"""What the guides and READMEs may import from halyard-train: its public names, the command line run
in-process, and the lm-eval harness adapter."""


def test_guides_and_readmes_import_halyard_train_from_its_public_entry_points() -> None:
    root = Path(__file__).resolve().parents[1]
    documents = [*sorted((root / "docs" / "guides").glob("*.py")), root / "README.md"]
    documents += sorted((root / "packages").glob("*/README.md")) + sorted((root / "docs").rglob("*.md"))
    found = []
    for path in documents:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            words = line.split()
            imports = (
                len(words) >= 2 and words[0] in ("from", "import") and words[1].startswith("halyard.train")
            )
            if imports and words[1] not in ENTRY_MODULES:
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not found, "import these from halyard.train instead:\n" + "\n".join(found)


def test_halyard_train_keeps_a_small_public_surface_with_what_users_type() -> None:
    exports = json.loads(SNAPSHOT.read_text())["halyard-train"]["exports"]
    assert sum(len(names) for names in exports.values()) <= 40, "halyard-train exports more than ~40 names"
    wanted = {"Trainer", "TrainConfig", "parse_config", "load_run_model", "load_run_config", "load_hf_model"}
    assert wanted <= set(exports["halyard.train"])
    assert set(current_api()["halyard-train"]["exports"]["halyard.train"]) == set(exports["halyard.train"])
