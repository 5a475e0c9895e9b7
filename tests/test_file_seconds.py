"""conftest.py's FILE_SECONDS (the order the suite's files start in) names test files that exist: a file
renamed or moved without its entry would lose its place and start last. (Files missing from it are named at
the end of every run: conftest.py's `pytest_terminal_summary`.)"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _file_seconds() -> dict[str, int]:
    """FILE_SECONDS as conftest.py writes it, read without importing conftest (it sets up the process)."""
    tree = ast.parse((REPO / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "FILE_SECONDS" for target in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("conftest.py assigns no FILE_SECONDS")


def test_every_file_seconds_entry_is_a_test_file_with_its_seconds() -> None:
    entries = _file_seconds()
    missing = [path for path in entries if not (REPO / path).is_file()]
    assert not missing, f"FILE_SECONDS names files that do not exist (renamed or moved?): {missing}"
    assert all(Path(path).name.startswith("test_") for path in entries)
    assert all(isinstance(seconds, int) and seconds > 0 for seconds in entries.values())
