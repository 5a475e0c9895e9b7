"""`ProgramStore`: the engine's step programs kept as exported StableHLO (`jax.export`) beside the persistent
compilation cache, so that a later start lowers each program from its stored module instead of tracing the
model again.

Why: JAX's persistent compilation cache spares a start the compiler, not the trace and the lowering that come
before it. On the TPU v5e's host those took 2.4 s of a warm start's first request (the host traces 5-6 times
slower than a 2-core CPU; benchmarks/README.md). A stored program is lowered in milliseconds.

A program is stored under a key of everything its trace depends on (`program_key`): JAX's and jaxlib's
versions, JAX's configuration, ``XLA_FLAGS``, the backend and its devices, the source of the Halyard packages
that build it, Halyard's context variables (the target backend, batch invariance), the arguments' tree
structure (the model's config is in it; a function in it by its name), shapes, dtypes and shardings, and
the static arguments. A changed input is a new key, so a stale program is never used; a file that cannot be
read is traced again and replaced. Cold and warm starts lower the same module (the cold one exports it
first), so the compilation cache answers the warm one. An engine on a mesh does not use it (its layout is
not in the key).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import importlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jaxlib.version

FORMAT = b"halyard-step-program-1\n"
"""The first line of a stored program's file (then one JSON line, then the exported module)."""
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
"""A memory address in a repr (``<function f at 0x...>``): dropped from keys, so a function is told by its name."""
TRACED_PACKAGES = ("halyard.named", "halyard.shard", "halyard.models", "halyard.serve")
"""The packages whose source a step program is traced from (`source_fingerprint`)."""


@functools.cache
def source_fingerprint() -> str:
    """A hash of the Python source of `TRACED_PACKAGES` (an edited file gives every program a new key)."""
    digest = hashlib.sha256()
    for name in TRACED_PACKAGES:
        for folder in importlib.import_module(name).__path__:
            for path in sorted(Path(folder).rglob("*.py")):
                digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def program_key(leaves: list[Any], tree: Any, static: dict[str, Any]) -> str:
    """The key of a program of the flattened arguments ``leaves`` / ``tree`` and the ``static`` arguments
    (module docstring)."""
    device = jax.devices()[0]
    config = sorted((k, re.sub(_ADDRESS, "", repr(v))) for k, v in jax.config.values.items())
    context = sorted(
        (var.name, repr(value))
        for var, value in contextvars.copy_context().items()
        if var.name.startswith("halyard")
    )
    parts = [
        jax.__version__, jaxlib.version.__version__, device.platform, device.device_kind, jax.device_count(),
        os.environ.get("XLA_FLAGS", ""), config, context, source_fingerprint(), re.sub(_ADDRESS, "", str(tree)),
        [(leaf.shape, str(leaf.dtype), str(getattr(leaf, "sharding", None))) for leaf in leaves],
        sorted((k, repr(v)) for k, v in static.items()),
    ]  # fmt: skip
    return hashlib.sha256(repr(parts).encode()).hexdigest()


class ProgramStore:
    """Exported step programs in ``directory`` (created on the first store).

    Args:
        directory: the folder (the engine's: ``halyard-programs`` inside its compilation cache).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    @classmethod
    def in_cache(cls, cache: str | None) -> ProgramStore | None:
        """The store inside the compilation cache folder ``cache`` (`EngineConfig.compilation_cache`;
        ``halyard-programs`` in it, where JAX keeps a folder set before elsewhere); None for no cache or a
        remote one (a URL)."""
        return None if not cache or "://" in cache else cls(Path(cache).expanduser() / "halyard-programs")

    def compile(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        static: dict[str, Any],
        donate: tuple[int, ...],
        output_tree: Callable[[list[bool]], Any],
    ) -> tuple[Any, bool]:
        """``jax.jit(function, donate_argnums=donate)`` for ``args`` and the keyword arguments ``static``,
        compiled (called with ``args``' arrays, as the jitted function), its lowering read from the store
        where it is there, else traced and stored; and whether it was traced.

        Args:
            function: the program's Python function.
            args: its array arguments (pytrees of arrays; only their shapes, dtypes and shardings matter).
            static: its static keyword arguments (hashable; part of the key).
            donate: the positions in ``args`` whose buffers the program may reuse.
            output_tree: the tree structure of ``function``'s output from which of its leaves are None
                (flattened with None as a leaf), as the caller knows it.
        """
        leaves, tree = jax.tree.flatten(args)
        path = self.directory / f"{program_key(leaves, tree, static)}.program"
        stored = self._read(path)
        traced = stored is None
        if stored is None:
            stored = self._export(function, args, static, donate)
            self._write(path, *stored)
        exported, present = stored
        structure = output_tree(present)

        def call(*arrays: Any) -> Any:  # the stored module's arrays in, ``function``'s outputs out
            return jax.tree.unflatten(structure, exported.call(*jax.tree.leaves(arrays)))

        return jax.jit(call, donate_argnums=donate).lower(*args).compile(), traced

    @staticmethod
    def _export(
        function: Callable[..., Any], args: tuple[Any, ...], static: dict[str, Any], donate: tuple[int, ...]
    ) -> tuple[Any, list[bool]]:
        """``function`` traced on the flattened ``args`` and exported; which of its output leaves are None."""
        leaves, tree = jax.tree.flatten(args)
        counts = [len(jax.tree.leaves(arg)) for arg in args]
        flat_donate = tuple(j for i in donate for j in range(sum(counts[:i]), sum(counts[: i + 1])))
        present: list[bool] = []

        def flat(*flat_args: Any) -> list[Any]:
            outputs = jax.tree.leaves(
                function(*jax.tree.unflatten(tree, flat_args), **static), is_leaf=lambda x: x is None
            )
            present.extend(output is not None for output in outputs)
            return [output for output in outputs if output is not None]

        abstract = [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding) for leaf in leaves]
        return jax.export.export(jax.jit(flat, donate_argnums=flat_donate))(*abstract), present

    @staticmethod
    def _read(path: Path) -> tuple[Any, list[bool]] | None:
        """The stored program at ``path``, or None (none there, or one that cannot be read)."""
        try:
            with open(path, "rb") as stored:
                if stored.readline() != FORMAT:
                    return None
                present = [bool(flag) for flag in json.loads(stored.readline())["present"]]
                return jax.export.deserialize(bytearray(stored.read())), present
        except Exception:  # any file that cannot be read (flatbuffers' own errors too): trace it again
            return None

    def _write(self, path: Path, exported: Any, present: list[bool]) -> None:
        """Store ``exported`` at ``path`` whole or not at all (a temporary file renamed over it)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=self.directory, suffix=".partial")
        with os.fdopen(descriptor, "wb") as file:
            file.write(FORMAT + json.dumps({"present": present}).encode() + b"\n" + exported.serialize())
        os.replace(temporary, path)
