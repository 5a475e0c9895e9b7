"""Saving replicated arrays compiles no programs: small arrays are written whole by one replica (orbax's
replica-parallel slicing only where a slice holds `REPLICA_PARALLEL_MIN_SLICE_BYTES`)."""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from halyard.train.checkpoint.manager import CheckpointManager


class _Compiles(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Compiling "):
            self.names.append(message.split("\n")[0])


def test_saving_small_replicated_arrays_compiles_nothing_and_round_trips(tmp_path: Path) -> None:
    devices = np.array(jax.devices()[:8])
    assert devices.size == 8, "the suite runs with 8 simulated devices"
    replicated = NamedSharding(Mesh(devices, ("data",)), PartitionSpec())
    shapes = [(24, 16), (16, 8), (16,), (3, 5, 7), (1000,)]
    state = {
        f"w{index}": jax.device_put(jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape), replicated)
        for index, shape in enumerate(shapes)
    }
    jax.block_until_ready(state)
    compiles = _Compiles()
    jax_logger = logging.getLogger("jax")
    jax_logger.addHandler(compiles)
    with CheckpointManager(tmp_path) as manager:
        try:
            with jax.log_compiles(True):
                assert manager.save(1, state)
                manager.wait()
        finally:
            jax_logger.removeHandler(compiles)
        restored = manager.restore(None, jax.eval_shape(lambda: state))
    assert compiles.names == [], compiles.names
    for name, array in state.items():
        assert np.asarray(restored.state[name]).tobytes() == np.asarray(array).tobytes(), name
