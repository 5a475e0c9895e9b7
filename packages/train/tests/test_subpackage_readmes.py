"""The Python blocks of the checkpoint, config and trackers READMEs run as written (in a temporary
folder); a ```text block right after one is its output."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from halyard.train.checkpoint.discovery import latest_complete

SUBPACKAGES = Path(__file__).resolve().parents[1] / "src" / "halyard" / "train"


def run_readme(name: str) -> dict:
    """Exec the subpackage README's single python block; check the output its text block shows."""
    readme = SUBPACKAGES / name / "README.md"
    found = re.findall(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```)?", readme.read_text(), re.DOTALL)
    assert len(found) == 1, f"{readme} has one Python block; update this test with it"
    ((code, expected),) = found
    namespace: dict = {"__name__": "readme"}
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, str(readme), "exec"), namespace)
    if expected:
        assert output.getvalue() == expected, f"{readme}'s block printed:\n{output.getvalue()}"
    return namespace


def test_the_preemption_block_saves_and_exits_143(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        run_readme("checkpoint")
    assert exit_info.value.code == 143
    latest = latest_complete(tmp_path / "run" / "checkpoints")
    assert latest == 3


def test_the_config_block_parses_saves_and_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run_readme("config")
    assert (tmp_path / "runs" / "example" / "config.yaml").exists()


def test_the_trackers_block_writes_the_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_readme("trackers")
    assert (tmp_path / "run" / "metrics.summary.json").exists()
