"""Peak matmul throughput per device, from a table for accelerators and measured once on CPU.

Table values are the vendors' dense (no sparsity) peaks per chip, in FLOP/s:

| device | bfloat16 | float32 | notes |
|---|---|---|---|
| A100 (SXM/PCIe) | 312e12 | 19.5e12 | f32 on CUDA cores; TF32 tensor cores: 156e12 (`tf32`) |
| H100 SXM | 989e12 | 67e12 | TF32 494.5e12 |
| H100 PCIe | 756e12 | 51e12 | TF32 378e12 |
| H200 | 989e12 | 67e12 | H100 SXM compute with more HBM |
| TPU v4 | 275e12 | 275e12 | |
| TPU v5e | 197e12 | 197e12 | |
| TPU v5p | 459e12 | 459e12 | |
| TPU v6e (Trillium) | 918e12 | 918e12 | |

TPU `float32` equals `bfloat16` because XLA's default matmul precision on TPU runs f32 inputs as a single
bf16 pass on the MXU. On GPUs, JAX's default precision uses TF32 for f32 matmuls on Ampere and later; ask
for `tf32` when that is what runs. A device kind not in the table (and every CPU) gets a peak measured by a
short jitted matmul benchmark, once per process, labelled `source="measured"`; given a folder, the
measurement is kept there (``measured-peaks.json``, keyed by device, dtype and CPU) and later processes on
the same machine read it instead of measuring again.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp

PEAK_FLOPS: dict[str, dict[str, float]] = {
    "A100": {"bfloat16": 312e12, "float16": 312e12, "tf32": 156e12, "float32": 19.5e12},
    "H100 SXM": {"bfloat16": 989e12, "float16": 989e12, "tf32": 494.5e12, "float32": 67e12},
    "H100 PCIe": {"bfloat16": 756e12, "float16": 756e12, "tf32": 378e12, "float32": 51e12},
    "H200": {"bfloat16": 989e12, "float16": 989e12, "tf32": 494.5e12, "float32": 67e12},
    "TPU v4": {"bfloat16": 275e12, "float32": 275e12},
    "TPU v5e": {"bfloat16": 197e12, "float32": 197e12},
    "TPU v5p": {"bfloat16": 459e12, "float32": 459e12},
    "TPU v6e": {"bfloat16": 918e12, "float32": 918e12},
}
"""Dense peak FLOP/s per chip, by table key and dtype name (see the module docstring for sources)."""

INT8_PEAK_OPS: dict[str, float] = {
    "A100": 624e12,
    "H100 SXM": 1979e12,
    "H100 PCIe": 1513e12,
    "H200": 1979e12,
    "TPU v5e": 394e12,
    "TPU v5p": 918e12,
    "TPU v6e": 1836e12,
}
"""Dense int8 peak operations/s per chip (the vendors' figures; TPU v4 has none above its bf16 rate), for
the matmuls ``model.quantization: int8`` runs on the int8 units."""

# `device_kind` strings as JAX reports them, lower-cased, mapped to table keys; the first match wins.
_KIND_PATTERNS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("h200",), "H200"),
    (("h100", "pcie"), "H100 PCIe"),
    (("h100",), "H100 SXM"),
    (("a100",), "A100"),
    (("tpu v6",), "TPU v6e"),
    (("tpu v5 lite",), "TPU v5e"),
    (("tpu v5e",), "TPU v5e"),
    (("tpu v5",), "TPU v5p"),
    (("tpu v4",), "TPU v4"),
)


@dataclass(frozen=True)
class PeakFlops:
    """A device's peak matmul throughput and where the number came from."""

    flops_per_second: float
    """Peak FLOP/s of one device."""
    source: str
    """`table` (vendor peak) or `measured` (a matmul benchmark on this machine)."""
    device_kind: str
    """The device kind the peak is for (JAX's `device.device_kind`)."""
    dtype: str
    """The dtype the peak is for."""

    def describe(self) -> str:
        """One line for logs: `"H100 SXM bfloat16 peak 989 TFLOP/s (table)"`, `"cpu float32 peak 29.33
        GFLOP/s (measured)"`."""
        return f"{self.device_kind} {self.dtype} peak {flops_per_second_text(self.flops_per_second)} ({self.source})"


def flops_per_second_text(value: float) -> str:
    """``value`` FLOP/s to 4 significant digits, with the SI prefix that puts it between 1 and 1000:
    ``29.33 GFLOP/s``."""
    value = float(f"{value:.4g}")
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.4g} {prefix}FLOP/s"
    return f"{value:.4g} FLOP/s"


def table_key(device_kind: str) -> str | None:
    """The `PEAK_FLOPS` key for a JAX `device_kind` string, or None when the table does not know it.

    Args:
        device_kind: e.g. `"NVIDIA H100 80GB HBM3"`, `"TPU v5 lite"`.
    """
    kind = device_kind.lower()
    for needles, key in _KIND_PATTERNS:
        if all(needle in kind for needle in needles):
            return key
    return None


def _dtype_name(dtype: str | jnp.dtype | type) -> str:
    if dtype == "tf32":
        return "tf32"
    return jnp.dtype(dtype).name


