"""Package versions: halyard-* ranges admit the current versions; ``halyard --version`` lists them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from halyard.train.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import wheelhouse  # tools/wheelhouse.py, what make wheels runs


def test_every_halyard_range_admits_the_current_version() -> None:
    packages = wheelhouse.read_packages()
    assert len(packages) == 7, sorted(packages)
    assert wheelhouse.range_errors(packages) == []


def _write_package(folder: Path, name: str, version: str, dependencies: list[str]) -> None:
    folder.mkdir(parents=True)
    listed = ", ".join(f'"{d}"' for d in dependencies)
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "{version}"\ndependencies = [{listed}]\n'
    )


@pytest.mark.parametrize(
    ("dependency", "complaint"),
    [
        ("halyard-named", "needs a lower and an upper bound"),
        ("halyard-named>=0.2", "needs a lower and an upper bound"),
        ("halyard-named>=0.2,<0.3", "excludes halyard-named 0.3.0"),
        ("halyard-nmaed>=0.3,<0.4", "names no package"),
    ],
)
def test_a_bad_range_is_refused_naming_the_file(tmp_path: Path, dependency: str, complaint: str) -> None:
    _write_package(tmp_path / "named", "halyard-named", "0.3.0", ["jax>=0.7"])
    _write_package(tmp_path / "shard", "halyard-shard", "0.3.0", [dependency, "numpy"])
    errors = wheelhouse.range_errors(wheelhouse.read_packages(tmp_path))
    assert len(errors) == 1 and complaint in errors[0], errors
    assert str(tmp_path / "shard" / "pyproject.toml") in errors[0]


def test_a_good_range_passes(tmp_path: Path) -> None:
    _write_package(tmp_path / "named", "halyard-named", "0.3.1", [])
    _write_package(tmp_path / "shard", "halyard-shard", "0.3.0", ["halyard-named>=0.3,<0.4"])
    packages = wheelhouse.read_packages(tmp_path)
    assert wheelhouse.range_errors(packages) == []
    assert wheelhouse.halyard_closure(packages, "halyard-shard") == {"halyard-shard", "halyard-named"}


def test_halyard_version_prints_every_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines())
    expected = {name: str(package.version) for name, package in wheelhouse.read_packages().items()}
    assert printed == expected


def test_the_readme_install_table_matches_the_packages() -> None:
    rows = {
        line.split("|")[1].split()[0]: line
        for line in (wheelhouse.ROOT / "README.md").read_text().splitlines()
        if line.startswith("| halyard-")
    }
    packages = wheelhouse.read_packages()
    assert sorted(rows) == sorted(packages)
    for name, package in packages.items():
        row = rows[name]
        assert f"| {name} {package.version} |" in row, (
            f"README.md's install table: {row} (version {package.version})"
        )
        needed = sorted(canonicalize_name(r.name) for r in package.halyard_requirements)
        named = [other for other in packages if other != name and other in row.split("|")[2]]
        assert needed == sorted(named) or (len(needed) == 6 and "all six" in row), (name, needed, row)
