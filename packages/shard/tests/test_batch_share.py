"""`batch_share`: which slice of each global batch a process loads, from the processes its devices are on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from halyard.shard import MESH_AXES, batch_share


@dataclass(frozen=True)
class FakeDevice:
    id: int
    process_index: int


class FakeMesh:
    """A mesh of `MESH_AXES` whose devices name the process they are on (this test is process 0)."""

    def __init__(self, processes: list[int], **sizes: int) -> None:
        shape = [sizes.get(axis, 1) for axis in MESH_AXES]
        devices = [FakeDevice(i, p) for i, p in enumerate(processes)]
        self.devices = np.array(devices, dtype=object).reshape(shape)
        self.axis_names = MESH_AXES
        self.shape = dict(zip(MESH_AXES, shape, strict=True))


def test_processes_on_the_batch_axes_load_their_own_rows() -> None:
    assert batch_share(FakeMesh([0, 0, 1, 1], data=4), batch_axes=["data"]) == (0, 2)
    assert batch_share(FakeMesh([1, 1, 0, 0], data=4), batch_axes=["data"]) == (1, 2)
    assert batch_share(FakeMesh([0, 0, 0, 0, 1, 1, 1, 1], data=2, fsdp=4), batch_axes=["data", "fsdp"]) == (
        0,
        2,
    )


def test_processes_that_split_only_the_sequence_or_the_heads_load_the_same_rows() -> None:
    # The batch is not split across the processes: each loads it whole.
    assert batch_share(FakeMesh([0, 0, 1, 1], sequence=4), batch_axes=[]) == (0, 1)
    # data 2 inside each process, tensor 2 across them: both load the same two halves.
    assert batch_share(FakeMesh([0, 1, 0, 1], data=2, tensor=2), batch_axes=["data"]) == (0, 1)


def test_rows_that_are_not_consecutive_slices_are_refused() -> None:
    with pytest.raises(ValueError, match="not equal consecutive slices"):
        batch_share(FakeMesh([0, 1, 0, 1], data=4), batch_axes=["data"])
