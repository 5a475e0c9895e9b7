"""Harness results on disk: where they go for a run or a Hugging Face folder, and writing them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

HARNESS_FOLDER = "harness"
"""The folder of a run (or HF folder) that harness results go to."""
MERGED_KEYS = (
    "results",
    "groups",
    "group_subtasks",
    "configs",
    "versions",
    "n-shot",
    "higher_is_better",
    "n-samples",
)
"""The per-task entries of lm-eval's results that a results file accumulates over several evaluations."""


def default_output(folder: str | Path, step: int | None) -> Path:
    """``FOLDER/harness/step_<step>.json`` for a run's checkpoint, ``FOLDER/harness/results.json`` without a step."""
    name = "results.json" if step is None else f"step_{step}.json"
    return Path(folder) / HARNESS_FOLDER / name


def write_results(results: dict[str, Any], path: str | Path) -> Path:
    """Write lm-eval's ``results`` (without ``samples``) as JSON at ``path``, atomically.

    A file already there keeps the tasks it holds that ``results`` does not (so ``--tasks a`` then
    ``--tasks b`` leave both in ``step_<N>.json``); the other entries are this evaluation's.
    """
    from lm_eval.utils import handle_non_serializable

    path = Path(path)
    written = {key: value for key, value in results.items() if key != "samples"}
    if path.exists():
        earlier = json.loads(path.read_text(encoding="utf-8"))
        for key in MERGED_KEYS:
            if isinstance(earlier.get(key), dict):
                written[key] = {**earlier[key], **written.get(key, {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(written, indent=2, default=handle_non_serializable), encoding="utf-8")
    os.replace(temporary, path)
    return path
