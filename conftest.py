"""Test-wide settings: 8 simulated CPU devices unless the caller chose otherwise.

XLA reads XLA_FLAGS when jax initialises its backend, so this must run before any test imports jax.
"""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# Tests compile hundreds of tiny programs and run each a few times: XLA's backend at -O0 compiles them in
# about two thirds of the time. Values differ from an optimized build in the last bits only (summation
# order), which checks at float32 noise level compare within one program or against a reference kernel.
# Helpers that start subprocesses with their own XLA_FLAGS append HALYARD_TEST_XLA_COMPILE_FLAGS.
os.environ.setdefault(
    "HALYARD_TEST_XLA_COMPILE_FLAGS",
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
)
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + os.environ["HALYARD_TEST_XLA_COMPILE_FLAGS"]
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Hundreds of tests start a Python process (`halyard train`, kill -9 and resume, multi-process runs); each
# imports jax, numpy and transformers, about 3 s more when they are compiled from source each time
# (PYTHONDONTWRITEBYTECODE set in the environment, or packages installed without bytecode). Bytecode is
# written on first import, for these processes and the test workers alike.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

# Identical programs (the same tiny model in many trainer tests and their subprocesses) compile once.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(__file__), ".cache", "jax-compilation")
)
# The `train` / `halyard` subprocesses store every program that took 0.05 s or more to compile: each
# starts cold and compiles the same few dozen small programs (the orbax slices of a checkpoint save, the
# optimizer's initialisation) that earlier subprocesses compiled (about 10% of their CPU time). The test
# workers keep 0.5 s (`pytest_configure`): they live for hundreds of tests, and write less.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.05")
WORKER_MIN_COMPILE_TIME_SECS = 0.5

# Files whose tests take a minute or more in all (`--durations`): collected first, so that under xdist no
# worker is left running one of them alone at the end of the run. The order within each file is kept.
SLOW_FILES_FIRST = frozenset(
    {
        "test_docs.py",
        "test_training_kill.py",
        "test_benchmarks_smoke.py",
        "test_optimizers_benchmark_smoke.py",
        "test_install_alone.py",
        "test_trainer_multiprocess.py",
        "test_builtin_configs.py",
        "test_demo.py",
        "test_trainer_fit.py",
        "test_matrix_trainer.py",
        "test_matrix_interruptions.py",
        "test_mixture_trainer.py",
        "test_every_host_builds.py",
        "test_lora_trainer.py",
        "test_family_gemma.py",
        "test_cli_interrupts.py",
        "test_readme_scripts.py",
        "test_checkpoint_benchmark_smoke.py",
        "test_context_parallel_trainer.py",
        "test_context_parallel_benchmark_smoke.py",
        "test_pipeline_trainer.py",
        "test_pipeline.py",
        "test_invariant_trainer.py",
    }
)


def pytest_configure(config: object) -> None:
    import jax

    jax.config.update("jax_persistent_cache_min_compile_time_secs", WORKER_MIN_COMPILE_TIME_SECS)


def pytest_collection_modifyitems(items: list) -> None:
    items.sort(key=lambda item: item.path.name not in SLOW_FILES_FIRST)
