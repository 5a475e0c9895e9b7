"""How orbax writes a run's arrays: replica-parallel only for slices worth splitting."""

from __future__ import annotations

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint._src.metadata import array_metadata_store

REPLICA_PARALLEL_MIN_SLICE_BYTES = 1 << 20
"""A replicated array is written in slices by its replicas (orbax's replica-parallel save) only when each
slice holds at least this many bytes. Each slice of a smaller array costs a compiled program per shape and
replica in every process (a tiny model on 8 devices: 78 programs and 5 s per run instead of 6 programs),
more than the write it spreads."""


def pytree_handler(*, compress: bool) -> ocp.PyTreeCheckpointHandler:
    """orbax's PyTree handler with the default type handlers, but `REPLICA_PARALLEL_MIN_SLICE_BYTES` for
    ``jax.Array`` (a registry of its own: the global one is left as it is).

    Args:
        compress: zstd-compress the arrays (``checkpoint.compress``).
    """
    arrays = ocp.type_handlers.ArrayHandler(
        array_metadata_store=array_metadata_store.Store(),  # as orbax's default jax.Array handler
        min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_SLICE_BYTES,
    )
    handlers = [
        (kind, arrays if kind is jax.Array else ocp.type_handlers.get_type_handler(kind))
        for kind in ocp.type_handlers.supported_types()
    ]
    registry = ocp.type_handlers.create_type_handler_registry(*handlers)
    return ocp.PyTreeCheckpointHandler(use_compression=compress, type_handler_registry=registry)
