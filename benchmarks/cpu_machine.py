"""What a CPU benchmark ran on: the processor, its cores and hyperthreads, the vector instructions that XLA's
and PyTorch's kernels are chosen by, and each library's thread count.

The serving figures of two 2-core machines differ (issue 52: 2.1-2.6x transformers here, 1.25-1.67x on a
machine with AVX-512 FP16), and a figure says little without these: two vCPUs may be two cores or one core's
two hyperthreads, and XLA's CPU client starts one thread per logical CPU (``PJRT_NPROC`` overrides it).

Usage::

    python benchmarks/cpu_machine.py        # prints the description as JSON
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")
"""The /proc/cpuinfo flags reported: the vector instructions the libraries' matrix kernels dispatch on."""


def describe(
    environ: Mapping[str, str] | None = None,
    cpuinfo: Path = Path("/proc/cpuinfo"),
    sysfs: Path = Path("/sys/devices/system/cpu"),
    cpus: set[int] | None = None,
) -> dict[str, Any]:
    """The machine this process runs on.

    Args:
        environ: the environment (default this process's): ``PJRT_NPROC`` / ``NPROC`` and ``XLA_FLAGS``.
        cpuinfo, sysfs: where the processor and its topology are read (other paths for a test).
        cpus: the logical CPUs this process may run on (default its affinity).

    Returns:
        ``vendor``, ``model``, ``logical_cpus``, ``physical_cores`` and ``threads_per_core`` (None where the
        topology cannot be read, as in some sandboxes), ``isa`` (the `ISA_FLAGS` present), ``xla_threads``
        (the size of XLA's CPU thread pool), ``torch_threads`` (None unless torch is imported) and
        ``xla_flags``.
    """
    environ = os.environ if environ is None else environ
    cpus = set(os.sched_getaffinity(0)) if cpus is None else cpus
    fields = _first_processor(cpuinfo)
    flags = set(fields.get("flags", "").split())
    cores = _physical_cores(sysfs, cpus)
    pool = next((environ[name] for name in ("PJRT_NPROC", "NPROC") if environ.get(name, "").isdigit()), None)
    torch = sys.modules.get("torch")
    return {
        "vendor": fields.get("vendor_id"),
        "model": fields.get("model name"),
        "logical_cpus": len(cpus),
        "physical_cores": cores,
        "threads_per_core": None if not cores else len(cpus) / cores,
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "xla_threads": int(pool) if pool is not None else len(cpus),
        "torch_threads": None if torch is None else torch.get_num_threads(),
        "xla_flags": environ.get("XLA_FLAGS", ""),
    }


def summary(machine: Mapping[str, Any]) -> str:
    """One line of `describe`'s result."""
    cores = machine["physical_cores"]
    layout = "cores unknown" if cores is None else f"{cores} cores x {machine['threads_per_core']:g} threads"
    return (
        f"{machine['vendor']} {machine['model']}: {machine['logical_cpus']} CPUs ({layout}), "
        f"{' '.join(machine['isa']) or 'no AVX2'}; XLA {machine['xla_threads']} threads, "
        f"torch {machine['torch_threads']} threads"
    )


def _first_processor(cpuinfo: Path) -> dict[str, str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def _physical_cores(sysfs: Path, cpus: set[int]) -> int | None:
    """Distinct (package, core) pairs among ``cpus``; None when a CPU's topology is missing."""
    cores = set()
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            package = (topology / "physical_package_id").read_text().strip()
            cores.add((package, (topology / "core_id").read_text().strip()))
        except OSError:
            return None
    return len(cores)


if __name__ == "__main__":
    print(json.dumps(describe(), indent=1))
