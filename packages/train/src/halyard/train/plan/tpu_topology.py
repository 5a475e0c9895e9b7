"""A TPU's devices without the chip: libtpu's compiler, loaded from outside the importable packages, compiles
a plan's step for the chip's topology on any x86-64 Linux machine (`jax.experimental.topologies`).

libtpu is looked for at ``TPU_LIBRARY_PATH``, else where ``make venv`` puts it (``.venv/libtpu``, a
``pip install --target`` folder that is not on ``sys.path``: an importable libtpu makes every JAX process try
to start a TPU and marks the TPU-only tests runnable).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
from jax._src import xla_bridge
from jax.experimental import topologies

from halyard.train.config.errors import ConfigError

LIBTPU_VERSION = "0.0.42.1"
"""The libtpu `make venv` installs: the one JAX 0.10.2's ``jax[tpu]`` pins (the TPU machines' compiler)."""

LIBTPU_HINT = (
    f"{sys.executable} -m pip install --no-deps --target {Path(sys.prefix) / 'libtpu'} "
    f'"libtpu=={LIBTPU_VERSION}" (make venv does), or set TPU_LIBRARY_PATH to a libtpu.so'
)
"""How to get libtpu, printed with a plan that falls back to the CPU's estimate."""

TOPOLOGIES: dict[str, tuple[str, dict[int, tuple[str, tuple[int, int, int]]]]] = {
    "TPU v5e": (
        "v5e",
        {
            1: ("1x1", (1, 1, 1)),
            4: ("2x2", (2, 2, 1)),
            8: ("2x4", (2, 4, 1)),
            **{n: (shape, (2, 2, 1)) for n, shape in ((16, "4x4"), (32, "4x8"), (64, "8x8"), (128, "8x16"))},
            256: ("16x16", (2, 2, 1)),
        },
    ),
}
"""By accelerator (`halyard.train.plan.accelerators` key): the topology's chip name, and per chip count (the
slices Cloud TPU sells) its shape and chips per host (one host of 1, 4 or 8 chips; 4 a host beyond)."""

QUIET_START = {
    "TPU_ACCELERATOR_TYPE": "v5litepod-1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_SKIP_MDS_QUERY": "1",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}
"""Set unless already set: without the first three libtpu looks for a TPU VM's metadata and logs errors; the
last lets plans compile side by side (libtpu's lockfile guards a chip, and a plan holds none)."""


def libtpu_path() -> Path | None:
    """libtpu.so at ``TPU_LIBRARY_PATH``, else in ``<venv>/libtpu``; None where there is none."""
    configured = os.environ.get("TPU_LIBRARY_PATH")
    if configured:
        return Path(configured) if Path(configured).is_file() else None
    installed = Path(sys.prefix) / "libtpu" / "libtpu" / "libtpu.so"
    return installed if installed.is_file() else None


def libtpu_version(library: Path) -> str:
    """The version of the libtpu wheel ``library`` was unpacked from ("unknown" outside a wheel's folder)."""
    found = sorted(library.parent.parent.glob("libtpu-*.dist-info"))
    return found[-1].name.removeprefix("libtpu-").removesuffix(".dist-info") if found else "unknown"


def topology_name(chip: str, count: int) -> tuple[str, tuple[int, int, int]] | None:
    """(``v5e:2x4``, chips per host) for 8 chips of a TPU v5e; None for an accelerator without a topology here.

    Raises:
        ConfigError: a chip count that is no slice of the chip.
    """
    if chip not in TOPOLOGIES:
        return None
    prefix, shapes = TOPOLOGIES[chip]
    if count not in shapes:
        raise ConfigError(
            f"--devices {count}: a {chip} slice has one of {', '.join(map(str, shapes))} chips."
        )
    shape, per_host = shapes[count]
    return f"{prefix}:{shape}", per_host


def topology_devices(chip: str, count: int) -> tuple[list, str] | None:
    """The devices of a ``count``-chip ``chip`` slice, to compile for (never to run on), and a line saying
    what compiled; None without libtpu or for an accelerator without a topology here.

    Args:
        chip: the accelerator's `halyard.train.plan.accelerators` key (``TPU v5e``).
        count: chips of the slice.
    """
    topology, library = topology_name(chip, count), libtpu_path()
    if topology is None or library is None:
        return None
    name, per_host = topology
    os.environ["TPU_LIBRARY_PATH"] = str(library)
    for key, value in QUIET_START.items():
        os.environ.setdefault(key, value)
    if not xla_bridge.backends_are_initialized():  # the CPU only: this process never starts a TPU
        jax.config.update("jax_platforms", "cpu")
    description = topologies.get_topology_desc(
        name, "tpu", chip_config_name="default", chips_per_host_bounds=per_host, num_slices=1
    )
    devices = list(description.devices)
    return devices, f"{name} topology, TPU compiler of libtpu {libtpu_version(library)}"
