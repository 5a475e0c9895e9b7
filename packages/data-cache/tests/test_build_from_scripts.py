"""Building from a script: an unguarded top-level build fails with the fix instead of hanging, and the
progress bar reports the build's speed."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from data_helpers import make_documents, write_jsonl_shards

from halyard.data import build_cache

SCRIPT = """
from halyard.data import build_cache

{indent}cache = build_cache("data/*.jsonl", "tokenizer.json", "cache", num_workers=2, progress=False)
{indent}print("documents:", cache.num_documents)
"""


def _run_script(folder: Path, guarded: bool) -> subprocess.CompletedProcess:
    body = SCRIPT.format(indent="    " if guarded else "")
    if guarded:
        body = body.replace("\n    cache =", "\nif __name__ == '__main__':\n    cache =", 1)
    (folder / "build.py").write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "build.py"], cwd=folder, capture_output=True, text=True, timeout=180
    )


@pytest.fixture
def script_folder(tmp_path: Path, tokenizer_path: str) -> Path:
    write_jsonl_shards(tmp_path / "data", make_documents(40, seed=3), num_shards=2)
    (tmp_path / "tokenizer.json").write_text(Path(tokenizer_path).read_text())
    return tmp_path


def test_an_unguarded_script_fails_naming_the_guard_instead_of_waiting_forever(script_folder: Path) -> None:
    completed = _run_script(script_folder, guarded=False)
    assert completed.returncode != 0
    assert "if __name__ == '__main__':" in completed.stderr
    assert "waiting for it to finish" not in completed.stderr


def test_a_guarded_script_builds(script_folder: Path) -> None:
    completed = _run_script(script_folder, guarded=True)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "documents: 40" in completed.stdout


def test_the_progress_bar_ends_with_the_builds_tokens_per_second(
    tmp_path: Path, tokenizer_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write_jsonl_shards(tmp_path / "data", make_documents(60, seed=4), num_shards=1)
    build_cache(str(tmp_path / "data" / "*.jsonl"), tokenizer_path, str(tmp_path / "cache"), num_workers=0)
    speeds = [int(value) for value in re.findall(r"tokens_per_s=(\d+)", capsys.readouterr().err)]
    assert speeds and speeds[-1] > 0
