"""Reading a checkpoint onto any mesh: the target says the structure, shapes, dtypes and shardings.

The target is an abstract tree (``jax.ShapeDtypeStruct`` with a ``sharding``, possibly inside
``NamedArray``s, e.g. from ``jax.eval_shape`` of the state's initialiser) or a tree of real arrays. Each
process reads only the slices its devices hold, so a checkpoint written on an FSDP mesh of 8 devices
restores onto one device, a tensor-parallel mesh, or another number of processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import jax
import numpy as np
import orbax.checkpoint as ocp

from halyard.train.checkpoint.commit_marker import (
    CommitMarker,
    DamagedCheckpointError,
    read_commit_marker,
    verify_file_checksums,
)
from halyard.train.checkpoint.data_position import check_data_position
from halyard.train.checkpoint.layout import ARRAYS_DIRECTORY
from halyard.train.checkpoint.leaves import LeafRecord, is_prng_key

State = TypeVar("State")
ShardingsLike = jax.sharding.Sharding | Any | None
_LISTED = 8


@dataclass(frozen=True)
class RestoredCheckpoint(Generic[State]):
    """A restored state with what was saved next to it.

    Attributes:
        state: the restored tree, with the target's structure, placed on the target's shardings.
        step: the step the checkpoint holds.
        extra_metadata: the JSON metadata given to ``save`` (data position, seed, config hash, ...).
        path: the step directory read.
    """

    state: State
    step: int
    extra_metadata: dict[str, Any]
    path: Path


def restore(
    path: str | Path,
    target: State,
    shardings: ShardingsLike = None,
    *,
    expected_data: Mapping[str, Any] | None = None,
    allow_data_mismatch: bool = False,
    verify_checksums: bool = True,
) -> RestoredCheckpoint[State]:
    """Restore a complete checkpoint into the structure, shapes, dtypes and shardings of ``target``.

    Args:
        path: a step directory (``<root>/step_00000100``).
        target: the state's abstract tree: ``jax.ShapeDtypeStruct`` leaves (with ``sharding=``),
            ``NamedArray``s wrapping them, real arrays, typed PRNG keys (abstract or real). Leaves saved
            as numpy arrays or Python numbers come back as they were saved (the target only fixes their
            shape). Leaves are matched by pytree path; every saved leaf must be in the target and vice
            versa; shapes and the dtypes of JAX arrays must match.
        shardings: where to place the arrays: None (each leaf's own ``.sharding``; a leaf without one goes
            to the first local device, single-process only), one ``Sharding`` for every leaf, or a tree of
            shardings with the target's structure.
        expected_data: the current run's data position (the ``"data"`` entry of ``extra_metadata`` given
            to ``save``); when given, a checkpoint with a different one is refused.
        allow_data_mismatch: warn instead of refusing a different data position.
        verify_checksums: compare every file's content with the checksum recorded at save time before
            reading (one extra read of the checkpoint); False loads a damaged checkpoint anyway.

    Raises:
        DamagedCheckpointError: when ``path`` is not a complete checkpoint.
        ChecksumMismatchError: (a `DamagedCheckpointError`) when a file's content changed since the save,
            naming the step, the file and both checksums.
        DataMismatchError: for a different data position (see ``expected_data``).
        ValueError: when the target's leaves, shapes or dtypes differ from the checkpoint's (naming them).
    """
    marker = read_commit_marker(path)
    step_dir = Path(path)
    if expected_data is not None:
        check_data_position(
            marker.extra_metadata,
            expected_data,
            checkpoint_path=step_dir,
            allow_data_mismatch=allow_data_mismatch,
        )
    if verify_checksums:
        verify_file_checksums(step_dir, marker)
    state = _restore_tree(step_dir, marker, target, shardings, prefix="", what="state")
    return RestoredCheckpoint(state, marker.step, marker.extra_metadata, step_dir)


def restore_weights(
    path: str | Path,
    target_params: State,
    shardings: ShardingsLike = None,
    *,
    params_path: str,
    verify_checksums: bool = True,
) -> State:
    """Restore only a subtree (the model weights) of a checkpoint, e.g. for ``init: checkpoint PATH``.

    Args:
        path: a step directory.
        target_params: the abstract tree of the weights alone (see `restore` for the leaf types).
        shardings: as in `restore`.
        params_path: where the weights sit in the saved state, as ``jax.tree_util.keystr`` prints the
            path (``"['params']"`` for a dict state, ``".params"`` for a dataclass or equinox module), or
            a bare name (``"params"``) meaning whichever of those two the checkpoint holds.
        verify_checksums: as in `restore` (every file of the checkpoint is checked, not only the weights').

    Raises:
        DamagedCheckpointError: when ``path`` is not a complete checkpoint, or (`ChecksumMismatchError`)
            a file's content changed since the save.
        ValueError: when no saved leaf lies under ``params_path`` (listing the saved top-level entries),
            or the weights differ in leaves, shapes or dtypes.
    """
    marker = read_commit_marker(path)
    bare_name = not params_path.startswith((".", "["))
    candidates = [f".{params_path}", f"['{params_path}']"] if bare_name else [params_path]
    for prefix in candidates:
        if any(_is_under(leaf.path, prefix) for leaf in marker.leaves):
            if verify_checksums:
                verify_file_checksums(path, marker)
            return _restore_tree(Path(path), marker, target_params, shardings, prefix=prefix, what="weights")
    tops = sorted({_top_level(leaf.path) for leaf in marker.leaves})
    raise ValueError(
        f"Checkpoint {path} has no leaf under {params_path!r}; its top-level entries are {tops}. "
        f"Pass params_path as one of them"
    )


def _is_under(path: str, prefix: str) -> bool:
    """Whether the leaf ``path`` is ``prefix`` itself or inside it (``.params`` holds ``.params['w']``,
    not ``.params_ema['w']``)."""
    return path == prefix or (path.startswith(prefix) and path[len(prefix)] in ".[")


def _top_level(path: str) -> str:
    for index, character in enumerate(path[1:], start=1):
        if character in ".[":
            return path[:index]
    return path


def _leaf_shardings(target: Any, shardings: ShardingsLike, count: int) -> list[Any]:
    if shardings is None:
        return [None] * count
    if isinstance(shardings, jax.sharding.Sharding):
        return [shardings] * count
    try:
        matched = jax.tree.map(lambda _, sharding: sharding, target, shardings)
    except ValueError as error:
        raise ValueError(
            "The shardings tree does not have the target's structure; pass one Sharding for all leaves, "
            f"or e.g. jax.tree.map(lambda leaf: <sharding>, target) ({error})"
        ) from error
    return jax.tree.leaves(matched)


def _placement(leaf: Any, sharding: Any, path: str) -> jax.sharding.Sharding:
    sharding = sharding if sharding is not None else getattr(leaf, "sharding", None)
    if sharding is not None:
        return sharding
    if jax.process_count() > 1:
        raise ValueError(
            f"The target leaf at {path} has no sharding; in a multi-process run give every leaf one "
            f"(jax.ShapeDtypeStruct(shape, dtype, sharding=...)) or pass shardings="
        )
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _is_python_number(leaf: Any) -> bool:
    return isinstance(leaf, bool | int | float) and not isinstance(leaf, np.generic)


def _check_leaf(record: LeafRecord, leaf: Any, path: str, step_dir: Path) -> None:
    target_is_key = is_prng_key(leaf)
    if (record.kind == "prng_key") != target_is_key:
        saved_kind = "a typed PRNG key" if record.kind == "prng_key" else f"a {record.dtype} array"
        raise ValueError(
            f"Checkpoint {step_dir} holds {saved_kind} at {path}, but the target leaf is "
            f"{'a typed PRNG key' if target_is_key else type(leaf).__name__}; make the target match "
            f"(typed keys: jax.eval_shape(lambda: jax.random.key(0)))"
        )
    if _is_python_number(leaf):
        leaf = np.asarray(leaf)
    shape = tuple(leaf.shape)
    if shape != record.shape:
        raise ValueError(
            f"Shape mismatch at {path}: checkpoint {step_dir} has {record.shape}, the target {shape}"
        )
    # Numpy and Python-number leaves come back as saved: eval_shape turns them into 32-bit structs.
    if record.kind == "array" and np.dtype(leaf.dtype).name != record.dtype:
        raise ValueError(
            f"Dtype mismatch at {path}: checkpoint {step_dir} has {record.dtype}, the target "
            f"{np.dtype(leaf.dtype).name}; restore with the saved dtype and cast afterwards"
        )


def _restore_tree(
    step_dir: Path, marker: CommitMarker, target: Any, shardings: ShardingsLike, *, prefix: str, what: str
) -> Any:
    records = {
        record.path: record for record in marker.leaves if not prefix or _is_under(record.path, prefix)
    }
    leaves_with_paths, structure = jax.tree_util.tree_flatten_with_path(target)
    paths = [prefix + jax.tree_util.keystr(key_path) for key_path, _ in leaves_with_paths]
    missing = [path for path in paths if path not in records]
    unexpected = sorted(set(records) - set(paths))
    if missing or unexpected:
        raise ValueError(
            f"The target {what} does not match checkpoint {step_dir}: "
            f"{len(missing)} target leaves are not in the checkpoint {missing[:_LISTED]}, "
            f"{len(unexpected)} saved leaves are not in the target {unexpected[:_LISTED]}. "
            "Build the target from the same state structure that was saved (e.g. jax.eval_shape(init))"
        )
    placements = _leaf_shardings(target, shardings, len(paths))
    item: dict[str, Any] = {}
    restore_args: dict[str, Any] = {}
    for (_, leaf), path, sharding in zip(leaves_with_paths, paths, placements):
        record = records[path]
        _check_leaf(record, leaf, path, step_dir)
        if record.kind in ("numpy", "numpy_scalar", "python_scalar"):
            item[record.storage_key] = jax.ShapeDtypeStruct(record.shape, np.dtype(record.dtype))
            restore_args[record.storage_key] = ocp.RestoreArgs(restore_type=np.ndarray)
            continue
        placement = _placement(leaf, sharding, path)
        if record.kind == "prng_key":  # a key's data has the key's shape plus the implementation's dims
            data_shape = jax.eval_shape(jax.random.key_data, leaf).shape
        else:
            data_shape = record.shape
        item[record.storage_key] = jax.ShapeDtypeStruct(
            data_shape, np.dtype(record.dtype), sharding=placement
        )
        restore_args[record.storage_key] = ocp.ArrayRestoreArgs(
            sharding=placement, global_shape=data_shape, dtype=np.dtype(record.dtype)
        )
    try:
        with ocp.PyTreeCheckpointer() as checkpointer:
            restored = checkpointer.restore(
                (step_dir / ARRAYS_DIRECTORY).absolute(),  # orbax refuses relative paths
                args=ocp.args.PyTreeRestore(
                    item=item, restore_args=restore_args, partial_restore=bool(prefix)
                ),
            )
    except Exception as error:  # orbax and TensorStore raise many types for files they cannot decode
        raise DamagedCheckpointError(
            step_dir, f"its arrays could not be read ({type(error).__name__}: {str(error)[:300]})"
        ) from error
    values = []
    for path in paths:
        record = records[path]
        value = restored[record.storage_key]
        if record.kind == "prng_key":
            value = jax.random.wrap_key_data(value, impl=record.key_impl)
        elif record.kind == "python_scalar":
            value = {"int": int, "float": float, "bool": bool}[record.python_type or "float"](
                np.asarray(value).item()
            )
        elif record.kind == "numpy":
            value = np.asarray(value, dtype=record.dtype)
        elif record.kind == "numpy_scalar":
            value = np.asarray(value, dtype=record.dtype)[()]
        values.append(value)
    return jax.tree.unflatten(structure, values)
