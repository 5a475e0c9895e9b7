"""Accelerators a plan can target: the peak FLOP/s of `halyard.train.perf.peaks` and each chip's memory."""

from __future__ import annotations

from dataclasses import dataclass

from halyard.train.config.errors import ConfigError
from halyard.train.perf.peaks import INT8_PEAK_OPS, PEAK_FLOPS, table_key

HBM_GIB: dict[str, float] = {
    "A100": 80.0,
    "H100 SXM": 80.0,
    "H100 PCIe": 80.0,
    "H200": 141.0,
    "TPU v4": 32.0,
    "TPU v5e": 16.0,
    "TPU v5p": 95.0,
    "TPU v6e": 32.0,
}
"""Memory per chip in GiB, by `PEAK_FLOPS` key (A100: the 80 GB part; pass --memory-gib 40 for the other)."""

GPU_MEMORY_FRACTION = 0.75
"""Share of a GPU's memory JAX's allocator takes by default (XLA_PYTHON_CLIENT_MEM_FRACTION)."""


@dataclass(frozen=True)
class Accelerator:
    """One chip of the planned run: its name in the peaks table, peak FLOP/s and usable memory."""

    name: str
    """The `PEAK_FLOPS` key (`H100 SXM`, `TPU v5p`, ...)."""
    peak_flops: float
    """Dense peak FLOP/s of one chip for the run's compute dtype."""
    dtype: str
    """The dtype `peak_flops` is for."""
    memory_gib: float
    """Memory of one chip."""
    usable_fraction: float
    """Share of `memory_gib` a JAX program can use by default."""

    @property
    def int8_peak_ops(self) -> float:
        """Dense int8 peak operations/s of one chip (`INT8_PEAK_OPS`; `peak_flops` where the table has none)."""
        return INT8_PEAK_OPS.get(self.name, self.peak_flops)

    @property
    def backend(self) -> str | None:
        """``tpu`` for a TPU, whose step is traced as for it (its matmuls, its attention kernel); None for a
        GPU, whose step is traced as the CPU's (as measured so far; a GPU's own program is not checked yet)."""
        return "tpu" if self.name.startswith("TPU") else None

    @property
    def usable_bytes(self) -> float:
        """Bytes a step may use on one chip."""
        return self.memory_gib * self.usable_fraction * 2**30


def accelerator(name: str, dtype: str, memory_gib: float | None = None) -> Accelerator:
    """The chip called ``name`` (a table key or a device kind: `h100`, `H200`, `tpu-v5p`, `v6e`).

    Args:
        name: the accelerator, matched as JAX device kinds are (case and `-`/`_` ignored).
        dtype: the matmul dtype (the run's `model.compute_dtype`, else its `model.param_dtype`).
        memory_gib: memory per chip, overriding `HBM_GIB`.

    Raises:
        ConfigError: an unknown accelerator or a dtype the table has no peak for.
    """
    spelled = name.replace("-", " ").replace("_", " ").strip()
    if spelled.lower().startswith("v") and spelled[1:2].isdigit():
        spelled = f"tpu {spelled}"
    key = next((k for k in PEAK_FLOPS if k.lower() == spelled.lower()), None) or table_key(spelled)
    if key is None:
        raise ConfigError(
            f"unknown accelerator {name!r} (--accelerator); choose one of: {', '.join(PEAK_FLOPS)}."
        )
    if dtype not in PEAK_FLOPS[key]:
        raise ConfigError(
            f"no {dtype} peak for {key} in the peaks table; set model.compute_dtype to one of "
            f"{', '.join(PEAK_FLOPS[key])}."
        )
    fraction = 1.0 if key.startswith("TPU") else GPU_MEMORY_FRACTION
    memory = HBM_GIB[key] if memory_gib is None else memory_gib
    return Accelerator(key, PEAK_FLOPS[key][dtype], dtype, memory, fraction)
