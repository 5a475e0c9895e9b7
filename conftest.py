"""Test-wide settings: 8 simulated CPU devices unless the caller chose otherwise.

XLA reads XLA_FLAGS when jax initialises its backend, so this must run before any test imports jax.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# Tests compile hundreds of tiny programs and run each a few times: XLA's backend at -O0, with its older loop
# emitters instead of the fusion emitters, compiles them in a fraction of the time of its defaults.
# Values differ from an optimized build in the last bits only (summation order), which checks at float32 noise
# level compare within one program or against a reference kernel. Without fused multiply-adds
# (`--xla_cpu_max_isa=AVX`, what `train` sets for trainer.invariant and rl.deterministic): the older emitters
# contract a multiply and an add where both land in one fused loop, which differs between a 1-device and an
# 8-device program, so the bitwise tests across device counts test the run a user starts.
# HALYARD_TEST_ISA chooses another cap (AVX2, ...), or `native` for none (make parity-isa).
# Helpers that start subprocesses with their own XLA_FLAGS append HALYARD_TEST_XLA_COMPILE_FLAGS.
os.environ.setdefault("HALYARD_TEST_ISA", "AVX")
os.environ.setdefault(
    "HALYARD_TEST_XLA_COMPILE_FLAGS",
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
    + (
        ""
        if os.environ["HALYARD_TEST_ISA"] == "native"
        else f" --xla_cpu_max_isa={os.environ['HALYARD_TEST_ISA']}"
    ),
)
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + os.environ["HALYARD_TEST_XLA_COMPILE_FLAGS"]
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Helpers every package's tests share (float_tolerance.py: tolerances derived from the arithmetic).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tests", "support"))
# Identical programs (the same tiny model in many trainer tests and their subprocesses) compile once, in one
# folder for the test workers and the processes they start. Set before the import below, which imports jax:
# jax reads JAX_COMPILATION_CACHE_DIR when it is imported, and a worker that missed it kept no cache until its
# first Trainer set its own default (~/.cache/halyard/jax, which no subprocess reads).
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(__file__), ".cache", "jax-compilation")
)
# XLA's CPU runtime gets 4 threads per simulated device (PJRT_NPROC), here before any test touches a device and
# for every process the tests start: with its default of one thread per device, a program with independent
# collectives (tensor parallelism's all-reduces beside an all-gather over the data axis) deadlocked a test
# worker in about one CI run of three (halyard.shard.cpu_threads).
from halyard.shard.cpu_threads import reserve_collective_threads

reserve_collective_threads()
# Hundreds of tests start a Python process (`halyard train`, kill -9 and resume, multi-process runs); each
# imports jax, numpy and transformers, about 3 s more when they are compiled from source each time
# (PYTHONDONTWRITEBYTECODE set in the environment, or packages installed without bytecode). Bytecode is
# written on first import, for these processes and the test workers alike.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

# The `train` / `halyard` subprocesses store every program that took 0.05 s or more to compile: each
# starts cold and compiles the same few dozen small programs (the orbax slices of a checkpoint save, the
# optimizer's initialisation) that earlier subprocesses compiled (about 10% of their CPU time). The test
# workers keep 0.5 s (`pytest_configure`): they live for hundreds of tests, and write less.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.05")
WORKER_MIN_COMPILE_TIME_SECS = 0.5

# Seconds each slow file's tests took in all (`--durations=0` of a clean-clone `make test` run, files of 15 s
# or more), by the file's path from the repository root (several files share a name: test_readme.py, ...).
# Files are collected longest first, each file's tests in their order (a worker that gets several
# in a row sets their module fixtures up once): under xdist the long ones start early, and the run ends on
# short tests instead of one worker running a minute-long file alone while the others idle. Unlisted files
# come last, in collection order.
ROOT = Path(__file__).resolve().parent
FILE_SECONDS = {
    # Every figure: worker-seconds in a clean-clone `make test` (2026-12-06 18:09, 3 workers on 2 cores, the
    # loop emitters without fused multiply-adds); the notes below say why a file costs what it does.
    # A file that starts late runs in the suite's tail.
    "packages/serve/tests/test_warmup.py": 23,
    "packages/train/tests/test_cli_relative_run_dir.py": 9,  # 18 in the 2026-12-07 clean clone; its two runs in the worker: 9.5 -> 4.9 s alone
    "packages/models/tests/test_paged_decoding.py": 15,
    "packages/models/tests/test_reports.py": 13,
    "packages/train/tests/test_optimizer_state_placement.py": 18,  # 32 in the 2026-12-07 clean clone; its offload runs in the worker since
    "packages/models/tests/test_attention_splash.py": 15,
    "tests/test_docs.py": 387,  # 394 in the 2026-12-07 clean clone; 10_rl at 2 smoke steps since (43 s there, ~36 now)
    # the demo's 100 steps optimised (about 125 s), kill and resume, 2 processes; 157 s alone (was 181) since the
    # nucleus run is the killed run's reference and the watched GRPO run (with test_watch_trainer.py's grpo test)
    # 259: 327 in the 2026-12-07 clean-clone run less its SmolLM2-shaped run (68 s; test_grpo_real_shapes.py
    # asserts the same through the same path)
    "packages/train/tests/test_grpo_trainer.py": 250,  # and three runs in the worker instead of `train` processes: ~9 s less
    # Was unlisted, so it came last: a 160 s kill-and-resume test near the end of the run, and each worker sent
    # part of the file in the run's small last shares sets its module fixture (the doremi command, ~40 s) up again.
    "packages/train/tests/test_doremi_trainer.py": 84,  # 94 in the 2026-12-07 clean clone; `halyard doremi` in the worker since
    # Was unlisted: two `train` runs of a 30-layer checkpoint (60-170 s each) started in the run's last minutes.
    # 191 s in the last clean-clone run; the rollout engine's 2 programs instead of 6 take 20-28% off each;
    # optimised programs instead of -O0: 94-103 s -> 69-70 s alone.
    "packages/train/tests/test_grpo_real_shapes.py": 113,
    "packages/train/tests/test_spike_replay.py": 13,  # 19 in the 2026-12-07 clean clone; its fixture trains in the worker since: 13.6 -> 9.0 s alone
    "tests/test_serve_rl_benchmark_smoke.py": 114,  # the serve, TPU-profile, host-step and RL benchmarks at quick size
    "tests/test_serve_start_phases_smoke.py": 25,  # new (2026-12-07 clean clone): fresh `halyard serve` starts, small
    "packages/models/tests/test_paged_decode_pallas.py": 20,  # new: the token decode kernel in the TPU interpreter
    "packages/serve/tests/test_server_backend_start.py": 8,  # new: two fresh processes
    "packages/serve/tests/test_engine.py": 72,  # new (halyard-serve's): six families against the full forward
    "tests/test_serve_transformers_generate.py": 16,  # new: four families against transformers' generate
    "packages/serve/tests/test_sharded_engine.py": 29,  # new: tensor parallel and replicas
    # the bitwise batch-invariance matrix at width 256 and its no-FMA subprocess (6 programs at full optimisation):
    # 293 worker-s in the last clean-clone run, about 0.55x since (236 -> 126 CPU s alone)
    "packages/serve/tests/test_deterministic.py": 136,
    "packages/train/tests/test_rl_losses.py": 33,  # new: TRL's GRPOTrainer on the same arrays
    "tests/reliability/test_training_kill.py": 103,
    "tests/test_benchmarks_smoke.py": 70,
    "packages/models/tests/test_pipeline.py": 51,
    "packages/train/tests/test_matrix_trainer.py": 137,
    "packages/train/tests/test_invariant_trainer.py": 194,  # 248 in the 2026-12-07 clean clone; 10 steps instead of 20: 129 -> 101 s alone
    "packages/train/tests/test_watch_trainer.py": 19,  # 18 s alone: its GRPO run is test_grpo_trainer.py's nucleus run
    "tests/test_watch_benchmark_smoke.py": 9,
    "tests/reliability/test_nonfinite.py": 28,
    "tests/test_install_alone.py": 65,
    "packages/train/tests/test_context_parallel_trainer.py": 68,
    "packages/train/tests/test_builtin_configs.py": 21,
    "packages/train/tests/test_trainer_multiprocess.py": 26,
    "packages/models/tests/test_family_gemma.py": 39,
    "tests/test_pipeline_benchmark_smoke.py": 43,
    "tests/test_invariant_benchmark_smoke.py": 37,  # new: 31 s alone
    "packages/train/tests/test_invariant_layer_gathers.py": 72,  # new: 22 s alone with a warm compilation cache, about 3x cold
    "packages/serve/tests/test_server_operation.py": 63,  # halyard-serve: with test_server_answers.py, one server subprocess (was test_server.py: 33-43 s alone)
    "packages/serve/tests/test_server_answers.py": 21,
    "packages/train/tests/test_train_while_tokenizing.py": 23,
    "tests/reliability/test_damaged_checkpoints.py": 13,
    "packages/train/tests/test_checkpoint_benchmark_smoke.py": 25,
    "packages/train/tests/test_pipeline_trainer.py": 100,
    "packages/train/tests/test_trainer_fit.py": 44,  # 105 in the 2026-12-07 clean clone less its kill -9 and SIGTERM tests (test_training_kill.py)
    "packages/models/tests/test_lora.py": 34,
    "tests/test_context_parallel_benchmark_smoke.py": 19,
    "packages/models/tests/test_family_phi3.py": 15,
    "tests/reliability/test_checkpoint_write_errors.py": 12,
    "packages/named/tests/nn/test_stacked.py": 16,
    "packages/models/tests/test_family_olmo2.py": 13,
    "packages/train/tests/test_first_contact_errors.py": 29,
    "packages/models/tests/test_sharding.py": 13,
    "packages/train/tests/test_cli_interrupts.py": 27,
    "packages/named/tests/test_reductions.py": 16,
    "packages/train/tests/test_harness_during_training.py": 13,
    "packages/train/tests/test_invariant_step.py": 26,
    "packages/train/tests/test_dpo_trl_referee.py": 17,
    "packages/models/tests/test_context_parallel_attention.py": 25,
    "packages/named/tests/test_broadcast.py": 7,
    "packages/export/tests/test_real_config_parity.py": 18,
    "packages/train/tests/test_checkpoint_checksums.py": 4,
    "packages/train/tests/test_dpo_trainer.py": 17,
    "packages/models/tests/test_model_loss.py": 14,
    "packages/models/tests/test_mup.py": 7,
    "packages/train/tests/test_lora_trainer.py": 53,
    "packages/train/tests/test_trainer_step.py": 16,
    "packages/models/tests/test_moe_aux_mask.py": 9,
    "tests/test_worker_life.py": 26,
    "packages/models/tests/test_stack.py": 15,
    "packages/train/tests/test_plan.py": 28,
    "tests/test_optimizers_benchmark_smoke.py": 12,
    "packages/models/tests/test_mixtral.py": 8,
    "packages/models/tests/test_loss.py": 23,
    "packages/train/tests/test_checkpoint_crash_and_preemption.py": 8,
    "packages/models/tests/test_readme.py": 17,
    "packages/models/tests/test_family_qwen3.py": 17,
    "packages/train/tests/test_multiprocess_throughput.py": 10,
    "packages/models/tests/test_attention_implementations.py": 13,
    "packages/serve/tests/test_server_load.py": 48,  # new: 15-25 s alone
    "packages/train/tests/test_lora_dpo.py": 14,
    "packages/train/tests/test_harness_referee.py": 18,
    "packages/train/tests/test_continue_schedule.py": 10,
    "packages/models/tests/test_attention_softcap.py": 8,
    "packages/train/tests/test_sft_trainer.py": 11,
    "packages/train/tests/test_run_setup.py": 1,
    "packages/train/tests/test_mixture_trainer.py": 47,
    "tests/reliability/test_cache_faults.py": 9,
    "packages/models/tests/test_qwen2_sliding_window.py": 9,
    "packages/models/tests/test_ragged_paged_pallas.py": 9,  # new: the Pallas kernel interpreted: 2 steps, 2 model steps (merged)
    "tests/reliability/test_multiprocess_death.py": 14,
    "packages/named/tests/test_softmax.py": 10,
    "packages/train/tests/test_relocatable_run_dir.py": 6,
    "packages/train/tests/test_matrix_interruptions.py": 38,
    "packages/train/tests/test_demo.py": 40,  # 62 s in a clean-clone run; optimised programs: 29-30 s -> 23-24 s alone
    "packages/data-cache/tests/test_ray_builder.py": 11,
    "packages/train/tests/test_every_host_builds.py": 37,
    "packages/train/tests/test_harness_command.py": 8,
    "packages/train/tests/test_export_integration.py": 9,
    "packages/train/tests/test_tokenizer_folder_everywhere.py": 11,
    "packages/train/tests/test_serve_command.py": 7,
    "packages/train/tests/test_tpu_host_start.py": 43,  # new: train, generate/eval/replay/plan, serve with TPU_* variables set  # new: 15-18 s alone
    "packages/data-cache/tests/test_kill_resume.py": 7,
    "packages/train/tests/test_checkpoint_roundtrip.py": 12,
    "packages/named/tests/test_indexing.py": 11,
    "packages/train/tests/test_plan_tpu_topology.py": 23,
    "packages/train/tests/test_readme_scripts.py": 27,
    "tests/test_tpu_benchmark_smoke.py": 11,
    "packages/serve/tests/test_deterministic_bfloat16.py": 41,  # new: 30 s alone
}


def pytest_configure(config: object) -> None:
    import jax

    jax.config.update("jax_persistent_cache_min_compile_time_secs", WORKER_MIN_COMPILE_TIME_SECS)


def tpu_available() -> bool:
    """Whether the TPU-only tests can run: libtpu is installed (a TPU VM), or HALYARD_TEST_TPU=1 says so.

    Decided without starting JAX's backend: only one process can hold the chip, and it is the `train`
    processes those tests start.
    """
    import importlib.util

    return os.environ.get("HALYARD_TEST_TPU") == "1" or importlib.util.find_spec("libtpu") is not None


def pytest_collection_modifyitems(items: list) -> None:
    import pytest

    if not tpu_available():
        skip = pytest.mark.skip(reason="needs a TPU chip (no libtpu here); README.md, 'On a TPU', runs them")
        for item in items:
            if "tpu" in item.keywords:
                item.add_marker(skip)
    items.sort(key=lambda item: -FILE_SECONDS.get(Path(os.path.relpath(item.path, ROOT)).as_posix(), 0))


# Every program XLA's CPU backend compiles keeps LLVM's code sections mapped while it is cached, several
# memory maps a program. A test worker that compiles thousands of programs reaches the kernel's limit on a
# process's maps (vm.max_map_count, 65,530 by default): LLVM's next allocation fails ("LLVM compilation
# error: Cannot allocate memory") and the worker dies of a segfault. A CI run saw it in the export parity
# file, with 47,000 maps in another worker half an hour in. So after each test file, a worker past half the
# limit drops JAX's in-memory caches (the persistent compilation cache on disk keeps the programs).
def _map_limit() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return 0


MAP_LIMIT = _map_limit()


def mapped_regions() -> int:
    """The memory maps this process holds (0 where /proc cannot tell)."""
    try:
        with open(f"/proc/{os.getpid()}/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return 0


def release_compiled_programs(threshold: int) -> bool:
    """Drop JAX's compiled programs when this process holds more than ``threshold`` memory maps; whether it did."""
    if threshold <= 0 or "jax" not in sys.modules or mapped_regions() <= threshold:
        return False
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
    return True


def pytest_runtest_teardown(item: object, nextitem: object) -> None:
    if nextitem is None or getattr(nextitem, "path", None) != getattr(item, "path", None):
        release_compiled_programs(MAP_LIMIT // 2)
