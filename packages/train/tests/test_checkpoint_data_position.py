"""Resuming on different data (manifest or seed) is refused unless asked for, with the differences shown."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from halyard.train.checkpoint.data_position import DataMismatchError, metadata_differences
from halyard.train.checkpoint.manager import CheckpointManager

MANIFEST = {"sources": [{"name": "stdlib", "num_records": 1200, "fingerprint": "ab12"}], "seq_len": 64}
TARGET = {"w": jax.ShapeDtypeStruct((3,), jnp.float32)}


@pytest.fixture
def manager(tmp_path: Path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(4, {"w": jnp.arange(3.0)}, {"data": {"manifest": MANIFEST, "seed": 0}}, wait=True)
        yield manager


def test_the_same_data_position_restores(manager: CheckpointManager) -> None:
    restored = manager.restore(4, TARGET, expected_data={"manifest": MANIFEST, "seed": 0})
    assert np.array_equal(np.asarray(restored.state["w"]), np.arange(3.0))
    assert restored.extra_metadata["data"]["manifest"] == MANIFEST


def test_a_different_seed_is_refused_naming_it(manager: CheckpointManager) -> None:
    with pytest.raises(
        DataMismatchError, match=r"(?s)data\.seed: checkpoint 0, current run 1.*allow_data_mismatch"
    ):
        manager.restore(4, TARGET, expected_data={"manifest": MANIFEST, "seed": 1})


def test_a_different_manifest_is_refused_showing_the_difference(manager: CheckpointManager) -> None:
    grown = {**MANIFEST, "sources": [{**MANIFEST["sources"][0], "num_records": 1500}]}
    with pytest.raises(
        DataMismatchError,
        match=r"data\.manifest\.sources\[0\]\.num_records: checkpoint 1200, current run 1500",
    ):
        manager.restore(None, TARGET, expected_data={"manifest": grown, "seed": 0})


def test_a_mismatch_is_allowed_on_request_with_a_warning(manager: CheckpointManager) -> None:
    with pytest.warns(UserWarning, match="data.seed: checkpoint 0, current run 9"):
        restored = manager.restore(
            4, TARGET, expected_data={"manifest": MANIFEST, "seed": 9}, allow_data_mismatch=True
        )
    assert restored.step == 4


def test_a_checkpoint_without_data_position_is_refused_when_one_is_expected(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, {"w": jnp.zeros(3)}, wait=True)
        with pytest.raises(DataMismatchError, match="records no data position"):
            manager.restore(1, TARGET, expected_data={"seed": 0})


def test_metadata_differences_lists_every_difference() -> None:
    saved = {"a": 1, "b": [1, 2], "c": {"d": "x"}, "gone": True}
    current = {"a": 1, "b": [1, 3], "c": {"d": "y"}, "new": None}
    assert metadata_differences(saved, current) == [
        "b[1]: checkpoint 2, current run 3",
        "c.d: checkpoint 'x', current run 'y'",
        "gone: checkpoint True, absent in the current run",
        "new: absent in the checkpoint, current run None",
    ]
    assert metadata_differences({"x": (1, 2)}, {"x": [1, 2]}) == []
