"""What a checkpoint records of the mesh it was written on, and the line a resume on another mesh prints.

    resuming on data=2 (the checkpoint was written on data=8): trainer.invariant keeps every step bitwise
    equal to a run on the old mesh

`trainer.invariant` (halyard.train.invariant) covers changes of the replica, data and fsdp sizes and of the
process count, with the same slices; any other change (tensor, sequence, stage, expert, the slices, the
switch itself) changes how sums are split, so the run continues correctly but not bitwise.
"""

from __future__ import annotations

from typing import Any

import jax

from halyard.shard import DCN_AXES, mesh_axis_sizes, process_count
from halyard.train.run_config import TrainConfig

METADATA_KEY = "mesh"
"""The checkpoint metadata key of the record."""


def mesh_record(config: TrainConfig, mesh: jax.sharding.Mesh) -> dict[str, Any]:
    """The checkpoint metadata describing the mesh, the process count and the invariant step's setting."""
    trainer = config.trainer
    return {
        METADATA_KEY: {
            "axes": {name: int(size) for name, size in mesh_axis_sizes(mesh).items() if size > 1},
            "processes": process_count(),
            "invariant_slices": trainer.canonical_slices if trainer.invariant else 0,
        }
    }


def resume_note(saved: dict[str, Any] | None, current: dict[str, Any]) -> str | None:
    """The one line saying whether a resume onto ``current`` stays bitwise equal to the run that wrote
    ``saved`` (both `mesh_record` values), or None when the mesh and process count did not change or the
    checkpoint records none."""
    if not saved or METADATA_KEY not in saved:
        return None
    then, now = saved[METADATA_KEY], current[METADATA_KEY]
    if then["axes"] == now["axes"] and then["processes"] == now["processes"]:
        return None
    where = f"resuming on {_describe(now)} (the checkpoint was written on {_describe(then)})"
    changed = {
        name
        for name in set(then["axes"]) | set(now["axes"])
        if then["axes"].get(name) != now["axes"].get(name)
    }
    other = sorted(changed - set(DCN_AXES))
    if not now["invariant_slices"]:
        return f"{where}: steps will differ in the last bits from the old mesh's (trainer.invariant=true keeps replica/data/fsdp and process-count changes bitwise)"
    if other:
        return f"{where}: not bitwise equal to the old mesh's steps: trainer.invariant covers replica/data/fsdp and process-count changes, not {', '.join(other)}"
    if then["invariant_slices"] != now["invariant_slices"]:
        return f"{where}: not bitwise equal to the old mesh's steps: the checkpoint was written with {_slices(then)}, this run uses {_slices(now)}"
    return f"{where}: trainer.invariant keeps every step bitwise equal to a run on the old mesh"


def _describe(record: dict[str, Any]) -> str:
    axes = " x ".join(f"{name}={size}" for name, size in record["axes"].items()) or "1 device"
    processes = record["processes"]
    return axes if processes == 1 else f"{axes}, {processes} processes"


def _slices(record: dict[str, Any]) -> str:
    slices = record["invariant_slices"]
    return f"trainer.invariant_slices={slices}" if slices else "trainer.invariant=false"
