"""The load-balanced token order of context parallelism, applied to a batch before the model runs.

With a causal mask and the sequence split into ``N`` contiguous shares, the device holding the last
share attends over every key while the first attends over its own share only: about ``2N - 1`` times the
work. Cutting the sequence into ``2N`` chunks and giving device ``i`` chunks ``i`` and ``2N - 1 - i``
(the "zigzag" of MaxText / torchtitan's head-tail order) gives every device the same number of visible
query-key pairs.

Every per-token computation of the model (embedding, norms, MLPs, the loss) is indifferent to the order
of positions; rotary embeddings read each token's position and attention reads a mask built from
absolute positions, so a batch taken in this order gives the same loss as in the natural order. The
permutation is applied to the small integer arrays of the batch (tokens, labels, positions, segment ids,
loss mask) inside the step, so the data path, the cache and checkpoints are unchanged.
"""

from __future__ import annotations

import math

import numpy as np

from halyard.models.batch import LmBatch
from halyard.named import NamedArray, named
from halyard.shard import active_layout

POS = "pos"


def load_balanced_order(length: int, parts: int) -> np.ndarray:
    """Positions ``0 .. length-1`` in the order that gives each of ``parts`` devices chunks ``i`` and
    ``2 parts - 1 - i`` of ``2 parts`` equal chunks.

    Raises:
        ValueError: ``length`` is not a multiple of ``2 * parts``.
    """
    if parts < 1 or length % (2 * parts):
        raise ValueError(
            f"a load-balanced order of {length} positions over {parts} devices needs a length divisible by "
            f"2 * {parts} = {2 * parts}"
        )
    chunks = np.arange(length).reshape(2 * parts, length // (2 * parts))
    return np.concatenate([np.concatenate([chunks[i], chunks[2 * parts - 1 - i]]) for i in range(parts)])


def causal_blocks_per_device(order: np.ndarray, parts: int, block: int) -> list[int]:
    """The (query block, key block) pairs with a visible key under a causal mask that each of ``parts``
    devices computes, when the sequence is taken in ``order`` and each device's queries and the whole
    sequence of keys are cut into blocks of ``block`` (the work `attention` does per device)."""
    positions = np.asarray(order)
    key_blocks = positions.reshape(-1, block)
    counts = []
    for share in positions.reshape(parts, -1):
        query_blocks = share.reshape(-1, block)
        # a pair holds a visible key when its earliest key is at or before its latest query
        counts.append(int((key_blocks.min(axis=1)[None, :] <= query_blocks.max(axis=1)[:, None]).sum()))
    return counts


def sequence_devices(array: NamedArray) -> int:
    """How many devices the active layout splits ``array``'s ``pos`` axis over (1 without a layout)."""
    active = active_layout()
    if active is None or not array.has_axis(POS):
        return 1
    sizes = dict(active.mesh.shape)
    for dim in active.layout.placement(array.axes, active.mesh):
        if dim.axis.name == POS:
            return math.prod(sizes[a] for a in dim.mesh_axes)
    return 1


def balanced_batch(batch: LmBatch) -> tuple[LmBatch, NamedArray | None]:
    """``batch`` in the load-balanced order of the active layout's sequence split, and the window index
    of each of its positions (``(pos,)``, for the attention mask); ``(batch, None)`` when ``pos`` is not
    split or does not divide into ``2 N`` chunks."""
    parts = sequence_devices(batch.tokens)
    length = batch.tokens.axis_size(POS)
    if parts < 2 or length % (2 * parts):
        return batch, None
    order = load_balanced_order(length, parts)

    def take(array: NamedArray | None) -> NamedArray | None:
        if array is None:
            return None
        index = array.axis_names.index(POS)
        return NamedArray(array.array.take(order, axis=index), array.axes)

    reordered = LmBatch(
        tokens=take(batch.tokens),  # type: ignore[arg-type]
        labels=take(batch.labels),  # type: ignore[arg-type]
        positions=take(batch.positions),  # type: ignore[arg-type]
        loss_mask=take(batch.loss_mask),  # type: ignore[arg-type]
        segment_ids=take(batch.segment_ids),
    )
    return reordered, named(np.asarray(order, np.int32), (POS,))
