"""Where checkpoints live: one directory per step under a checkpoint root.

```
<root>/
  step_00000100/
    arrays/                    orbax PyTree checkpoint (OCDBT over TensorStore)
    halyard_checkpoint.json    commit marker, written last (see `commit_marker`)
  step_00000200/
    ...
```
"""

from __future__ import annotations

import re
from pathlib import Path

STEP_DIRECTORY_PREFIX = "step_"
ARRAYS_DIRECTORY = "arrays"
COMMIT_MARKER = "halyard_checkpoint.json"
UNREADABLE_MARKER = COMMIT_MARKER + ".unreadable"
"""The commit marker of a checkpoint set aside after it failed verification on restore."""

_STEP_DIRECTORY = re.compile(r"^step_(\d+)$")


def step_directory(root: str | Path, step: int) -> Path:
    """The directory of the checkpoint for ``step`` under ``root`` (whether or not it exists).

    Args:
        root: the checkpoint root (e.g. ``<run_dir>/checkpoints``).
        step: a non-negative training step.

    Raises:
        ValueError: for a negative step.
    """
    if step < 0:
        raise ValueError(f"A checkpoint step must be >= 0, got {step}")
    return Path(root) / f"{STEP_DIRECTORY_PREFIX}{step:08d}"


def parse_step_directory(path: str | Path) -> int | None:
    """The step encoded in a directory name like ``step_00000100``, or None for any other name."""
    match = _STEP_DIRECTORY.match(Path(path).name)
    return int(match.group(1)) if match else None


def step_directories(root: str | Path) -> dict[int, Path]:
    """Every directory under ``root`` named like a checkpoint, complete or not, keyed by step.

    Args:
        root: the checkpoint root; a missing root has no checkpoints.
    """
    root = Path(root)
    if not root.is_dir():
        return {}
    found: dict[int, Path] = {}
    for child in root.iterdir():
        step = parse_step_directory(child)
        if step is not None and child.is_dir():
            found[step] = child
    return dict(sorted(found.items()))
