"""Resuming a mixture run: changed weights or schedule are refused, naming the key and the change, unless
``data.allow_mixture_change`` lets the run go on with the new ones."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from halyard.shard import is_main_process
from halyard.train.checkpoint.commit_marker import read_commit_marker
from halyard.train.checkpoint.data_position import DATA_METADATA_KEY
from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.config.errors import ConfigError

_CHANGEABLE = ("schedule", "block_size")
"""The mixture manifest's settings that ``data.allow_mixture_change`` lets differ."""


def resume_data_position(
    config: Any, manager: CheckpointManager, data_position: dict[str, Any]
) -> dict[str, Any]:
    """The data position to check the run's latest checkpoint against.

    For a mixture whose weights, schedule or block size differ from the checkpoint's: a `ConfigError`,
    or with ``data.allow_mixture_change`` the run's own position with the checkpoint's weights (every
    other difference is still refused by the restore). Any other run: ``data_position`` itself.

    Args:
        config: the run config (`TrainConfig`).
        manager: the run's checkpoints.
        data_position: the run's data position (``{"manifest": ..., "batch_size": ..., ...}``).

    Raises:
        ConfigError: the mixture changed and ``data.allow_mixture_change`` is false (one line: the key,
            the step of the checkpoint, old -> new).
    """
    step = manager.latest_step()
    current = data_position["manifest"]
    if step is None or current.get("kind") != "mixture":
        return data_position
    marker = read_commit_marker(manager.step_path(step), check_files=False)
    saved = marker.extra_metadata.get(DATA_METADATA_KEY, {}).get("manifest", {})
    if saved.get("kind") != "mixture":
        return data_position  # another kind of data: the restore's own check names it
    old, new = saved["settings"], current["settings"]
    changes = _changes(old, new, weights_key=bool(config.data.mixture.weights))
    if not changes:
        return data_position
    told = "; ".join(f"{key}: {before} -> {after}" for key, before, after in changes)
    if not config.data.allow_mixture_change:
        raise ConfigError(
            f"{told} since the checkpoint at step {step}; give the checkpoint's values back, or set "
            f"data.allow_mixture_change: true to train on with the new ones from step {step}"
        )
    if is_main_process():
        print(
            f"data: {told} since step {step}; going on with the new ones (data.allow_mixture_change)",
            flush=True,
        )
    patched = copy.deepcopy(data_position)
    for key in _CHANGEABLE:
        patched["manifest"]["settings"][key] = old.get(key)
    patched["manifest"]["digest"] = saved["digest"]
    return patched


def _changes(old: dict[str, Any], new: dict[str, Any], *, weights_key: bool) -> list[tuple[str, str, str]]:
    """``(config key, checkpoint's value, run's value)`` for each changed mixture setting."""
    changes = []
    before, after = dict(old.get("schedule") or []), dict(new.get("schedule") or [])
    if weights_key:  # step 0's weights are data.mixture.weights
        first_before, first_after = before.pop(0, None), after.pop(0, None)
        if first_before != first_after:
            changes.append(("data.mixture.weights", _flow(first_before), _flow(first_after)))
    if before != after:
        changes.append(("data.mixture.schedule", _flow(before), _flow(after)))
    if old.get("block_size") != new.get("block_size"):
        changes.append(
            ("data.mixture.block_size", _flow(old.get("block_size")), _flow(new.get("block_size")))
        )
    return changes


def _flow(value: Any) -> str:
    return (
        str(yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000))
        .strip()
        .removesuffix("...")
        .strip()
    )
