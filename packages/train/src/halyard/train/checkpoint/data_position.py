"""Refusing to resume on different data: compare the data position saved with a checkpoint to the run's.

A batch is a pure function of (data manifest, seed, step), so resuming is arithmetic, but only if the
manifest and seed are the ones the checkpoint was trained on. The caller stores them under the
``"data"`` key of ``extra_metadata`` when saving (e.g. ``{"data": {"manifest": {...}, "seed": 0}}``) and
passes the current run's ``"data"`` dictionary when restoring.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DATA_METADATA_KEY = "data"
_MISSING = object()


class DataMismatchError(ValueError):
    """The checkpoint was written for a different data manifest or seed than the current run.

    ``differences`` says what differs (the message without the advice, which suits Python callers), so a
    command line can give its own.
    """

    def __init__(self, message: str, differences: str) -> None:
        super().__init__(message)
        self.differences = differences


def metadata_differences(saved: Any, current: Any, where: str = "") -> list[str]:
    """Every place where two JSON-like values differ, as readable lines.

    Args:
        saved: the value recorded in the checkpoint (dicts, lists and scalars).
        current: the value of the current run.
        where: the dotted location of these values, used as the prefix of each line.

    Returns:
        Lines like ``data.seed: checkpoint 0, current run 1``; empty when equal.
    """
    label = where or "<root>"
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        lines: list[str] = []
        for key in sorted(set(saved) | set(current), key=str):
            child = f"{where}.{key}" if where else str(key)
            left, right = saved.get(key, _MISSING), current.get(key, _MISSING)
            if left is _MISSING:
                lines.append(f"{child}: absent in the checkpoint, current run {right!r}")
            elif right is _MISSING:
                lines.append(f"{child}: checkpoint {left!r}, absent in the current run")
            else:
                lines.extend(metadata_differences(left, right, child))
        return lines
    if isinstance(saved, list | tuple) and isinstance(current, list | tuple):
        if len(saved) != len(current):
            return [f"{label}: checkpoint has {len(saved)} entries, current run {len(current)}"]
        lines = []
        for index, (left, right) in enumerate(zip(saved, current)):
            lines.extend(metadata_differences(left, right, f"{where}[{index}]"))
        return lines
    return [] if saved == current else [f"{label}: checkpoint {saved!r}, current run {current!r}"]


def check_data_position(
    saved_extra_metadata: Mapping[str, Any],
    current_data: Mapping[str, Any],
    *,
    checkpoint_path: Path,
    allow_data_mismatch: bool,
) -> None:
    """Refuse (or, when allowed, warn about) a checkpoint whose data position differs from the run's.

    Args:
        saved_extra_metadata: the ``extra_metadata`` stored with the checkpoint.
        current_data: the current run's data position (manifest, seed, ...), JSON-like.
        checkpoint_path: the step directory, named in the message.
        allow_data_mismatch: warn instead of raising.

    Raises:
        DataMismatchError: listing every difference, unless ``allow_data_mismatch``.
    """
    saved = saved_extra_metadata.get(DATA_METADATA_KEY, _MISSING)
    if saved is _MISSING:
        differences = [f"{DATA_METADATA_KEY}: the checkpoint records no data position"]
    else:
        # JSON round trip so tuples and lists compare equal, as they will after saving.
        differences = metadata_differences(saved, json.loads(json.dumps(current_data)), DATA_METADATA_KEY)
    if not differences:
        return
    message = f"Checkpoint {checkpoint_path} was written for different data than this run:\n  " + "\n  ".join(
        differences
    )
    if allow_data_mismatch:
        warnings.warn(message + "\n(continuing because allow_data_mismatch=True)", stacklevel=3)
        return
    raise DataMismatchError(
        message + "\nResuming would not continue the same data order. Use the original data and seed, or "
        "pass allow_data_mismatch=True to resume anyway (e.g. to continue on a new dataset).",
        message,
    )
