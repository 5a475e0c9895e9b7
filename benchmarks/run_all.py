"""Run every benchmark in benchmarks/ and print their headline figures as one table.

Each benchmark runs in its own process (so one's XLA flags, device count or memory cannot disturb the
next) with its own flags, writes its JSON result, and this script reads the JSON back and prints the
figures the performance issue sets targets for, next to their goals.

Usage::

    python benchmarks/run_all.py                      # full runs; results in benchmarks/results/
    python benchmarks/run_all.py --quick              # smoke test: tiny shapes, results in a temporary dir
    python benchmarks/run_all.py --only train_step scaling
    python benchmarks/run_all.py --list               # the benchmarks and their commands

Scripts that are not (yet) in benchmarks/ are reported as missing and skipped; a failing benchmark is
reported with the tail of its output and makes the exit code 1, the others still run. The table is also
written as JSON (``summary.json`` in the results directory).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


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
    return lambda value: value <= limit


def at_least(limit: float) -> Callable[[float], bool]:
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
        "named_overhead.py",
        (Figure("named / plain JAX step time (block fwd+bwd)", "ratio", "<= 1.03", at_most(1.03)),),
    ),
    Benchmark("train_step", "train_step.py", TRAIN_STEP_FIGURES),
    *(
        Benchmark(
            "train_step_" + model.replace("-", "_"),
            "train_step.py",
            TRAIN_STEP_FIGURES,
            full_args=("--model", model),
            quick_args=("--quick", "--model", model),
        )
        for model in ("llama", "llama-49k")
    ),
    Benchmark(
        "stacked_compile",
        "stacked_compile.py",
        (
            Figure("compile 24 / 2 layers (scan)", "ratio", "<= 1.3", at_most(1.3)),
            Figure("compile 24 / 2 layers (scan)", "compile_ratio", "<= 1.3", at_most(1.3)),
        ),
    ),
    Benchmark(
        "time_to_first_step",
        "time_to_first_step.py",
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
        "data_cache.py",
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
        "checkpoint_save.py",
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
        "checkpoint_checksum.py",
        (Figure("xxh3 checksum: (read + hash) / read", "checksums.xxh3_64.time_over_read"),),
    ),
    Benchmark(
        "attention_memory",
        "attention_memory.py",
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
        "context_parallel.py",
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
        "pipeline.py",
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
        "mup_wider_is_better.py",
        (
            Figure("muP: wider is better", "wider_is_better"),
            Figure("muP: wider is better", r"stdout:wider is better: (\w+)", "yes"),
        ),
    ),
    Benchmark(
        "scaling",
        "scaling.py",
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
        "invariant_step.py",
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
        "serve.py",
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
        "rl.py",
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
        "watch.py",
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
        "hf_import.py",
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
)


def lookup(result: dict[str, Any], dotted: str) -> Any:
    node: Any = result
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def format_value(figure: Figure, value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        scaled = value * figure.scale
        return f"{scaled:.3f}{figure.unit}" if abs(scaled) < 100 else f"{scaled:.1f}{figure.unit}"
    return str(value)


def run_one(benchmark: Benchmark, quick: bool, results_dir: Path, timeout: float) -> dict[str, Any]:
    """Run one script; returns ``{"status", "seconds", "output" (tail), "result" (its JSON or None)}``."""
    script = HERE / benchmark.script
    if not script.exists():
        return {"status": "missing", "seconds": 0.0, "output": f"{script} not found", "result": None}
    output_path = results_dir / f"{benchmark.name}.json"
    command = [sys.executable, str(script), *(benchmark.quick_args if quick else benchmark.full_args)]
    writes_json = '"--output"' in script.read_text()
    if writes_json:
        command += ["--output", str(output_path)]
    environment = {**os.environ, **benchmark.env}
    start = time.perf_counter()
    try:
        completed = subprocess.run(
            command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as error:
        tail = ((error.stdout or b"") if isinstance(error.stdout, bytes) else (error.stdout or "").encode())[
            -2000:
        ]
        return {
            "status": "timeout",
            "seconds": timeout,
            "output": tail.decode(errors="replace"),
            "result": None,
        }
    seconds = time.perf_counter() - start
    text = (completed.stdout or "") + (completed.stderr or "")
    if completed.returncode != 0 or not output_path.exists():
        return {
            "status": f"failed (exit {completed.returncode})",
            "seconds": seconds,
            "output": text[-3000:],
            "result": None,
        }
    return {
        "status": "ok",
        "seconds": seconds,
        "output": text[-3000:],
        "result": json.loads(output_path.read_text()),
    }


def table_rows(benchmark: Benchmark, run: dict[str, Any]) -> list[dict[str, str]]:
    """One row per figure found in the result (figures absent from the JSON are left out)."""
    rows = []
    result = run["result"] or {}
    for figure in benchmark.figures:
        if figure.path.startswith("stdout:"):
            match = re.search(figure.path.removeprefix("stdout:"), run["output"])
            value = match.group(1) if match else None
        else:
            value = lookup(result, figure.path)
        if value is None:
            continue
        verdict = ""
        if figure.check is not None and isinstance(value, int | float) and not isinstance(value, bool):
            verdict = "met" if figure.check(value) else "NOT met"
        rows.append(
            {"benchmark": benchmark.name, "figure": figure.label, "value": format_value(figure, value),
             "goal": figure.goal, "verdict": verdict}
        )  # fmt: skip
    if not rows:
        rows.append(
            {"benchmark": benchmark.name, "figure": run["status"], "value": "", "goal": "", "verdict": ""}
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="every benchmark in its --quick mode (smoke test)"
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="default: benchmarks/results (full), a temp dir (quick)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per benchmark (default 3600; quick 600)"
    )
    parser.add_argument(
        "--list", action="store_true", help="list the benchmarks and their commands, run nothing"
    )
    parser.add_argument(
        "--collect",
        action="store_true",
        help="run nothing: print the table from the JSON already in the results dir",
    )
    args = parser.parse_args(argv)

    names = [b.name for b in BENCHMARKS]
    unknown = [n for n in args.only or [] if n not in names]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {names}")
    selected = [b for b in BENCHMARKS if not args.only or b.name in args.only]
    if args.list:
        for b in selected:
            flags = " ".join(b.full_args)
            present = "" if (HERE / b.script).exists() else "   (missing)"
            print(f"{b.name:>20}: python benchmarks/{b.script} {flags}".rstrip() + present)
        return 0
    results_dir = args.results_dir or (
        Path(tempfile.mkdtemp(prefix="halyard-bench-")) if args.quick else HERE / "results"
    )
    results_dir.mkdir(parents=True, exist_ok=True)
    timeout = args.timeout or (600.0 if args.quick else 3600.0)

    rows: list[dict[str, str]] = []
    runs: dict[str, dict[str, Any]] = {}
    failed = False
    for benchmark in selected:
        print(f"--- {benchmark.name} ({'quick' if args.quick else 'full'}) ...", flush=True)
        if args.collect:
            path = results_dir / f"{benchmark.name}.json"
            found = path.exists()
            result = json.loads(path.read_text()) if found else None
            run = {"status": "ok" if found else "no result", "seconds": 0.0, "output": "", "result": result}
        else:
            run = run_one(benchmark, args.quick, results_dir, timeout)
        runs[benchmark.name] = run
        print(f"    {run['status']} in {run['seconds']:.1f} s", flush=True)
        if run["status"] not in ("ok", "missing", "no result"):
            failed = True
            print(run["output"], flush=True)
        rows.extend(table_rows(benchmark, run))

    widths = {
        key: max(len(key), *(len(r[key]) for r in rows))
        for key in ("benchmark", "figure", "value", "goal", "verdict")
    }
    header = "  ".join(key.ljust(widths[key]) for key in widths)
    print("\n" + header + "\n" + "-" * len(header))
    for row in rows:
        print("  ".join(row[key].ljust(widths[key]) for key in widths))
    summary = {
        "quick": args.quick,
        "rows": rows,
        "runs": {name: {"status": r["status"], "seconds": r["seconds"]} for name, r in runs.items()},
    }
    (results_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nresults in {results_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
