"""GRPO on a TPU: ``train --config grpo-demo`` with rollouts from the engine, and a Qwen2.5-0.5B-shaped GRPO
step's time split into rollouts, hand-over and training, each beside the same on the CPU.

Parts, each in a process of its own (only one process can hold a TPU chip; this one never starts JAX), each
cut off after its ``--limit`` share:

- ``demo``: ``train --config grpo-demo`` for ``--demo-steps`` steps (the ``train`` command as users run it;
  rollouts from the engine in deterministic mode, the trainer's log-probs with the same arithmetic): from its
  metrics.jsonl, per step the logged ``sampling/sampling_logp_difference/max`` and ``/mean`` (the sampler's
  log-probs against the trainer's: 0 where the training arithmetic holds), the rollout seconds, and the loss;
  ``demo_packed`` the same with room for 124-token completions (`PACKED_DEMO`: packed rows, page-aligned);
- ``split``: benchmarks/rl/rl.py's split (rollouts, hand-over, training; the steps after the first) with
  ``--shape qwen-0.5b`` (Qwen2.5-0.5B's shape: 24 layers, hidden 896, 14 heads, 2 KV heads, MLP 4864,
  vocabulary 151,936, tied, bf16 weights with float32 Adam moments) and ``--shape quick`` (a tiny model),
  once per ``--variants`` entry: ``padded`` (one row per completion, as before ``rl.pack``), ``packed``
  (``rl.pack``: with ``rl.deterministic`` sequences start at page boundaries), ``packed-fast`` (packed at
  any token, ``rl.deterministic false``), ``padded-fast``; a table of each one's split, training tokens/s
  and MFU, row fill and log-prob difference is printed at the end;
- with ``--cpu-too``, ``demo`` and the quick ``split`` again with ``JAX_PLATFORMS=cpu`` (the same machine's CPU).

Usage::

    python benchmarks/rl/rl_tpu.py --work /tmp/rl --cpu-too              # on the TPU machine
    python benchmarks/rl/rl_tpu.py --demo-steps 0 --shapes quick --variants padded packed-fast   # a CPU smoke

Results: printed, and JSON (``--output``, default benchmarks/results/rl_tpu.json); logs in the work folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results" / "rl_tpu.json"


def run(command: list[str], log: Path, limit: float, cpu: bool) -> dict[str, Any]:
    """Run ``command`` (on the CPU with ``cpu``), its output to ``log``, killed after ``limit`` seconds."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(HERE)]))
    )
    if cpu:
        env["JAX_PLATFORMS"] = "cpu"
    started = time.perf_counter()
    with log.open("w") as output:
        try:
            code = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, env=env, timeout=limit, cwd=HERE
            ).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    return {"exit_code": code, "seconds": time.perf_counter() - started, "log": str(log)}  # fmt: skip


PACKED_DEMO = ["--model.max_position", "256", "--rl.max_new_tokens", "124"]
"""grpo-demo with room for completions longer than the attention block (most end sooner): packed rows."""


def demo(work: Path, steps: int, limit: float, cpu: bool, packed: bool = False) -> dict[str, Any]:
    """``train --config grpo-demo`` for ``steps`` steps (``packed``: with `PACKED_DEMO`); what its
    metrics.jsonl logged per step."""
    name = ("demo_packed" if packed else "demo") + ("_cpu" if cpu else "")
    run_dir = work / name
    command = [
        sys.executable, "-m", "halyard.train.cli", "train", "--config", "grpo-demo", "--trainer.run_dir", str(run_dir),
        "--trainer.steps", str(steps), "--trainer.log_every", "1", "--trainer.eval_every", "0", "--trainer.progress",
        "false", "--checkpoint.every_steps", str(steps), *(PACKED_DEMO if packed else []),
    ]  # fmt: skip
    result = run(command, work / f"{name}.log", limit, cpu)
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    keep = (
        "loss", "sampling/sampling_logp_difference/max", "sampling/sampling_logp_difference/mean",
        "rollout/seconds", "rollout/sampling_seconds", "rollout/handover_seconds", "reward/mean", "train/rows",
        "train/row_fill",
    )  # fmt: skip
    steps_logged = [{"step": r["step"], **{k: r[k] for k in keep if k in r}} for r in records if "loss" in r]
    differences = [
        r["sampling/sampling_logp_difference/max"]
        for r in steps_logged
        if "sampling/sampling_logp_difference/max" in r
    ]
    summary_file = run_dir / "metrics.summary.json"  # the jsonl tracker's run summary (goodput/...)
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    return dict(
        result, steps=steps_logged, logp_difference_max=max(differences, default=None),
        goodput={k: v for k, v in summary.items() if k.startswith("goodput/")},
    )  # fmt: skip


