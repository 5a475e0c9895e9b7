"""The benchmark suite as data: each script (its path under benchmarks/, in its area's folder), its flags for
full and quick runs, and the figures `run_all.py` reads back from its JSON result, with their goals.

A new benchmark is a row of `BENCHMARKS`; the runner (run_all.py) needs no change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Figure:
    """One reported number: where it is in the JSON (dotted path; or ``stdout:REGEX`` whose first group is
    read from the script's printed output) and its goal (text, for the table)."""

    label: str
    path: str
    goal: str = "report"
    check: Callable[[float], bool] | None = None
    scale: float = 1.0
    unit: str = ""


@dataclass(frozen=True)
class Benchmark:
    """A script, its flags for full and quick runs, and the figures to read back from its JSON."""

    name: str
    script: str
    figures: tuple[Figure, ...]
    full_args: tuple[str, ...] = ()
    quick_args: tuple[str, ...] = ("--quick",)
    env: dict[str, str] = field(default_factory=dict)


def at_most(limit: float) -> Callable[[float], bool]:
    """The check of a goal ``<= limit``."""
    return lambda value: value <= limit


def at_least(limit: float) -> Callable[[float], bool]:
    """The check of a goal ``>= limit``."""
    return lambda value: value >= limit


TRAIN_STEP_FIGURES = (
    Figure(
        "Halyard / PyTorch tokens/s",
        "ratios.halyard_over_pytorch_tokens_per_second",
        ">= 1.0",
        at_least(1.0),
    ),
    Figure(
        "Halyard / plain JAX step time",
        "ratios.halyard_over_plain_jax_step_time",
        "<= 1.03",
        at_most(1.03),
    ),
    Figure("plain JAX / PyTorch tokens/s", "ratios.plain_jax_over_pytorch_tokens_per_second"),
    Figure("Halyard MFU (vs measured f32 matmul)", "ratios.mfu", ">= 60%", at_least(0.60), 100, "%"),
    Figure("Halyard tokens/s", "implementations.halyard.tokens_per_second"),
    Figure("Halyard first step (compile)", "implementations.halyard.first_step_seconds", unit=" s"),
)
"""What `train_step.py` reports, for each ``--model``."""

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "named_overhead",
        "training/named_overhead.py",
        (Figure("named / plain JAX step time (block fwd+bwd)", "ratio", "<= 1.03", at_most(1.03)),),
    ),
    Benchmark("train_step", "training/train_step.py", TRAIN_STEP_FIGURES),
    *(
        Benchmark(
            "train_step_" + model.replace("-", "_"),
            "training/train_step.py",
            TRAIN_STEP_FIGURES,
            full_args=("--model", model),
            quick_args=("--quick", "--model", model),
        )
        for model in ("llama", "llama-49k")
    ),
    Benchmark(
        "stacked_compile",
        "training/stacked_compile.py",
        (
            Figure("compile 24 / 2 layers (scan)", "ratio", "<= 1.3", at_most(1.3)),
            Figure("compile 24 / 2 layers (scan)", "compile_ratio", "<= 1.3", at_most(1.3)),
        ),
    ),
    Benchmark(
        "time_to_first_step",
        "data/time_to_first_step.py",
        (
            Figure(
                "trainer's time to first step / offline build",
                "time_to_first_step_over_offline_build",
                "<= 0.25",
                at_most(0.25),
            ),
            Figure(
                "the same, compilation cache warm",
                "warm_time_to_first_step_over_offline_build",
                "<= 0.25",
                at_most(0.25),
            ),
            Figure(
                "loader while building / step consumption",
                "loader_over_step_consumption",
                "> 1x",
                lambda v: v > 1,
                unit="x",
            ),
        ),
    ),
    Benchmark(
        "data_cache",
        "data/data_cache.py",
        (
            Figure("cache build / raw encode_batch", "build_over_raw_encode_ratio", ">= 0.9", at_least(0.9)),
            Figure("first batch", "seconds_to_first_batch", "< 5 s", lambda v: v < 5, unit=" s"),
            Figure(
                "loader / step consumption",
                "loader_over_train_step_consumption",
                ">= 50x",
                at_least(50),
                unit="x",
            ),
        ),
    ),
    Benchmark(
        "checkpoint_save",
        "checkpoints/checkpoint_save.py",
        (
            Figure(
                "checkpoint / raw write bandwidth",
                "checkpoint_to_raw_bandwidth_ratio",
                ">= 0.5",
                at_least(0.5),
            ),
            Figure("async stall / sync save", "async_stall_fraction_of_sync_save", "<= 0.10", at_most(0.10)),
            Figure(
                "steps during the write / outside (nice 19)",
                "step_slowdown_during_write",
                "<= 1.10",
                at_most(1.10),
            ),
        ),
    ),
    Benchmark(
        "checkpoint_checksum",
        "checkpoints/checkpoint_checksum.py",
        (Figure("xxh3 checksum: (read + hash) / read", "checksums.xxh3_64.time_over_read"),),
    ),
    Benchmark(
        "attention_memory",
        "training/attention_memory.py",
        (
            Figure(
                "blocked / reference attention peak memory",
                "blocked_to_reference_peak_ratio",
                "<= 0.25",
                at_most(0.25),
            ),
        ),
    ),
    Benchmark(
        "context_parallel",
        "parallelism/context_parallel.py",
        (
            Figure(
                "context parallel: activations x N / one device's (worst)",
                "worst_activation_excess",
                "close to 1",
            ),
            Figure(
                "context parallel: collective bytes measured / theory (worst)",
                "worst_measured_over_theory",
                "~1.0",
                lambda v: abs(v - 1) < 0.02,
            ),
            Figure(
                "context parallel: load-balanced causal work max / min (worst)",
                "worst_balanced_max_over_min",
                "<= 1.05",
                at_most(1.05),
            ),
        ),
    ),
    Benchmark(
        "pipeline",
        "parallelism/pipeline.py",
        (
            Figure(
                "pipeline: compiled bubble - (S-1)/(RM+S-1) (worst)",
                "worst_bubble_excess",
                "0",
                lambda v: v == 0,
            ),
            Figure(
                "pipeline: microbatch activations passed per iteration (most)",
                "most_activations_per_iteration",
            ),
        ),
    ),
    Benchmark(
        "mup_wider_is_better",
        "training/mup_wider_is_better.py",
        (
            Figure("muP: wider is better", "wider_is_better"),
            Figure("muP: wider is better", r"stdout:wider is better: (\w+)", "yes"),
        ),
    ),
    Benchmark(
        "scaling",
        "parallelism/scaling.py",
        (
            Figure("FSDP / DP step time (8 CPU devices)", "ratios.fsdp_over_dp_step_time"),
            Figure(
                "FSDP state bytes per device / unsharded",
                "ratios.fsdp_state_bytes_per_device_over_unsharded",
                "~0.125",
                lambda v: abs(v - 0.125) <= 0.02,
            ),
        ),
    ),
    Benchmark(
        "invariant_step",
        "parallelism/invariant_step.py",
        (
            Figure(
                "invariant / default step time (worst of 1 device, data 8, fsdp 8)",
                "worst_step_time_ratio",
                "<= 1.10",
                at_most(1.10),
            ),
            Figure(
                "invariant step: losses bitwise equal on 1 device, data 8, fsdp 8",
                "invariant_losses_bitwise_equal",
            ),
            Figure("invariant / default compiled temp bytes (fsdp 8)", "ratios.fsdp_8_temp_bytes"),
        ),
    ),
    Benchmark(
        "serve",
        "serving/serve.py",
        (
            Figure(
                "engine / transformers generate throughput",
                "ratios.engine_over_transformers_throughput",
                ">= 2",
                at_least(2.0),
            ),
            Figure("engine / old generate throughput", "ratios.engine_over_old_generate_throughput"),
            Figure(
                "deterministic / fast engine seconds",
                "ratios.deterministic_over_fast_seconds",
                "<= 1.15",
                at_most(1.15),
            ),
            Figure(
                "deterministic with training arithmetic / fast engine seconds",
                "ratios.training_arithmetic_over_fast_seconds",
            ),
            Figure("engine tokens/s", "arms.engine.tokens_per_second"),
            Figure("engine time to first token, median", "arms.engine.ttft_median", unit=" s"),
        ),
        quick_args=("--quick", "--skip", "old_generate"),
    ),
    Benchmark(
        "rl",
        "rl/rl.py",
        (
            Figure("GRPO step: share in rollouts", "share_rollouts", unit=""),
            Figure("GRPO step: share in training", "share_training", unit=""),
            Figure("GRPO hand-over seconds (in memory)", "handover_seconds", unit=" s"),
            Figure("GRPO rollout tokens/s", "rollout_tokens_per_second"),
            Figure("GRPO training tokens/s", "training_tokens_per_second"),
        ),
    ),
    Benchmark(
        "watch",
        "training/watch.py",
        (
            Figure(
                "trainer.watch every 100 steps / off: step time",
                "ratios.every_100_over_off",
                "<= 1.02",
                at_most(1.02),
            ),
            Figure("trainer.watch every step / off: step time", "ratios.every_step_over_off"),
            Figure("per-example losses (spike test) / none: step time", "ratios.off_over_no_example_losses"),
        ),
    ),
    Benchmark(
        "hf_import",
        "checkpoints/hf_import.py",
        (
            Figure(
                "HF import (sharded) transient memory / largest tensor",
                "ratios.sharded_import_transient_over_largest_tensor",
                "< 1.5",
                lambda v: v < 1.5,
            ),
            Figure("HF import (sharded, 8 devices) seconds", "steps.import_sharded.seconds", unit=" s"),
            Figure("HF export seconds", "steps.export.seconds", unit=" s"),
            Figure(
                "HF export peak extra memory / largest tensor", "ratios.export_peak_extra_over_largest_tensor"
            ),
        ),
    ),
    Benchmark(
        "doremi_step",
        "training/doremi_step.py",
        (Figure("DoReMi proxy step / plain step (reference forward included)", "proxy_over_plain"),),
    ),
)
