"""AdamW, Lion, Sophia-H and Muon on the same small Llama and the same data, each with a short learning-rate
sweep: how many steps each needs to reach AdamW's final validation loss.

Every run goes through the `Trainer` (the `train` command's code path) on the built-in `python-stdlib`
corpus with one shared tokenizer and token cache, the same batches in the same order (the data seed is
fixed), the same cosine schedule and weight decay; only `optimizer.type` and `optimizer.learning_rate`
change. The validation loss is measured every `--eval-every` steps on the same held-out windows. For
each optimizer the learning rate with the lowest final validation loss is kept; the target is AdamW's
best final validation loss; "steps to target" is the first evaluation at or below it.

Usage::

    python benchmarks/training/optimizers.py --quick     # smoke test: AdamW and Lion, one learning rate, 6 steps
    python benchmarks/training/optimizers.py             # the sweep: 12 runs (21 minutes on a loaded 2-vCPU VM)

Prints a table (markdown) with the date and writes every curve to `--output` (JSON).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

HERE = Path(__file__).resolve().parent

SWEEP: dict[str, tuple[float, ...]] = {
    "adamw": (1e-3, 3e-3, 1e-2),
    "lion": (3e-4, 1e-3, 3e-3),
    "sophia_h": (1e-3, 3e-3, 1e-2),
    "muon": (3e-3, 1e-2, 3e-2),
}
"""Learning rates tried per optimizer (Lion's a 3x smaller range, as its update is a sign)."""
QUICK_LEARNING_RATES = {"adamw": 3e-3, "lion": 1e-3}
"""--quick: two optimizers, one learning rate each (the matrix test trains all four through the Trainer)."""

MODEL = {
    "type": "llama",
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "max_position": 128,
    "tie_embeddings": True,
}


def run_values(
    args: argparse.Namespace, optimizer: str, learning_rate: float, run_dir: Path
) -> dict[str, Any]:
    """The run config (as YAML would hold it) of one optimizer at one learning rate."""
    return {
        "model": MODEL,
        "data": {
            "builtin_corpus": "python-stdlib",
            "max_documents": args.documents,
            "tokenizer_vocab_size": MODEL["vocab_size"],
            "seq_len": args.seq_len,
            "validation_fraction": 0.05,
            "cache_dir": str(args.work / "cache"),
            "num_workers": 0,
        },
        "optimizer": {
            "type": optimizer,
            "learning_rate": learning_rate,
            "weight_decay": 0.1,
            "max_grad_norm": 1.0,
            "schedule": {"type": "cosine", "warmup": 0.1},
        },
        "trainer": {
            "run_dir": str(run_dir),
            "steps": args.steps,
            "batch_size": args.batch_size,
            "log_every": args.eval_every,
            "eval_every": args.eval_every,
            "eval_batches": args.eval_batches,
            "progress": False,
        },
        "checkpoint": {"every_steps": None, "every_seconds": None, "keep_last": 1},
        "trackers": [{"type": "jsonl"}],
    }


def train_once(args: argparse.Namespace, optimizer: str, learning_rate: float) -> dict[str, Any]:
    """Train one run through the Trainer; return its validation curve and timing."""
    import yaml

    from halyard.train.config.parse import parse_config
    from halyard.train.run_config import TrainConfig
    from halyard.train.trainer.trainer import Trainer

    run_dir = args.work / f"{optimizer}-lr{learning_rate:g}"
    config_path = args.work / f"{run_dir.name}.yaml"
    config_path.write_text(yaml.safe_dump(run_values(args, optimizer, learning_rate, run_dir)))
    config = parse_config(TrainConfig, ["--config", str(config_path), "--trainer.init", "scratch"])
    started = time.perf_counter()
    summary = Trainer(config).fit().summary
    seconds = time.perf_counter() - started
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = [(line["step"], line["eval_loss"]) for line in lines if "eval_loss" in line]
    return {
        "optimizer": optimizer,
        "learning_rate": learning_rate,
        "eval_curve": curve,
        "final_eval_loss": curve[-1][1],
        "seconds": seconds,
        "first_step_seconds": summary["goodput/first_step_seconds"],
        "seconds_per_step": summary["goodput/step_seconds"] / max(summary["goodput/num_steps"] - 1, 1),
    }


def steps_to_reach(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first evaluated step whose validation loss is at or below ``target`` (None: never)."""
    return next((step for step, loss in curve if loss <= target), None)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Best learning rate per optimizer, the target (AdamW's best final loss) and steps to reach it."""
    best: dict[str, dict[str, Any]] = {}
    for run in runs:
        kept = best.get(run["optimizer"])
        if kept is None or run["final_eval_loss"] < kept["final_eval_loss"]:
            best[run["optimizer"]] = run
    target = best["adamw"]["final_eval_loss"]
    adamw_steps = steps_to_reach(best["adamw"]["eval_curve"], target)
    rows = {}
    for name, run in best.items():
        steps = steps_to_reach(run["eval_curve"], target)
        rows[name] = {
            "learning_rate": run["learning_rate"],
            "final_eval_loss": run["final_eval_loss"],
            "steps_to_adamw_final_loss": steps,
            "adamw_steps_over_steps": (adamw_steps / steps) if steps and adamw_steps else None,
            "seconds": run["seconds"],
            "first_step_seconds": run["first_step_seconds"],
            "seconds_per_step": run["seconds_per_step"],
        }
    return {"target_eval_loss": target, "best": rows}


def table(summary: dict[str, Any], args: argparse.Namespace, date: str) -> str:
    """The markdown table for benchmarks/README.md."""
    lines = [
        f"Measured {date}: Llama {MODEL['hidden_size']} wide, {MODEL['num_layers']} layers, seq {args.seq_len}, "
        f"batch {args.batch_size}, {args.steps} steps, cosine schedule (10% warmup), weight decay 0.1, clip 1.0, "
        f"validation every {args.eval_every} steps; target = AdamW's final validation loss "
        f"{summary['target_eval_loss']:.4f}.",
        "",
        "| optimizer | best learning rate (of the sweep) | final validation loss | steps to AdamW's final loss "
        "| AdamW steps / steps | seconds per step | first step (compile) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in summary["best"].items():
        steps = row["steps_to_adamw_final_loss"]
        ratio = row["adamw_steps_over_steps"]
        lines.append(
            f"| {name} | {row['learning_rate']:g} (of {', '.join(f'{lr:g}' for lr in args.sweep[name])}) "
            f"| {row['final_eval_loss']:.4f} | {steps if steps is not None else f'not reached in {args.steps}'} "
            f"| {f'{ratio:.2f}x' if ratio else '-'} | {row['seconds_per_step']:.3f} "
            f"| {row['first_step_seconds']:.0f} s |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: AdamW and Lion, 6 steps")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--documents", type=int, default=300, help="standard-library files used")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--work", type=Path, default=None, help="folder for runs (default: a temporary one)")
    parser.add_argument("--output", type=Path, default=HERE.parent / "results" / "optimizers.json")
    args = parser.parse_args(argv)
    args.sweep = {name: (rate,) for name, rate in QUICK_LEARNING_RATES.items()} if args.quick else SWEEP
    if args.quick:
        args.steps, args.batch_size, args.seq_len, args.documents = 6, 8, 32, 40
        args.eval_every, args.eval_batches = 3, 1
    args.work = args.work or Path(tempfile.mkdtemp(prefix="halyard-optimizers-"))
    args.work.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    runs = []
    for optimizer, rates in args.sweep.items():
        for rate in rates:
            run = train_once(args, optimizer, rate)
            print(
                f"{optimizer} lr={rate:g}: final validation loss {run['final_eval_loss']:.4f} "
                f"({run['seconds']:.0f} s)",
                flush=True,
            )
            runs.append(run)
    summary = summarise(runs)
    print("\n" + table(summary, args, date), flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "documents": args.documents,
        "eval_every": args.eval_every,
        "model": MODEL,
        "sweep": args.sweep,
    }
    record = {
        "date": date,
        "quick": args.quick,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, {sys.platform}",
        "settings": settings,
        **summary,
        "runs": runs,
    }
    args.output.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
