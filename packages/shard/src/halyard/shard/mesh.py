"""`MeshSpec`: how many devices each parallelism axis gets, and the `jax.sharding.Mesh` it builds."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils

MESH_AXES: tuple[str, ...] = ("replica", "data", "fsdp", "expert", "sequence", "stage", "tensor")
"""Mesh axis names, slowest-varying first. The batch-splitting axes come first so that, with devices
ordered by process, each process's devices hold a contiguous block of batch rows; ``tensor`` varies
fastest because tensor parallelism communicates most and wants the closest devices."""

BATCH_AXES: tuple[str, ...] = ("replica", "data", "fsdp", "expert")
"""The mesh axes a batch is split over (in mesh order)."""

DCN_AXES: tuple[str, ...] = ("replica", "data", "fsdp")
"""Axes that may span slices (the slow data-centre network): only data-like parallelism tolerates it."""


@dataclass(frozen=True)
class MeshSpec:
    """The size of each parallelism axis of a device mesh.

    Every field is the total size of that mesh axis. One field may be ``-1``: it takes the devices left
    over (``data`` by default). The product of the sizes must equal the number of devices.

    Args:
        data: plain data parallelism (weights replicated, batch split).
        replica: an outer data-parallel axis, typically across slices (weights replicated).
        fsdp: fully sharded data parallelism (batch split and weights sharded).
        tensor: tensor (model) parallelism: heads / mlp / vocab split.
        sequence: sequence (context) parallelism: the ``pos`` axis of activations split.
        expert: expert parallelism for mixture-of-experts layers (the batch is split over it as well).
        stage: pipeline stages (layers split).
        dcn_replica, dcn_data, dcn_fsdp: of the size above, how many ways the axis spans slices
            (granules connected by the data-centre network: TPU slices, or processes on CPU/GPU).
            When any is above 1, the mesh is built with
            ``jax.experimental.mesh_utils.create_hybrid_device_mesh``; each must divide its axis.
    """

    data: int = -1
    replica: int = 1
    fsdp: int = 1
    tensor: int = 1
    sequence: int = 1
    expert: int = 1
    stage: int = 1
    dcn_replica: int = 1
    dcn_data: int = 1
    dcn_fsdp: int = 1

    def __post_init__(self) -> None:
        for name in MESH_AXES:
            size = getattr(self, name)
            if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
                raise ValueError(f"MeshSpec.{name} must be a positive int or -1 (the rest), got {size!r}")
        for name in DCN_AXES:
            size = getattr(self, f"dcn_{name}")
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"MeshSpec.dcn_{name} must be a positive int, got {size!r}")
        rest = [name for name in MESH_AXES if getattr(self, name) == -1]
        if len(rest) > 1:
            fix = "data=1" if "data" in rest else f"{rest[1]}=<size>"
            raise ValueError(
                f"MeshSpec: {' and '.join(rest)} are all -1, but only one axis can take the devices left "
                f"over. Give the others a size (e.g. {fix})"
            )

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The mesh axes the batch is split over, slowest first (sizes of 1 included)."""
        return BATCH_AXES

    def axis_sizes(self, num_devices: int) -> dict[str, int]:
        """Every mesh axis' size, in mesh order, with ``-1`` resolved for ``num_devices`` devices.

        Raises:
            ValueError: when the sizes cannot multiply to ``num_devices`` (the arithmetic is spelled out).
        """
        sizes = {name: getattr(self, name) for name in MESH_AXES}
        fixed = {name: size for name, size in sizes.items() if size != -1}
        fixed_product = math.prod(fixed.values())
        arithmetic = " * ".join(f"{name}={size}" for name, size in fixed.items() if size != 1) or "1"
        rest = [name for name, size in sizes.items() if size == -1]
        if rest:
            if num_devices % fixed_product:
                raise ValueError(
                    f"MeshSpec cannot split {num_devices} devices: {arithmetic} = {fixed_product} does not "
                    f"divide {num_devices}, so '{rest[0]}=-1' has no whole size. Choose sizes whose product "
                    f"divides {num_devices}"
                )
            sizes[rest[0]] = num_devices // fixed_product
        elif fixed_product != num_devices:
            raise ValueError(
                f"MeshSpec needs {arithmetic} = {fixed_product} devices, but {num_devices} are available. "
                f"Set one axis to -1 to take the devices left over, or change the sizes"
            )
        for name in DCN_AXES:
            dcn = getattr(self, f"dcn_{name}")
            if sizes[name] % dcn:
                raise ValueError(
                    f"MeshSpec: {name}={sizes[name]} cannot span dcn_{name}={dcn} slices: {dcn} does not "
                    f"divide {sizes[name]}"
                )
        return sizes

    def dcn_sizes(self) -> dict[str, int]:
        """How many slices each mesh axis spans (1 for axes that stay inside a slice), in mesh order."""
        return {name: getattr(self, f"dcn_{name}") if name in DCN_AXES else 1 for name in MESH_AXES}

    @property
    def is_multi_slice(self) -> bool:
        """Whether any axis spans slices (the mesh is then a hybrid DCN x ICI mesh)."""
        return any(getattr(self, f"dcn_{name}") > 1 for name in DCN_AXES)

    def device_grid(self, devices: Sequence[Any] | None = None) -> np.ndarray:
        """The devices arranged in an array of shape `axis_sizes` (mesh order), without building a Mesh.

        Args:
            devices: the devices to use (default: ``jax.devices()``, every process's devices).

        Raises:
            ValueError: when the sizes do not fit the devices, or the slices do not match ``dcn_*``.
        """
        devices = list(jax.devices() if devices is None else devices)
        sizes = self.axis_sizes(len(devices))
        shape = tuple(sizes.values())
        if not self.is_multi_slice:
            # Devices ordered by (process, id): the slowest mesh axes then walk across processes, so
            # every process holds whole, contiguous blocks of the batch-splitting axes.
            ordered = sorted(devices, key=lambda d: (getattr(d, "process_index", 0), d.id))
            return np.array(ordered, dtype=object).reshape(shape)
        dcn = self.dcn_sizes()
        ici_shape = tuple(sizes[name] // dcn[name] for name in MESH_AXES)
        dcn_shape = tuple(dcn.values())
        return mesh_utils.create_hybrid_device_mesh(
            ici_shape,
            dcn_shape,
            devices,
            process_is_granule=_granule_is_process(devices, math.prod(dcn_shape)),
        )

    def build(self, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
        """A `jax.sharding.Mesh` with axes `MESH_AXES` (sizes of 1 included, so any layout applies).

        Args:
            devices: the devices to use (default: ``jax.devices()``, every process's devices).

        Raises:
            ValueError: when the sizes do not multiply to the number of devices (message shows the sum).
        """
        return jax.sharding.Mesh(self.device_grid(devices), MESH_AXES)

    def replace(self, **sizes: int) -> MeshSpec:
        """A copy with some sizes changed: ``spec.replace(fsdp=4)``."""
        return dataclasses.replace(self, **sizes)


def _granule_is_process(devices: Sequence[Any], num_slices: int) -> bool:
    """Whether slices are told apart by process (CPU/GPU) rather than by ``slice_index`` (TPU)."""
    slice_indices = {getattr(d, "slice_index", None) for d in devices}
    return None in slice_indices or len(slice_indices) != num_slices


def mesh_axis_sizes(mesh: jax.sharding.Mesh) -> dict[str, int]:
    """``{axis name: size}`` of a mesh, in its order."""
    return dict(zip(mesh.axis_names, mesh.devices.shape))