VARIANTS = {
    "padded": ["--rows", "padded"],
    "packed": ["--rows", "packed"],
    "packed-fast": ["--rows", "packed", "--fast"],
    "padded-fast": ["--rows", "padded", "--fast"],
}
"""``--variants``: rl.py's options for each."""
SHOWN = (
    ("step_seconds", "step s", "{:.3f}"), ("share_rollouts", "sample", "{:.0%}"), ("share_training", "train", "{:.0%}"),
    ("rollout_tokens_per_second", "rollout tok/s", "{:,.0f}"), ("training_tokens_per_second", "train tok/s", "{:,.0f}"),
    ("training_mfu", "train MFU", "{:.1%}"), ("training_mfu_all_tokens", "MFU all tok", "{:.1%}"),
    ("training_row_fill", "row fill", "{:.0%}"), ("logp_difference_max", "logp diff", "{:.2g}"),
)  # fmt: skip


def table(results: dict[str, Any]) -> str:
    """The splits side by side: one line per variant."""
    lines = [" | ".join(["split", *(title for _, title, _ in SHOWN)])]
    for name, result in results.items():
        if name.startswith("split_") and "step_seconds" in result:
            cells = [fmt.format(result[k]) if result.get(k) is not None else "-" for k, _, fmt in SHOWN]
            lines.append(" | ".join([name, *cells]))
    return "\n".join(lines)


def split(work: Path, shape: str, variant: str, limit: float, cpu: bool) -> dict[str, Any]:
    """benchmarks/rl/rl.py's step split at ``shape`` (``variant``: `VARIANTS`) in a process of its own."""
    name = f"split_{shape}_{variant}" + ("_cpu" if cpu else "")
    output = work / f"{name}.json"
    result = run(
        [sys.executable, str(HERE / "rl.py"), "--shape", shape, *VARIANTS[variant], "--output", str(output)],
        work / f"{name}.log",
        limit,
        cpu,
    )
    return dict(result, **(json.loads(output.read_text()) if output.is_file() else {}))  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="runs and logs (default: a temporary folder)")
    parser.add_argument("--demo-steps", type=int, default=20, help="grpo-demo's steps (0: no demo)")
    parser.add_argument(
        "--shapes", nargs="*", default=["quick", "qwen-0.5b"], help="rl.py --shape values to split"
    )
    parser.add_argument(
        "--variants", nargs="*", choices=sorted(VARIANTS), default=["padded", "packed-fast", "padded-fast"],
        help="the row layouts and modes each shape is split with",
    )  # fmt: skip
    parser.add_argument("--cpu-too", action="store_true", help="also the demo and the quick split on the CPU")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds for all parts together")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)  # fmt: skip
    work = args.work or Path(tempfile.mkdtemp(prefix="rl-tpu-"))
    work.mkdir(parents=True, exist_ok=True)
    parts: list[tuple[str, Any]] = []
    if args.demo_steps:  # 0: no demo
        parts += [("demo", lambda left: demo(work, args.demo_steps, left, cpu=False))]
        parts += [("demo_packed", lambda left: demo(work, args.demo_steps, left, cpu=False, packed=True))]
    parts += [
        (f"split_{shape}_{variant}", lambda left, s=shape, v=variant: split(work, s, v, left, cpu=False))
        for shape in args.shapes
        for variant in args.variants
    ]
    if args.cpu_too:
        parts += [("split_quick_packed_cpu", lambda left: split(work, "quick", "packed", left, cpu=True))]
        if args.demo_steps:
            parts += [("demo_cpu", lambda left: demo(work, args.demo_steps, left, cpu=True))]
    started = time.perf_counter()
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    for index, (name, part) in enumerate(parts):
        left = args.limit - (time.perf_counter() - started)
        if left < 20:
            results[name] = {"skipped": "time limit"}
            continue
        # The first part (grpo-demo on the chip) may take most of the time; the rest share what is left.
        share = left if index == len(parts) - 1 else max(20.0, left * (0.7 if index == 0 else 0.5))
        results[name] = part(min(left, share))
        print(name, json.dumps({k: v for k, v in results[name].items() if k != "steps"}), flush=True)
        args.output.write_text(json.dumps(results, indent=1))
    print(table(results), flush=True)
    return results


if __name__ == "__main__":
    main()
