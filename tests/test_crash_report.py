"""`tools/pytest_crash_report.py`: a test worker that dies of a signal is reported at the end of the run with
the test it was running, the signal, its native and its Python stacks; one killed outright says so. A
small suite of its own runs under ``pytest -n 2`` in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SUITE = """
import faulthandler
import os
import signal


def test_passes():
    pass


def test_segfaults():
    import jax  # noqa: F401 - as the suite's workers do: jaxlib's native handler is there to write
    faulthandler._sigsegv()


def test_is_killed():
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_crashed_worker_is_reported_with_its_test_signal_and_stacks(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # keeps the repository's pytest settings out
    (tmp_path / "test_suite.py").write_text(SUITE)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "-p",
            "tools.pytest_crash_report",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTEST_ADDOPTS": ""},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 failed, 1 passed" in result.stdout, result.stdout
    # the section's title line (a crash's one-line message names the section too, in full where CI=true)
    summary = result.stdout.split("= crashed test workers =")[-1].split("short test summary info")[0]
    reports = {part.split("'")[3]: part for part in summary.split("\nworker ")[1:]}  # test id -> its report
    segfault, killed = reports["test_suite.py::test_segfaults"], reports["test_suite.py::test_is_killed"]
    assert "crashed while running 'test_suite.py::test_segfaults', signal SIGSEGV" in segfault
    assert "*** SIGSEGV received" in segfault and "AbslFailureSignalHandler" in segfault  # native stack
    assert 'test_suite.py", line 13 in test_segfaults' in segfault  # Python stack
    assert "crashed while running 'test_suite.py::test_is_killed', signal SIGKILL" in killed
    assert "nothing was written" in killed
