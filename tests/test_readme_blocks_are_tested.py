"""Every README.md with ```python blocks is one whose blocks the test suite executes: a README that gains
a Python block, or a new README with one, fails here until a test runs it and this list says which."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON_BLOCK = re.compile(r"^ *```python\n", re.MULTILINE)
SKIPPED_FOLDERS = {".git", ".venv", "node_modules", "dist", "build", "site", "__pycache__"}

# README (relative to the repository) -> (its number of python blocks, the tests that execute them all)
TESTED_READMES: dict[str, tuple[int, list[str]]] = {
    "packages/named/README.md": (3, ["packages/named/tests/test_readme.py"]),
    "packages/shard/README.md": (7, ["packages/shard/tests/test_readme.py"]),
    "packages/models/README.md": (2, ["packages/models/tests/test_readme.py"]),
    "packages/export/README.md": (3, ["packages/export/tests/test_readme.py"]),
    "packages/data-cache/README.md": (
        3,
        [
            "packages/data-cache/tests/test_readme_and_benchmark.py",  # the quick start's two
            "packages/data-cache/tests/test_build_from_scripts.py",  # supervised fine-tuning
        ],
    ),
    "README.md": (1, ["packages/serve/tests/test_server_operation.py"]),  # the quick start's openai client
    "packages/serve/README.md": (2, ["packages/serve/tests/test_server_operation.py"]),
    "packages/train/README.md": (1, ["packages/train/tests/test_readme_scripts.py"]),
    "packages/train/src/halyard/train/optim/README.md": (1, ["packages/train/tests/test_readme_scripts.py"]),
    "packages/train/src/halyard/train/checkpoint/README.md": (
        1,
        ["packages/train/tests/test_subpackage_readmes.py"],
    ),
    "packages/train/src/halyard/train/config/README.md": (
        1,
        ["packages/train/tests/test_subpackage_readmes.py"],
    ),
    "packages/train/src/halyard/train/trackers/README.md": (
        1,
        ["packages/train/tests/test_subpackage_readmes.py"],
    ),
}


def readmes_with_python_blocks() -> dict[str, int]:
    """Every README.md of the repository (build outputs and hidden folders aside) -> its python blocks."""
    found = {}
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [
            name for name in subfolders if name not in SKIPPED_FOLDERS and not name.startswith(".")
        ]
        if "README.md" in files:
            path = Path(folder) / "README.md"
            count = len(PYTHON_BLOCK.findall(path.read_text(encoding="utf-8")))
            if count:
                found[path.relative_to(REPO).as_posix()] = count
    return found


def test_every_readme_python_block_is_executed_by_a_listed_test() -> None:
    found = readmes_with_python_blocks()
    untested = sorted(set(found) - set(TESTED_READMES))
    assert not untested, (
        f"README python blocks no test executes: {untested}; add a test that runs them (pattern: "
        "packages/shard/tests/test_readme.py) and list it in TESTED_READMES of this file"
    )
    changed = {
        readme: (count, TESTED_READMES[readme][0])
        for readme, count in found.items()
        if count != TESTED_READMES[readme][0]
    }
    assert not changed, (
        f"README python block counts changed (now, listed): {changed}; make the listed tests run every "
        "block, then update the count in TESTED_READMES"
    )
    stale = sorted(set(TESTED_READMES) - set(found))
    assert not stale, f"TESTED_READMES lists READMEs without python blocks (remove them): {stale}"


def test_the_listed_tests_exist_and_read_their_readme() -> None:
    for readme, (_, tests) in TESTED_READMES.items():
        for test in tests:
            text = (REPO / test).read_text(encoding="utf-8")
            assert "README" in text, f"{test}, listed for {readme}, does not read a README"
