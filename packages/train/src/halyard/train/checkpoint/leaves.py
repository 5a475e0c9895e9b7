"""Turning a training state into the flat dictionary of arrays that orbax stores, and back.

Every leaf is stored under a key derived from its pytree path (``['params'].blocks[0].array`` becomes
``params_blocks_0_array``) and recorded in the commit marker with its kind, shape and dtype. Restoring
matches leaves by path, not by position, so a mismatch between the checkpoint and the target names the
exact leaf. Leaf kinds:

- ``array``: a ``jax.Array``, restored on the target leaf's sharding;
- ``numpy`` / ``numpy_scalar``: a numpy array / scalar (``np.int64(3)``), restored as numpy with its saved dtype (``jax.eval_shape`` turns
  such leaves into 32-bit structs, so the target only fixes their shape);
- ``prng_key``: a new-style typed key (``jax.random.key``); its raw ``key_data`` is stored and the key is
  rebuilt with ``jax.random.wrap_key_data`` and the recorded implementation;
- ``python_scalar``: a Python ``int``/``float``/``bool`` such as a step counter, restored as that type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import jax
import numpy as np

LeafKind = Literal["array", "numpy", "numpy_scalar", "prng_key", "python_scalar"]

_UNSAFE_CHARACTERS = re.compile(r"[^A-Za-z0-9_\-]+")


@dataclass(frozen=True)
class LeafRecord:
    """How one leaf of the state was stored.

    Attributes:
        path: the leaf's pytree path as ``jax.tree_util.keystr`` prints it, e.g. ``['params']['w'].array``.
        storage_key: the key of the stored array in the orbax checkpoint.
        kind: ``array``, ``numpy``, ``numpy_scalar``, ``prng_key`` or ``python_scalar`` (see the module docstring).
        shape: the leaf's logical shape (for a key: the shape of the key array, not of its data).
        dtype: numpy dtype name of the stored data (``uint32`` for keys).
        key_impl: the PRNG implementation name (``threefry2x32``, ...) for ``prng_key`` leaves.
        python_type: ``int``, ``float`` or ``bool`` for ``python_scalar`` leaves.
    """

    path: str
    storage_key: str
    kind: LeafKind
    shape: tuple[int, ...]
    dtype: str
    key_impl: str | None = None
    python_type: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "storage_key": self.storage_key,
            "kind": self.kind,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "key_impl": self.key_impl,
            "python_type": self.python_type,
        }

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> LeafRecord:
        return cls(
            path=str(entry["path"]),
            storage_key=str(entry["storage_key"]),
            kind=entry["kind"],
            shape=tuple(int(size) for size in entry["shape"]),
            dtype=str(entry["dtype"]),
            key_impl=entry.get("key_impl"),
            python_type=entry.get("python_type"),
        )


def is_prng_key(leaf: Any) -> bool:
    """True for new-style typed PRNG keys (and abstract ones), whose dtype is ``key<impl>``."""
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _storage_key(path: str, taken: set[str]) -> str:
    base = _UNSAFE_CHARACTERS.sub("_", path).strip("_") or "leaf"
    key, suffix = base, 1
    while key in taken:
        suffix += 1
        key = f"{base}__{suffix}"
    taken.add(key)
    return key


def flatten_for_save(state: Any) -> tuple[dict[str, Any], tuple[LeafRecord, ...]]:
    """Split ``state`` into the flat dictionary orbax writes and the records describing each leaf.

    Args:
        state: any pytree of ``jax.Array`` (incl. typed PRNG keys), numpy arrays and Python numbers,
            e.g. ``{"params": <NamedArray tree>, "opt_state": <optax state>, "key": key, "step": 3}``.

    Returns:
        ``(arrays, records)``: ``arrays`` maps storage keys to arrays; ``records`` lists every leaf in
        pytree order.

    Raises:
        TypeError: for a leaf of another type (a string, an object), naming its path.
        ValueError: for a state without any leaf.
    """
    leaves_with_paths = jax.tree_util.tree_flatten_with_path(state)[0]
    if not leaves_with_paths:
        raise ValueError("The state to checkpoint has no leaves (no arrays or numbers): nothing to save")
    arrays: dict[str, Any] = {}
    records: list[LeafRecord] = []
    taken: set[str] = set()
    for key_path, leaf in leaves_with_paths:
        path = jax.tree_util.keystr(key_path)
        storage_key = _storage_key(path, taken)
        value: Any
        if isinstance(leaf, bool | int | float) and not isinstance(leaf, np.generic):
            value = np.asarray(leaf)
            record = LeafRecord(
                path, storage_key, "python_scalar", (), value.dtype.name, python_type=type(leaf).__name__
            )
        elif is_prng_key(leaf):
            value = jax.random.key_data(leaf)
            impl = str(jax.random.key_impl(leaf))
            record = LeafRecord(path, storage_key, "prng_key", tuple(leaf.shape), "uint32", key_impl=impl)
        elif isinstance(leaf, jax.Array):
            value = leaf
            record = LeafRecord(path, storage_key, "array", tuple(leaf.shape), np.dtype(leaf.dtype).name)
        elif isinstance(leaf, np.ndarray | np.generic):
            value = np.asarray(leaf)
            kind: LeafKind = "numpy_scalar" if isinstance(leaf, np.generic) else "numpy"
            record = LeafRecord(path, storage_key, kind, tuple(value.shape), value.dtype.name)
        else:
            raise TypeError(
                f"The state leaf at {path or '<root>'} is a {type(leaf).__name__}; checkpoints hold arrays, "
                f"PRNG keys and Python numbers. Put strings and other values in extra_metadata, or mark "
                f"the field static (e.g. eqx.field(static=True)) so it is not a leaf"
            )
        arrays[storage_key] = value
        records.append(record)
    return arrays, tuple(records)
