"""Performance accounting: peak FLOP/s per device (table or measured), MFU, and goodput.

peak = device_peak_flops(jax.devices()[0], "bfloat16")    # PeakFlops(..., source="table"|"measured")
utilisation = mfu(flops_per_step, step_seconds, jax.device_count(), peak.flops_per_second)
"""

from halyard.train.perf.goodput import Goodput
from halyard.train.perf.mfu import mfu, transformer_train_flops_per_token
from halyard.train.perf.peaks import (
    PEAK_FLOPS,
    PeakFlops,
    clear_measured_peaks,
    device_peak_flops,
    measure_matmul_flops,
    table_key,
)

__all__ = [
    "PEAK_FLOPS",
    "Goodput",
    "PeakFlops",
    "clear_measured_peaks",
    "device_peak_flops",
    "measure_matmul_flops",
    "mfu",
    "table_key",
    "transformer_train_flops_per_token",
]
