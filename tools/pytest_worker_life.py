"""Test workers with a bounded life: each pytest-xdist worker process runs at most ``--worker-tests`` tests,
then hands its place to a fresh process.

Why: a test worker lives for the whole suite by default (hundreds of tests, thousands of compiled XLA
programs, 5-6 GB of resident memory by the end), and jaxlib's CPU runtime segfaulted such a long-lived
worker (in libgcc's unwinder, under executable serialization) in about one full run of four. A worker that
retires after a bounded number of tests never reaches that age, and the suite's memory stays bounded too.

How: `RetiringLoadScheduling` is xdist's ``--dist load`` scheduler that sends a worker at most the limit
of tests, then asks it to shut down once it has them (the worker finishes what it was sent, then ends
normally); when a retired worker ends while tests are still to be sent, `pytest_testnodedown` starts a
replacement the way xdist replaces a crashed worker, and the scheduler gives it the next tests. The retired
worker's process is ended then and there (xdist itself would end it only with the whole run: each one left
waiting kept its 5 GB, and the 7th worker of a 1934-test suite ran out of a 24 GiB machine's memory).

Use: ``pytest -n 3 -p tools.pytest_worker_life --worker-tests 150`` (from the repository root).
``--worker-tests 0`` (the default) leaves xdist's scheduling unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScheduling
from xdist.workermanage import WorkerController


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("xdist").addoption(
        "--worker-tests",
        type=int,
        default=0,
        metavar="N",
        help="each xdist worker runs at most N tests, then a fresh worker process takes its place (0: no limit)",
    )


class RetiringLoadScheduling(LoadScheduling):
    """``--dist load`` whose workers retire after ``tests_per_worker`` tests each.

    Args:
        config: the pytest config.
        tests_per_worker: the most tests one worker process is sent (at least 2: xdist keeps two queued).
        log: xdist's log producer.
    """

    def __init__(self, config: pytest.Config, tests_per_worker: int, log: Any = None) -> None:
        super().__init__(config, log)
        self.tests_per_worker = tests_per_worker
        self.sent: dict[WorkerController, int] = {}
        self.retired: set[WorkerController] = set()

    def _send_tests(self, node: WorkerController, num: int) -> None:
        room = self.tests_per_worker - self.sent.get(node, 0)
        num = min(num, room, len(self.pending))
        if num <= 0:
            return
        self.sent[node] = self.sent.get(node, 0) + num
        super()._send_tests(node, num)
        if self.sent[node] >= self.tests_per_worker and self.pending:
            # A worker runs a test only once it knows the next one (or that there is none): it must hear
            # "shutdown" now, not after its last test.
            self.retired.add(node)
            node.shutdown()


def pytest_configure(config: pytest.Config) -> None:
    limit = config.getoption("worker_tests")
    if limit and limit < 2:
        raise pytest.UsageError(f"--worker-tests {limit}: give 0 (no limit) or at least 2")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScheduling | None:
    limit = config.getoption("worker_tests")
    if not limit or config.getvalue("dist") != "load":
        return None
    return RetiringLoadScheduling(config, limit, log)


@pytest.hookimpl(tryfirst=True)
def pytest_testnodedown(node: WorkerController, error: object | None) -> None:
    """For a worker that retired and ended normally: start a fresh worker in its place while tests remain
    unsent, and end the retired worker's process (it has nothing left to do)."""
    session = node.config.pluginmanager.getplugin("dsession")
    scheduler = getattr(session, "sched", None)
    if (
        error is not None
        or not isinstance(scheduler, RetiringLoadScheduling)
        or node not in scheduler.retired
    ):
        return
    node.ensure_teardown()
    output = getattr(node, "workeroutput", {})
    if output.get("exitstatus") == 2 or output.get("shouldstop") or output.get("shouldfail"):
        return  # interrupted, or -x / --maxfail: the run is ending
    if scheduler.pending and not session.shuttingdown and not session.shouldstop:
        session._clone_node(node)  # how xdist replaces a crashed worker
