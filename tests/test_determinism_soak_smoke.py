"""The determinism soak's short form (tools/determinism_soak.py; `make stress` runs 2,000 requests 3 times):
30 requests through ``halyard serve --deterministic`` with a pool small enough to preempt, streamed and whole,
n > 1, stop strings, seeds, hang-ups and shared prefixes, each equal to the same request served alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_30_requests_among_others_equal_each_alone(tmp_path: Path) -> None:
    command = [
        sys.executable, str(ROOT / "tools" / "determinism_soak.py"), "--requests", "30", "--rounds", "1",
        "--log", str(tmp_path / "server.log"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:] + (tmp_path / "server.log").read_text()[-3000:]
    (round_line,) = re.findall(r"^round 1: .*$", output, re.MULTILINE)
    found = re.match(
        r"round 1: 30 requests, 0 mismatches, (\d+) preemptions, pages in use after: 0", round_line
    )
    assert found, round_line
    assert int(found[1]) > 0, round_line  # the pool ran out: recomputation was part of the run
