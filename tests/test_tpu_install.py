"""tools/tpu_install.py: Halyard's wheels install offline into a target folder, and the printed exports make
the `train` command and the packages of that folder the ones a shell finds (no network, no index here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import tpu_install  # noqa: E402  (tools/tpu_install.py)


def test_the_wheels_install_offline_and_the_exports_find_them(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = tpu_install.build(wheels, download=False)
    assert sorted(path.name.split("-")[0] for path in built) == sorted(
        "halyard_" + folder.name.replace("-", "_")
        for folder in (ROOT / "packages").iterdir()
        if folder.is_dir()
    )
    script = [sys.executable, str(ROOT / "tools" / "tpu_install.py"), "install", "--wheels", str(wheels)]
    target = tmp_path / "site"
    installed = subprocess.run(
        [*script, "--target", str(target), "--index-url", "none"], capture_output=True, text=True, timeout=300
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert installed.stdout == tpu_install.exports(target) + "\n"
    # what `eval "$(... install)"` does, then the installed command and modules
    shell = (
        f"{installed.stdout}\n"
        "command -v train\n"
        "python -c 'import halyard.shard, halyard.train.cli; print(halyard.train.cli.__file__)'\n"
    )
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", PYTHONPATH="/machine")
    found = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120, env=env)
    assert found.returncode == 0, found.stderr[-3000:]
    assert found.stdout.splitlines() == [
        str(target / "carried" / "bin" / "train"),
        str(target / "carried" / "halyard" / "train" / "cli.py"),
    ]
    again = subprocess.run(
        [*script, "--target", str(target), "--index-url", "none"], capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and "already installed" in again.stderr


def test_what_is_missing_is_said_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(
        SystemExit, match=r"holds no wheels: run `tools/tpu_install.py build` where pip works"
    ):
        tpu_install.install(tmp_path, tmp_path / "site", None)
    (tmp_path / "x-1-py3-none-any.whl").write_bytes(b"")
    with pytest.raises(SystemExit, match=r"--index-url file:///no/index: no such folder here"):
        tpu_install.install(tmp_path, tmp_path / "site", "file:///no/index")


def test_what_is_carried_is_what_neither_the_machine_nor_its_index_holds() -> None:
    carried = {line.split("==")[0] for line in tpu_install.carried_requirements()}
    # Halyard's direct needs the machine lacks (../shared/TPU.md), and what they need in turn
    assert {"equinox", "draccus", "fastapi", "uvicorn", "math-verify", "zstandard", "xxhash"} <= carried
    assert {"pydantic-core", "starlette", "typing-inspect", "wadler-lindig"} <= carried
    assert not carried & {tpu_install._canonical(name) for name in tpu_install.MACHINE + tpu_install.INDEX}
    assert "wandb" not in carried and not any(name.startswith("halyard-") for name in carried)
