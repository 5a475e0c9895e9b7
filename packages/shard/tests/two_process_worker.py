"""One process of the two-process test (run by test_multiprocess.py, never collected by pytest).

Joins the run from HALYARD_* environment variables, builds one mesh over both processes' devices,
assembles a global batch from this process's rows, runs a jitted sharded step, and prints a JSON line
with what it saw for the parent to compare.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import halyard.named as hn
from halyard.named import named
from halyard.shard import (
    Layout,
    MeshSpec,
    barrier,
    constrain,
    global_batch_from_local,
    init_sharded,
    initialize,
    is_main_process,
    use_layout,
)

ROWS_PER_PROCESS = 4
EMBED = 8
MLP = 16


def local_rows(process_index: int) -> np.ndarray:
    """Process p owns global rows [4p, 4p+4) of a batch whose row r is r + 0.01 * column."""
    rows = np.arange(
        ROWS_PER_PROCESS * process_index, ROWS_PER_PROCESS * (process_index + 1), dtype=np.float32
    )
    return rows[:, None] + 0.01 * np.arange(EMBED, dtype=np.float32)[None, :]


def init_weights(key: jax.Array) -> dict:
    w_in_key, w_out_key = jax.random.split(key)
    return {
        "w_in": named(jax.random.normal(w_in_key, (EMBED, MLP)) / EMBED, ("embed", "mlp")),
        "w_out": named(jax.random.normal(w_out_key, (MLP, EMBED)) / MLP, ("mlp", "embed")),
    }


def main() -> None:
    # the other process may start late on a loaded machine: the wait for it is a hang guard only
    info = initialize(initialization_timeout_s=300, heartbeat_timeout_s=30)
    mesh = MeshSpec(data=-1).build()
    layout = Layout.fsdp(min_shard=0)
    fsdp_mesh = MeshSpec(data=1, fsdp=-1).build()
    hybrid = MeshSpec(data=2, fsdp=2, dcn_data=2).build()  # data across processes (the DCN), fsdp within

    batch = global_batch_from_local(
        {"x": named(local_rows(info.process_index), ("batch", "embed"))}, fsdp_mesh
    )
    params = init_sharded(init_weights, layout, fsdp_mesh, jax.random.key(0))

    def loss(params: dict, batch: dict) -> jax.Array:
        x = constrain(batch["x"])
        hidden = hn.tanh(hn.dot(x, params["w_in"], axis="embed"))
        out = hn.dot(hidden, params["w_out"], axis="mlp")
        return hn.mean(out * out).array

    with use_layout(layout, fsdp_mesh):
        step = jax.jit(jax.value_and_grad(loss))
        value, grads = step(params, batch)
    row_sums = jax.jit(lambda b: hn.sum(b["x"], "embed").array, out_shardings=None)(batch)
    barrier("after-step")
    report = {
        "process_index": info.process_index,
        "process_count": info.process_count,
        "local_device_count": info.local_device_count,
        "device_count": info.device_count,
        "joined_by": info.joined_by,
        "is_main": is_main_process(),
        "mesh_shape": dict(zip(mesh.axis_names, mesh.devices.shape)),
        "mesh_processes": [d.process_index for d in mesh.devices.flat],
        "hybrid_processes": [[d.process_index for d in row] for row in hybrid.devices.reshape(2, 2)],
        "batch_shape": list(batch["x"].array.shape),
        "local_batch_rows": sorted(int(s.index[0].start or 0) for s in batch["x"].array.addressable_shards),
        "loss": float(value),
        "grad_norm": float(
            jnp.sqrt(
                sum(jnp.sum(g.array**2) for g in jax.tree.leaves(grads, is_leaf=lambda g: hasattr(g, "axes")))
            )
        ),
        "w_in": multihost_utils.process_allgather(params["w_in"].array, tiled=True).tolist(),
        "w_out": multihost_utils.process_allgather(params["w_out"].array, tiled=True).tolist(),
        "row_sums": multihost_utils.process_allgather(row_sums, tiled=True).tolist(),
    }
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