def device_peak_flops(
    device: jax.Device | None = None,
    dtype: str | jnp.dtype | type = "bfloat16",
    *,
    kept_in: str | os.PathLike[str] | None = None,
) -> PeakFlops:
    """The peak matmul FLOP/s of one device for `dtype`: from `PEAK_FLOPS`, else measured once.

    Args:
        device: the device (default: this process's first, `jax.local_devices()[0]`).
        dtype: the matmul input dtype (`bfloat16`, `float32`, `float16`, or `"tf32"` on GPUs).
        kept_in: a local folder where measured peaks are kept for later processes on this machine (the
            run's compilation cache folder); None, or a remote URL: measure in this process only.

    Raises:
        ValueError: a known accelerator without a table entry for `dtype`.
    """
    device = device if device is not None else jax.local_devices()[0]
    name = _dtype_name(dtype)
    key = table_key(device.device_kind) if device.platform != "cpu" else None
    if key is None:
        if name == "tf32":
            name = "float32"
        return _measured_peak(device.platform, device.device_kind, name, _local_folder(kept_in))
    if name not in PEAK_FLOPS[key]:
        raise ValueError(f"no {name} peak for {key} in PEAK_FLOPS; known: {', '.join(PEAK_FLOPS[key])}.")
    return PeakFlops(PEAK_FLOPS[key][name], "table", key, name)


PEAKS_FILE = "measured-peaks.json"
"""File name of the measured peaks kept in `device_peak_flops`'s ``kept_in`` folder."""


def _local_folder(folder: str | os.PathLike[str] | None) -> Path | None:
    if folder is None or "://" in str(folder):
        return None
    return Path(folder).expanduser()


def _machine_key(platform_name: str, device_kind: str, dtype: str) -> str:
    # The same home folder on machines with other CPUs (a shared file system) keeps one peak per CPU model.
    return f"{platform_name}|{device_kind}|{dtype}|{platform.machine()}|{_cpu_model()}|{os.cpu_count()}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


@functools.cache
def _measured_peak(platform_name: str, device_kind: str, dtype: str, folder: Path | None) -> PeakFlops:
    key = _machine_key(platform_name, device_kind, dtype)
    kept = _read_peaks(folder).get(key)
    if isinstance(kept, int | float) and kept > 0:
        return PeakFlops(float(kept), "measured", device_kind, dtype)
    # A device of this process: a computation placed on another process's device does not run here, so
    # timing it measured nothing (process 1 of a 2-process run reported a peak ~5000x too high).
    device = next(
        d for d in jax.local_devices() if d.platform == platform_name and d.device_kind == device_kind
    )
    flops = measure_matmul_flops(dtype, device=device)
    if folder is not None:
        _keep_peak(folder, key, flops)
    return PeakFlops(flops, "measured", device_kind, dtype)


def _read_peaks(folder: Path | None) -> dict[str, object]:
    if folder is None:
        return {}
    try:
        kept = json.loads((folder / PEAKS_FILE).read_text())
    except (OSError, ValueError):  # none yet, or a file another process is writing: measure
        return {}
    return kept if isinstance(kept, dict) else {}


def _keep_peak(folder: Path, key: str, flops: float) -> None:
    """Adds ``key`` to the folder's peaks file atomically (write aside, rename); a folder that cannot be
    written keeps nothing."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        kept = {**_read_peaks(folder), key: flops}
        aside = folder / f".{PEAKS_FILE}.{os.getpid()}"
        aside.write_text(json.dumps(kept, indent=1, sort_keys=True))
        os.replace(aside, folder / PEAKS_FILE)
    except OSError:
        pass


def clear_measured_peaks() -> None:
    """Forget measured peaks, so the next `device_peak_flops` measures again (tests, changed load)."""
    _measured_peak.cache_clear()


def measure_matmul_flops(
    dtype: str = "float32",
    *,
    size: int = 1024,
    repeats: int = 5,
    device: jax.Device | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """FLOP/s of the fastest of `repeats` jitted `size x size` matmuls (after one compile-and-warm-up run).

    The best run, not the mean, estimates the peak: slower runs measure interference, not the device.

    Args:
        dtype: input dtype of the matmul.
        size: side of the square matrices (2 * size**3 FLOPs per matmul).
        repeats: timed runs.
        device: where to run (default: JAX's default device).
        clock: seconds counter (injectable for tests).

    Raises:
        ValueError: `size` or `repeats` below 1.
    """
    if size < 1 or repeats < 1:
        raise ValueError(f"size and repeats must be at least 1, got size={size}, repeats={repeats}.")
    key_left, key_right = jax.random.split(jax.random.key(0))
    left = jax.device_put(jax.random.normal(key_left, (size, size), dtype), device)
    right = jax.device_put(jax.random.normal(key_right, (size, size), dtype), device)
    matmul = jax.jit(jnp.matmul)
    matmul(left, right).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        matmul(left, right).block_until_ready()
        best = min(best, clock() - start)
    return 2.0 * size**3 / max(best, 1e-9)
