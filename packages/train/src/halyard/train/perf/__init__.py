"""Performance accounting: peak FLOP/s per device (table or measured), MFU, and goodput.

peak = device_peak_flops(jax.devices()[0], "bfloat16")    # PeakFlops(..., source="table"|"measured")
utilisation = mfu(flops_per_step, step_seconds, jax.device_count(), peak.flops_per_second)
"""
