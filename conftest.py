"""Test-wide settings: 8 simulated CPU devices unless the caller chose otherwise.

XLA reads XLA_FLAGS when jax initialises its backend, so this must run before any test imports jax.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

# Identical programs (the same tiny model in many trainer tests and their subprocesses) compile once.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(__file__), ".cache", "jax-compilation")
)
# Every program, however quick to compile: a training subprocess otherwise recompiles its hundred small
# ones (random draws of the init, checkpoint slices), a tenth of its CPU time.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
