"""Each package installs alone from the wheelhouse into a fresh virtual environment and works there.

The wheelhouse is built once per pytest run (tools/wheelhouse.py, what ``make wheels`` runs). A fresh
environment gets ``pip install --no-index --find-links WHEELHOUSE halyard-<pkg>``; its third-party
dependencies are not downloaded again but linked from this environment: a ``.pth`` line points at a
folder holding only the distributions the package declares (and theirs), so an undeclared dependency
fails the smoke use, and the editable halyard installs of this environment stay invisible.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from run_wide import shared_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import wheelhouse  # tools/wheelhouse.py, what make wheels runs

ROOT = wheelhouse.ROOT
SMOKE = ROOT / "tests" / "install_alone"

PACKAGES = wheelhouse.read_packages()
# The module each distribution provides: packages/<folder>/src/halyard/<module>/.
MODULES = {
    name: "halyard." + next((package.folder / "src" / "halyard").iterdir()).name
    for name, package in PACKAGES.items()
}


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheelhouse, built by the first test worker that needs it (a file's tests may span workers)."""

    def build(out: Path) -> None:
        built = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "wheelhouse.py"), "--out", str(out)],
            capture_output=True,
            text=True,
        )
        assert built.returncode == 0, built.stdout + built.stderr

    return shared_folder(tmp_path_factory, "wheelhouse", build)[0]


def third_party_distributions(name: str) -> dict[str, importlib.metadata.Distribution]:
    """The distributions of this environment that ``name`` and its halyard dependencies need, transitively."""
    closure = wheelhouse.halyard_closure(PACKAGES, name)
    todo: list[tuple[Requirement, set[str]]] = [
        (requirement, {""}) for member in sorted(closure) for requirement in PACKAGES[member].requirements
    ]
    found: dict[str, importlib.metadata.Distribution] = {}
    extras_done: dict[str, set[str]] = {}
    while todo:
        requirement, parent_extras = todo.pop()
        key = canonicalize_name(requirement.name)
        if key.startswith("halyard-"):
            continue
        if requirement.marker and not any(requirement.marker.evaluate({"extra": e}) for e in parent_extras):
            continue
        wanted = {""} | set(requirement.extras)
        if wanted <= extras_done.get(key, set()):
            continue
        try:
            distribution = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{requirement} (needed by {name}) is not installed in {sys.prefix}: run make venv")
        assert requirement.specifier.contains(distribution.version, prereleases=True), (
            f"{requirement} (needed by {name}) but {sys.prefix} has {distribution.version}"
        )
        found[key] = distribution
        extras_done[key] = extras_done.get(key, set()) | wanted
        todo.extend((Requirement(r), wanted) for r in distribution.requires or [])
    return found


def link_third_party(distributions: dict[str, importlib.metadata.Distribution], folder: Path) -> None:
    """Symlink the top-level files and folders of ``distributions`` (modules and .dist-info) into ``folder``."""
    folder.mkdir()
    for distribution in distributions.values():
        for file in distribution.files or []:
            top = file.parts[0]
            if top in ("..", "__pycache__") or (folder / top).exists():
                continue
            (folder / top).symlink_to(Path(str(distribution.locate_file(top))))


def _run(*command: str | Path, devices: int = 8, **kwargs: object) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "VIRTUAL_ENV"} and not k.startswith("PIP_")
    }
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {os.environ.get('HALYARD_TEST_XLA_COMPILE_FLAGS', '')}",
    )
    # The smoke uses compile the same small model's many small programs: cache them all for the next one.
    env.update(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    result = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, env=env, timeout=600, **kwargs
    )  # type: ignore[call-overload]
    assert result.returncode == 0, (
        f"{' '.join(map(str, command))}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


def install_alone(name: str, wheels: Path, tmp_path: Path) -> Path:
    """A fresh environment with ``name`` installed from ``wheels``; returns its python."""
    env = tmp_path / "env"
    venv.create(env, with_pip=False, symlinks=True)
    python = env / "bin" / "python"
    site = Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))
    link_third_party(third_party_distributions(name), tmp_path / "third_party")
    (site / "third_party.pth").write_text(f"{tmp_path / 'third_party'}\n")
    report = tmp_path / "pip-report.json"
    _run(
        sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check", "install", "--quiet",
        "--no-index", "--find-links", wheels, "--report", report, name,
    )  # fmt: skip
    installed = {
        canonicalize_name(item["metadata"]["name"]) for item in json.loads(report.read_text())["install"]
    }
    # Only halyard wheels were installed: pip found every third-party dependency already satisfied.
    assert installed == wheelhouse.halyard_closure(PACKAGES, name), installed
    return python


PROBE = """
import importlib.metadata, importlib.util, json, sys
names = sorted(d.metadata["Name"] for d in importlib.metadata.distributions() if d.metadata["Name"].startswith("halyard-"))
modules = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None]
print(json.dumps({"distributions": names, "modules": modules}))
"""


# Bottom up, so that models' compiled programs are in the compilation cache when export uses the same model.
BOTTOM_UP = [
    "halyard-named",
    "halyard-shard",
    "halyard-data-cache",
    "halyard-models",
    "halyard-export",
    "halyard-serve",
    "halyard-train",
]


def test_every_package_has_an_install_alone_case() -> None:
    assert sorted(BOTTOM_UP) == sorted(PACKAGES)


@pytest.mark.slow
@pytest.mark.parametrize("name", BOTTOM_UP)
def test_package_installs_alone_and_works(name: str, wheels: Path, tmp_path: Path) -> None:
    python = install_alone(name, wheels, tmp_path)
    third_party = third_party_distributions(name)
    closure = wheelhouse.halyard_closure(PACKAGES, name)
    seen = json.loads(_run(python, "-c", PROBE, *MODULES.values(), "jax").stdout)
    assert seen["distributions"] == sorted(closure), f"installed beside {name}: {seen['distributions']}"
    expected = [MODULES[n] for n in MODULES if n in closure] + (["jax"] if "jax" in third_party else [])
    assert seen["modules"] == expected, seen["modules"]  # data-cache: not even jax

    work = tmp_path / "work"
    work.mkdir()
    if name == "halyard-train":
        versions = _run(env_bin(python, "halyard"), "--version").stdout.split("\n")
        assert versions[:-1] == [f"{n} {PACKAGES[n].version}" for n in sorted(closure)], versions
        _run(env_bin(python, "halyard"), "train", "--config", SMOKE / "train.yaml", devices=1, cwd=work)
        steps = [
            json.loads(line)["step"] for line in (work / "runs/alone/metrics.jsonl").read_text().splitlines()
        ]
        assert steps == [1, 2], steps
        assert (work / "runs/alone/checkpoints/step_00000002/halyard_checkpoint.json").is_file()
    else:
        script = SMOKE / (name.removeprefix("halyard-").replace("-", "_") + ".py")
        assert "ok" in _run(python, script, work, cwd=work).stdout


def env_bin(python: Path, command: str) -> Path:
    """A console script installed in ``python``'s environment."""
    return python.parent / command
