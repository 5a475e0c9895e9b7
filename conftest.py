"""Test-wide settings: 8 simulated CPU devices unless the caller chose otherwise.

XLA reads XLA_FLAGS when jax initialises its backend, so this must run before any test imports jax.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

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

# The `train` / `halyard` subprocesses and the test workers store every program that took 0.05 s or more to
# compile. Each subprocess starts cold and compiles the same few dozen small programs (the orbax slices of a
# checkpoint save, the optimizer's initialisation) that earlier subprocesses compiled (about 10% of their CPU
# time). A worker compiles again what another worker, the worker it replaced or its own previous Trainer
# compiled (a resumed run's step: new jitted functions, which jax's in-memory caches do not match): at 0.5 s
# instead, test_matrix_trainer.py took 73.7 CPU s alone from a cold cache against 69.1, test_family_gemma.py
# 45.8 against 43.8 (its programs differ from test to test: what the writes cost is not seen).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.05")

# Seconds each slow file's tests took in all (`--durations=0` of a clean-clone `make test` run, files of 15 s
# or more), by the file's path from the repository root (several files share a name: test_readme.py, ...).
# Files are collected longest first, each file's tests in their order (a worker that gets several
# in a row sets their module fixtures up once): under xdist the long ones start early, and the run ends on
# short tests instead of one worker running a minute-long file alone while the others idle. Unlisted files
# come last, in collection order.
ROOT = Path(__file__).resolve().parent
FILE_SECONDS = {
    # Every figure: worker-seconds in a clean-clone `make test` (2026-12-07 06:36, 3 workers on 2 cores, the
    # loop emitters without fused multiply-adds, beside another suite on the same machine: 4997 worker-s in all);
    # the notes say why a file costs what it does (earlier figures in them are from earlier runs). A file that
    # starts late runs in the suite's tail.
    # every guide at smoke size in a process of its own, then the site; 11_doremi (2 evaluations a run, 4 Python
    # files) 44.5 -> 40.2 CPU s alone, 04_scaling (2 steps a run) 40.2 -> 37.1 (estimate: 354 less ~1.5x the 7.4 CPU s)
    "tests/test_docs.py": 343,
    # the demo's 100 steps optimised (about 125 s), kill and resume, 2 processes; the nucleus run is the killed
    # run's reference and the watched GRPO run (with test_watch_trainer.py's grpo test)
    "packages/train/tests/test_grpo_trainer.py": 226,
    # the bitwise batch-invariance matrix at width 256 and its no-FMA subprocess (6 programs at full optimisation):
    # 293 worker-s in the last clean-clone run, about 0.55x since (236 -> 126 CPU s alone)
    "packages/serve/tests/test_deterministic.py": 189,
    "packages/train/tests/test_invariant_trainer.py": 160,  # 248 in the 2026-12-07 clean clone; 10 steps instead of 20: 129 -> 101 s alone; no data 8 2-process run of its own: 135 -> 121 CPU s alone
    "packages/train/tests/test_matrix_trainer.py": 152,  # the workers' cache at 0.05 s: 73.7 -> 69.1 CPU s alone (estimate)
    # Was unlisted, so it came last: a 160 s kill-and-resume test near the end of the run. The doremi command (its
    # fixture, ~40 s) runs once per pytest run since, however many workers share the file; the `--reference`
    # rerun in the worker: 74.6 -> 71.2 CPU s alone (estimate: one fixture fewer than in the suite's 154).
    "packages/train/tests/test_doremi_trainer.py": 97,  # 80 steps instead of 120: 77.6 -> 68.6 CPU s alone
    # Was unlisted: two `train` runs of a 30-layer checkpoint (60-170 s each) started in the run's last minutes.
    # 191 s in the last clean-clone run; the rollout engine's 2 programs instead of 6 take 20-28% off each;
    # optimised programs instead of -O0: 94-103 s -> 69-70 s alone.
    "packages/train/tests/test_grpo_real_shapes.py": 136,
    "packages/train/tests/test_pipeline_trainer.py": 120,  # 10 steps instead of 20: 74.7 -> 66.2 CPU s alone (estimate)
    "tests/test_benchmarks_smoke.py": 106,
    "tests/test_serve_rl_benchmark_smoke.py": 170,
    "packages/train/tests/test_rl_packing.py": 110,
    "packages/serve/tests/test_speculative_server.py": 45,  # ngram and draft speculation through the openai client
    "packages/serve/tests/test_speculative.py": 30,  # packed GRPO rows: bitwise log-probs, a train run  # the serve, TPU-profile, host-step and RL benchmarks at quick size
    "packages/train/tests/test_context_parallel_trainer.py": 85,  # 10 steps instead of 20: 76.8 -> 68.5 CPU s alone (estimate)
    "packages/serve/tests/test_engine.py": 82,  # new (halyard-serve's): six families against the full forward
    "tests/reliability/test_training_kill.py": 81,
    "packages/train/tests/test_invariant_layer_gathers.py": 76,  # new: 22 s alone with a warm compilation cache, about 3x cold
    "packages/serve/tests/test_server_operation.py": 76,  # halyard-serve: with test_server_answers.py, one server subprocess (was test_server.py: 33-43 s alone)
    "tests/test_install_alone.py": 71,
    "packages/models/tests/test_family_gemma.py": 67,
    "packages/train/tests/test_mixture_trainer.py": 64,
    "packages/train/tests/test_tpu_host_start.py": 60,  # train, generate/eval/replay/plan, serve with TPU_* variables set
    "packages/train/tests/test_demo.py": 59,  # 62 s in a clean-clone run; optimised programs: 29-30 s -> 23-24 s alone
    "tests/reliability/test_damaged_checkpoints.py": 43,  # one resume for both damages: 19.9 -> 14.6 CPU s alone
    "packages/train/tests/test_trainer_multiprocess.py": 48,  # 12 steps instead of 24: 25.3 -> 22.6 CPU s alone
    "packages/serve/tests/test_server_load.py": 54,  # new: 15-25 s alone
    "tests/test_invariant_benchmark_smoke.py": 51,  # new: 31 s alone
    "tests/test_pipeline_benchmark_smoke.py": 50,
    "packages/train/tests/test_watch_trainer.py": 50,  # 18 s alone: its GRPO run is test_grpo_trainer.py's nucleus run
    # the others end with the target (few programs): 43.8 -> 26.8 CPU s alone (the test: ~32 -> ~15)
    "packages/serve/tests/test_deterministic_bfloat16.py": 25,
    # were unlisted (new, figures of their authors alone): they started last
    "packages/serve/tests/test_structured_outputs.py": 62,
    "packages/train/tests/test_int8_trainer.py": 45,
    # its deterministic test was 63 s of the clean-clone run; the others end with the target since: 39.5 -> 28.1 CPU s
    # alone (the file: 50.5 -> 42.5)
    "packages/serve/tests/test_int8_weights.py": 70,
    "packages/models/tests/test_pipeline.py": 47,
    "packages/train/tests/test_rl_losses.py": 44,  # new: TRL's GRPOTrainer on the same arrays
    "packages/train/tests/test_lora_trainer.py": 43,
    "packages/train/tests/test_every_host_builds.py": 43,
    "packages/train/tests/test_trainer_fit.py": 42,  # 105 in the 2026-12-07 clean clone less its kill -9 and SIGTERM tests (test_training_kill.py)
    "packages/train/tests/test_checkpoint_benchmark_smoke.py": 42,
    "packages/models/tests/test_lora.py": 38,
    "packages/train/tests/test_matrix_interruptions.py": 38,
    "packages/named/tests/test_reductions.py": 38,
    "packages/train/tests/test_cli_interrupts.py": 37,
    "packages/train/tests/test_builtin_configs.py": 37,
    "tests/test_worker_life.py": 16,  # its pytest runs load xdist alone of the plugins: 28.0 -> 11.9 CPU s alone
    "packages/train/tests/test_plan.py": 35,
    "packages/serve/tests/test_sharded_engine.py": 34,  # new: tensor parallel and replicas
    "packages/train/tests/test_first_contact_errors.py": 34,
    "tests/reliability/test_nonfinite.py": 32,
    "packages/models/tests/test_context_parallel_attention.py": 31,
    "packages/train/tests/test_harness_during_training.py": 31,
    "packages/named/tests/nn/test_stacked.py": 30,
    "packages/train/tests/test_invariant_step.py": 30,
    "packages/train/tests/test_readme_scripts.py": 30,
    "packages/train/tests/test_optimizer_state_placement.py": 29,  # 32 in the 2026-12-07 clean clone; its offload runs in the worker since
    "packages/serve/tests/test_server_answers.py": 29,
    # new: a `halyard serve --deterministic` start, 30 requests alone then together (42 CPU s alone, cold cache)
    "tests/test_determinism_soak_smoke.py": 40,
    "packages/train/tests/test_harness_referee.py": 29,
    "tests/test_serve_start_phases_smoke.py": 28,  # new (2026-12-07 clean clone): fresh `halyard serve` starts, small
    "packages/train/tests/test_dpo_trl_referee.py": 27,
    "packages/models/tests/test_family_phi3.py": 24,
    "packages/train/tests/test_plan_tpu_topology.py": 23,
    "packages/train/tests/test_relocatable_run_dir.py": 22,
    "packages/serve/tests/test_warmup.py": 22,
    "packages/serve/tests/test_program_store.py": 31,  # new: three engines a test, fast and deterministic (alone)
    "tests/test_watch_benchmark_smoke.py": 21,
    "packages/train/tests/test_dpo_trainer.py": 20,
    "tests/test_tpu_benchmark_smoke.py": 20,
    "packages/models/tests/test_paged_decoding.py": 20,
    "packages/train/tests/test_doremi_update.py": 20,
    "packages/models/tests/test_family_qwen3.py": 19,
    "packages/models/tests/test_reports.py": 19,
    "packages/models/tests/test_model_loss.py": 19,
    "packages/models/tests/test_ragged_paged_pallas.py": 18,  # new: the Pallas kernel interpreted: 2 steps, 2 model steps (merged)
    "packages/train/tests/test_train_while_tokenizing.py": 18,
    "packages/train/tests/test_trainer_step.py": 18,
    "packages/train/tests/test_sft_trainer.py": 18,
    "packages/export/tests/test_real_config_parity.py": 18,
    "tests/test_context_parallel_benchmark_smoke.py": 17,
    "packages/models/tests/test_paged_decode_pallas.py": 17,  # new: the token decode kernel in the TPU interpreter
    "packages/export/tests/test_multiprocess_export.py": 17,
    "packages/train/tests/test_spike_replay.py": 16,  # 19 in the 2026-12-07 clean clone; its fixture trains in the worker since: 13.6 -> 9.0 s alone
    "packages/train/tests/test_tokenizer_folder_everywhere.py": 16,
    "packages/train/tests/test_checkpoint_writer_priority.py": 16,
    "tests/reliability/test_multiprocess_death.py": 16,
    "tests/test_serve_transformers_generate.py": 16,  # new: four families against transformers' generate
}


def pytest_configure(config: object) -> None:
    import jax

    # set here too: jax read its settings when conftest imported halyard.shard, before the variable was set
    seconds = float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", seconds)


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


MISSING_FILE_SECONDS = 15
"""A file whose tests took this many seconds or more in a run belongs in FILE_SECONDS (its notes say why)."""
_seconds_by_file: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each test's setup, call and teardown seconds to its file's (in the controller under xdist, which
    receives every worker's reports)."""
    path = report.nodeid.split("::")[0]
    _seconds_by_file[path] = _seconds_by_file.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Name the files of `MISSING_FILE_SECONDS` or more that FILE_SECONDS does not list, as lines to paste
    into it: unlisted, they start last and a long one runs alone in the suite's tail."""
    if hasattr(config, "workerinput"):
        return
    missing = {
        path: seconds
        for path, seconds in _seconds_by_file.items()
        if seconds >= MISSING_FILE_SECONDS and path not in FILE_SECONDS
    }
    if not missing:
        return
    terminalreporter.write_sep(
        "-", f"test files of {MISSING_FILE_SECONDS} s or more missing from conftest.py's FILE_SECONDS"
    )
    for path, seconds in sorted(missing.items(), key=lambda entry: -entry[1]):
        terminalreporter.write_line(f'    "{path}": {seconds:.0f},')


