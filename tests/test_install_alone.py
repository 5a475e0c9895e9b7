"""Each foundation package installs into a fresh virtual environment without the others."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _fresh_venv(tmp_path: Path) -> Path:
    venv.create(tmp_path / "env", with_pip=True)
    return tmp_path / "env" / "bin" / "python"


def _run(python: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("folder", "module", "absent"),
    [
        ("named", "halyard.named", ["halyard.shard", "halyard.models", "halyard.train"]),
        ("data-cache", "halyard.data", ["jax", "halyard.named"]),
    ],
)
def test_package_installs_alone(tmp_path: Path, folder: str, module: str, absent: list[str]) -> None:
    if not (ROOT / "packages" / folder / "pyproject.toml").exists():
        pytest.fail(f"packages/{folder} is missing")
    python = _fresh_venv(tmp_path)
    install = _run(python, "-m", "pip", "install", "--quiet", str(ROOT / "packages" / folder))
    assert install.returncode == 0, install.stdout + install.stderr
    probe = (
        f"import importlib, importlib.util, sys\n"
        f"importlib.import_module({module!r})\n"
        f"present = [m for m in {absent!r} if importlib.util.find_spec(m.split('.')[0]) and "
        f"(m.count('.') == 0 or importlib.util.find_spec(m))]\n"
        f"sys.exit('also installed: ' + ', '.join(present) if present else 0)\n"
    )
    result = _run(python, "-c", probe)
    assert result.returncode == 0, result.stdout + result.stderr
