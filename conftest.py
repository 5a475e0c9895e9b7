"""Test-wide settings: 8 simulated CPU devices unless the caller chose otherwise.

XLA reads XLA_FLAGS when jax initialises its backend, so this must run before any test imports jax.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# Tests compile hundreds of tiny programs and run each a few times: XLA's backend without LLVM's costly
# passes compiles them in about two thirds of the time (same values: float semantics do not depend on it).
# Helpers that start subprocesses with their own XLA_FLAGS append HALYARD_TEST_XLA_COMPILE_FLAGS.
os.environ.setdefault(
    "HALYARD_TEST_XLA_COMPILE_FLAGS",
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
)
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + os.environ["HALYARD_TEST_XLA_COMPILE_FLAGS"]
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

# Identical programs (the same tiny model in many trainer tests and their subprocesses) compile once.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(__file__), ".cache", "jax-compilation")
)
# Programs that took half a second or more: with every program (0 s), serializing an executable for the
# cache segfaulted a long-lived test worker twice in two full runs (jaxlib 0.10.2, CPU); 0.5 s never did.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