# Every program XLA's CPU backend compiles keeps LLVM's code sections mapped while it is cached, several
# memory maps a program. A test worker that compiles thousands of programs reaches the kernel's limit on a
# process's maps (vm.max_map_count, 65,530 by default): LLVM's next allocation fails ("LLVM compilation
# error: Cannot allocate memory") and the worker dies of a segfault. A CI run saw it in the export parity
# file, with 47,000 maps in another worker half an hour in. The programs are also most of a worker's memory
# (about 1.5 MB each; a worker that lived for the whole suite reached 5-6 GB). So after each test file, a
# worker past half the map limit or `RESIDENT_LIMIT` drops JAX's in-memory caches (the persistent compilation
# cache on disk keeps the programs) and hands the freed heap back to the system (without malloc_trim, 400
# programs dropped left the process's 785 MB resident; with it, 275 MB): a worker can then run the whole
# suite (the Makefile's --worker-tests) in bounded memory.
def _map_limit() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return 0


MAP_LIMIT = _map_limit()
RESIDENT_LIMIT = 4 * 2**30
"""Resident bytes past which a test worker drops its compiled programs after a test file."""


def mapped_regions() -> int:
    """The memory maps this process holds (0 where /proc cannot tell)."""
    try:
        with open(f"/proc/{os.getpid()}/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return 0


def resident_bytes() -> int:
    """This process's resident memory (0 where /proc cannot tell)."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def release_compiled_programs(map_threshold: int, resident_threshold: int = 0) -> bool:
    """Drop JAX's compiled programs when this process holds more than ``map_threshold`` memory maps or
    ``resident_threshold`` resident bytes (0: no such limit), and return the freed heap to the system;
    whether it did."""
    if "jax" not in sys.modules:
        return False
    too_many_maps = map_threshold > 0 and mapped_regions() > map_threshold
    too_large = resident_threshold > 0 and resident_bytes() > resident_threshold
    if not (too_many_maps or too_large):
        return False
    import ctypes
    import ctypes.util
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc and hasattr(ctypes.CDLL(libc), "malloc_trim"):
        ctypes.CDLL(libc).malloc_trim(0)
    return True


def pytest_runtest_teardown(item: object, nextitem: object) -> None:
    if nextitem is None or getattr(nextitem, "path", None) != getattr(item, "path", None):
        release_compiled_programs(MAP_LIMIT // 2, RESIDENT_LIMIT)
