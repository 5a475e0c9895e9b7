"""Build the wheelhouse: a wheel and an sdist of every package under packages/, into one folder.

``python tools/wheelhouse.py --out dist`` (what ``make wheels`` runs) first checks that every
``halyard-*`` dependency carries a compatible range (``halyard-named>=0.2,<0.3``) that admits the
depended-on package's current version, then builds each package with ``python -m build`` (the sdist, then
the wheel from the sdist, so a file missing from the sdist fails here). ``--check`` only checks the ranges.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Package:
    """One package of the monorepo, as its pyproject.toml declares it."""

    name: str  # canonical distribution name, e.g. "halyard-named"
    version: Version
    folder: Path
    requirements: tuple[Requirement, ...]

    @property
    def halyard_requirements(self) -> tuple[Requirement, ...]:
        return tuple(r for r in self.requirements if canonicalize_name(r.name).startswith("halyard-"))


def read_packages(packages_dir: Path = ROOT / "packages") -> dict[str, Package]:
    """Every ``packages/*/pyproject.toml``, by canonical distribution name."""
    packages = {}
    for pyproject in sorted(packages_dir.glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        name = canonicalize_name(project["name"])
        packages[name] = Package(
            name=name,
            version=Version(project["version"]),
            folder=pyproject.parent,
            requirements=tuple(Requirement(r) for r in project.get("dependencies", [])),
        )
    return packages


def range_errors(packages: dict[str, Package]) -> list[str]:
    """One line per ``halyard-*`` dependency without a lower and an upper bound admitting the current version."""
    errors = []
    for package in packages.values():
        where = package.folder / "pyproject.toml"
        for requirement in package.halyard_requirements:
            target = packages.get(canonicalize_name(requirement.name))
            if target is None:
                errors.append(f"{where}: {requirement} names no package under packages/")
                continue
            operators = {spec.operator for spec in requirement.specifier}
            if not ({">=", "~=", "=="} & operators and {"<", "~=", "=="} & operators):
                errors.append(
                    f"{where}: {requirement} needs a lower and an upper bound, "
                    f'e.g. "{target.name}>={target.version.major}.{target.version.minor},'
                    f'<{target.version.major}.{target.version.minor + 1}"'
                )
            elif not requirement.specifier.contains(target.version, prereleases=True):
                errors.append(
                    f"{where}: {requirement} excludes {target.name} {target.version} "
                    f"({target.folder / 'pyproject.toml'}); widen the range or fix the version"
                )
    return errors


def halyard_closure(packages: dict[str, Package], name: str) -> set[str]:
    """``name`` and every halyard package it depends on, directly or not."""
    closure, todo = set(), [canonicalize_name(name)]
    while todo:
        current = todo.pop()
        if current not in closure:
            closure.add(current)
            todo.extend(canonicalize_name(r.name) for r in packages[current].halyard_requirements)
    return closure


def expected_files(package: Package) -> tuple[str, str]:
    """The wheel's and the sdist's file names for ``package``."""
    stem = f"{package.name.replace('-', '_')}-{package.version}"
    return f"{stem}-py3-none-any.whl", f"{stem}.tar.gz"


def build(out: Path, packages: dict[str, Package]) -> list[Path]:
    """Build every package's sdist and wheel into ``out`` (older halyard files there are removed first)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("halyard_*.whl"), *out.glob("halyard_*.tar.gz")]:
        stale.unlink()
    built = []
    for package in packages.values():
        command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(package.folder)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(
                f"building {package.folder} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
            )
        for file_name in expected_files(package):
            if not (out / file_name).is_file():
                raise SystemExit(f"building {package.folder} did not write {out / file_name}")
            built.append(out / file_name)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="wheelhouse folder (default: dist/)")
    parser.add_argument("--check", action="store_true", help="only check the halyard-* version ranges")
    args = parser.parse_args(argv)
    packages = read_packages()
    errors = range_errors(packages)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    if args.check:
        print(f"{len(packages)} packages: every halyard-* range admits the current version")
        return 0
    for path in build(args.out, packages):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
