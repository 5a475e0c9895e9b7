"""`tools/pytest_worker_life.py`: xdist workers retire after ``--worker-tests`` tests and fresh ones finish
the run; failures, ``-x`` and a crashed worker behave as without it. Each case runs pytest on a small
suite of its own in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SUITE = """
import os
import time
from pathlib import Path

import pytest


def running(pid):
    try:
        return Path(f"/proc/{{pid}}/stat").read_text().split(")")[-1].split()[0] not in "ZX"
    except OSError:
        return False


@pytest.mark.parametrize("index", range({count}))
def test_one(index):
    time.sleep({pause})
    log_path = Path(__file__).parent / "pids.txt"
    lines = log_path.read_text().splitlines() if log_path.exists() else []
    alive = sum(running(pid) for pid in {{int(line.split()[0]) for line in lines}} - {{os.getpid()}})
    with open(log_path, "a") as log:
        log.write(f"{{os.getpid()}} {{index}} {{alive}}\\n")
    if index in {failing}:
        assert False, f"test {{index}} fails"
    if index in {crashing}:
        os._exit(9)
"""


def run_suite(
    tmp_path: Path,
    *args: str,
    count: int = 12,
    failing: tuple[int, ...] = (),
    crashing: tuple[int, ...] = (),
    pause: float = 0.0,
) -> tuple[subprocess.CompletedProcess[str], list[tuple[int, int, int]]]:
    """Run a suite of ``count`` tests under ``pytest -p tools.pytest_worker_life``, each sleeping ``pause``
    seconds first; (result, (pid, test, other worker processes of the log still running))."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # keeps the repository's pytest settings out
    (tmp_path / "test_suite.py").write_text(
        SUITE.format(count=count, failing=failing, crashing=crashing, pause=pause)
    )
    # xdist alone of the installed plugins: each worker process then starts in half the CPU time (the others,
    # hypothesis, anyio, jaxtyping's, import what these tests never use; 7.1 -> 3.6 CPU s for a run of 6 workers)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTEST_ADDOPTS": "", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    plugins = ["-p", "xdist", "-p", "tools.pytest_worker_life", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *plugins, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = tmp_path / "pids.txt"
    runs = [tuple(map(int, line.split())) for line in log.read_text().splitlines()] if log.exists() else []
    return result, runs  # type: ignore[return-value]


@pytest.mark.parametrize("chunk", [[], ["--maxschedchunk", "2"]], ids=["default_shares", "small_shares"])
def test_workers_retire_after_their_tests_and_fresh_ones_finish_the_run(
    tmp_path: Path, chunk: list[str]
) -> None:
    result, runs = run_suite(tmp_path, "-n", "2", "--worker-tests", "3", *chunk, pause=0.3)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "12 passed" in result.stdout
    assert sorted(index for _, index, _ in runs) == list(range(12))
    # A retired worker's process ends when it retires, not with the run (each one left waiting kept its
    # memory): the last tests see the other live worker, and at most one more still ending.
    assert max(alive for _, _, alive in runs[-3:]) <= 2, runs
    tests_per_process: dict[int, int] = {}
    for pid, _, _ in runs:
        tests_per_process[pid] = tests_per_process.get(pid, 0) + 1
    assert max(tests_per_process.values()) <= 3
    assert len(tests_per_process) >= 4
    assert "crashed" not in result.stdout


def test_without_a_limit_the_workers_live_for_the_whole_run(tmp_path: Path) -> None:
    result, runs = run_suite(tmp_path, "-n", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert len({pid for pid, _, _ in runs}) <= 2


def test_a_failing_test_is_reported_and_the_rest_still_run(tmp_path: Path) -> None:
    result, runs = run_suite(tmp_path, "-n", "2", "--worker-tests", "2", failing=(4,))
    assert result.returncode == 1
    assert "1 failed, 11 passed" in result.stdout
    assert len(runs) == 12


def test_exitfirst_stops_the_run_without_starting_workers_for_ever(tmp_path: Path) -> None:
    result, runs = run_suite(tmp_path, "-n", "2", "--worker-tests", "2", "-x", count=40, failing=(3,))
    assert result.returncode == 2  # xdist's "Interrupted: stopping after 1 failures", as without the limit
    assert "1 failed" in result.stdout
    assert len(runs) < 40


def test_a_crashed_worker_is_replaced_and_its_test_reported(tmp_path: Path) -> None:
    result, runs = run_suite(tmp_path, "-n", "2", "--worker-tests", "3", crashing=(5,))
    assert result.returncode == 1
    assert "crashed while running" in result.stdout
    assert "1 failed, 11 passed" in result.stdout
    assert sorted({index for _, index, _ in runs}) == list(range(12))


def test_a_limit_below_two_is_refused(tmp_path: Path) -> None:
    result, _ = run_suite(tmp_path, "-n", "2", "--worker-tests", "1")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "--worker-tests 1: give 0 (no limit) or at least 2" in result.stdout + result.stderr


def test_make_test_bounds_the_workers_life() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert "-p tools.pytest_worker_life --worker-tests " in makefile
    assert "--reruns" not in makefile
