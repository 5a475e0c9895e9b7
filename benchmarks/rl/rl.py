"""Where a GRPO step's time goes: rollouts (sampling with the engine), the weight hand-over, and training.

The ``llama`` benchmark shape (6 layers, hidden 512, MLP 1536, GQA 8/4, vocab 8192) trains with
``trainer.objective: grpo`` on the built-in ``max-digit`` prompts through the Trainer, 8 prompts x 8
completions of up to 64 tokens a step (a random model seldom samples end-of-text: most completions run to
64 tokens). Reported, over the steps after the first (which compiles):

- the share of a step's wall time spent sampling rollouts, handing the weights over, and training;
- tokens/s of the rollouts (generated tokens) and of training (completion tokens trained on);
- the hand-over itself: the engine takes the trainer's arrays as they are (`Engine.update_weights`: no copy),
  and, for an engine laid out otherwise, a resharding of the same weights from FSDP over 8 devices to
  replicated on each (``jax.device_put``), timed on 8 simulated CPU devices.

With ``--curve`` it also runs the whole ``grpo-demo`` (300 steps on one CPU device) and records its learning
curve: the held-out greedy reward every 25 steps and the wall time to reach 0.9 (the goal: from at most 0.3
to at least 0.9 within 10 minutes on 2 CPU cores).

Usage::

    python benchmarks/rl/rl.py            # the llama shape, 6 steps
    python benchmarks/rl/rl.py --curve    # and the grpo-demo's learning curve
    python benchmarks/rl/rl.py --quick    # a tiny model, 3 steps (a smoke test)
    python benchmarks/rl/rl.py --shape qwen-0.5b   # Qwen2.5-0.5B's shape in bf16, 4 steps (a TPU: rl_tpu.py)
    python benchmarks/rl/rl.py --quick --rows padded   # one padded row per completion (before rl.pack)

``--rows packed`` (the default, ``rl.pack true``) or ``padded`` (``rl.pack false``), ``--fast``
(``rl.deterministic false``: sequences pack at any token, not at page boundaries); the training phase's
figures: completion tokens/s, the trainer's MFU (completion tokens; ``mfu`` in its log), the rows a step
trained and the share of their tokens that are prompts and completions (``train/row_fill``).

Results are printed and written as JSON (``--output``, default benchmarks/results/rl.json).
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax

from halyard.shard import Layout, MeshSpec
from halyard.train import TrainConfig, Trainer, parse_config
from halyard.train.cli import resolve_config_paths
from halyard.train.perf.peaks import device_peak_flops
from halyard.train.run.sources import model_config_of
from halyard.train.trainer.metrics_log import MetricsLog

RESULTS = Path(__file__).resolve().parents[1] / "results" / "rl.json"
LLAMA = [
    "--model.vocab_size", "8192", "--model.hidden_size", "512", "--model.intermediate_size", "1536",
    "--model.num_layers", "6", "--model.num_heads", "8", "--model.num_kv_heads", "4", "--model.max_position", "128",
]  # fmt: skip
QWEN_05B = [
    "--model.type", "qwen2", "--model.vocab_size", "151936", "--model.hidden_size", "896",
    "--model.intermediate_size", "4864", "--model.num_layers", "24", "--model.num_heads", "14",
    "--model.num_kv_heads", "2", "--model.tie_embeddings", "true", "--model.max_position", "128",
    "--model.param_dtype", "bfloat16", "--model.optimizer_dtype", "float32",
]  # fmt: skip
"""Qwen2.5-0.5B's shape (random weights) in bf16 with float32 Adam moments (for a TPU)."""
QUICK = [
    "--model.vocab_size", "64", "--model.hidden_size", "64", "--model.intermediate_size", "128",
    "--model.num_layers", "2", "--model.num_heads", "4", "--model.num_kv_heads", "2", "--model.max_position", "64",
]  # fmt: skip


SHAPES = {"llama": (LLAMA, 6, 64), "quick": (QUICK, 3, 8), "qwen-0.5b": (QWEN_05B, 4, 64)}
"""Each ``--shape``: its model options, the steps run and the new tokens per completion."""


def train_split(
    model: list[str], steps: int, new_tokens: int, run_dir: Path, rows: str = "packed", fast: bool = False
) -> dict[str, Any]:
    """Train ``steps`` GRPO steps on one device and split each later step's time."""
    args = ["--config", "grpo-demo", *model, "--trainer.run_dir", str(run_dir), "--trainer.steps", str(steps)]
    args += [
        "--rl.pack",
        "true" if rows == "packed" else "false",
        "--rl.deterministic",
        str(not fast).lower(),
    ]
    args += ["--trainer.batch_size", "64", "--rl.max_running", "64", "--rl.max_new_tokens", str(new_tokens)]
    args += ["--trainer.log_every", "1", "--trainer.eval_every", "0", "--checkpoint.every_steps", str(steps)]
    args += ["--trainer.progress", "false", "--trainer.mesh.data", "1", "--data.validation_fraction", "0"]
    config = parse_config(TrainConfig, resolve_config_paths(args))
    result = Trainer(config, devices=jax.devices()[:1]).fit()
    later = [record for record in result.history if record["step"] > 1]
    training = result.summary["goodput/step_seconds"] / max(len(later), 1)
    rollout = statistics.fmean(r["rollout/sampling_seconds"] for r in later)
    handover = statistics.fmean(r["rollout/handover_seconds"] for r in later)
    total = training + rollout + handover
    trained_tokens = statistics.fmean(r["completion/length_mean"] for r in later) * 64
    # completion tokens / the prompts' and completions' tokens the rows held
    completion_share = statistics.fmean(
        r["completion/length_mean"] * 64 / (r["train/row_fill"] * r["train/rows"] * r["train/row_width"])
        for r in later
    )
    return {
        "step_seconds": total,
        "share_rollouts": rollout / total,
        "share_handover": handover / total,
        "share_training": training / total,
        "rollout_tokens_per_second": statistics.fmean(r["rollout/tokens_per_second"] for r in later),
        "training_tokens_per_second": trained_tokens / training,
        "handover_seconds": handover,
        "completion_length_mean": trained_tokens / 64,
        "training_mfu": training_mfu(config, trained_tokens / training),
        "training_mfu_all_tokens": training_mfu(config, trained_tokens / training) / completion_share,
        "training_rows": statistics.fmean(r["train/rows"] for r in later),
        "training_row_fill": statistics.fmean(r["train/row_fill"] for r in later),
        "logp_difference_max": max(r.get("sampling/sampling_logp_difference/max", 0.0) for r in later),
        "rows": rows,
        "deterministic": not fast,
    }


def training_mfu(config: TrainConfig, tokens_per_second: float) -> float:
    """The training phase's MFU at ``tokens_per_second`` completion tokens (the trainer's ``mfu``: its
    FLOPs per token, this device's peak)."""
    model_config = model_config_of(config)
    flops = float(model_config.flops_per_token(config.data.seq_len))
    peak = device_peak_flops(jax.devices()[0], model_config.compute).flops_per_second
    return flops * tokens_per_second / peak


def resharding_seconds(model: list[str]) -> float:
    """Seconds to move the model's weights from FSDP over 8 devices to a whole copy on each (median of 5)."""
    config = parse_config(TrainConfig, resolve_config_paths(["--config", "grpo-demo", *model]))
    weights = config.model.init(jax.random.key(0))
    mesh = MeshSpec(data=1, fsdp=8).build(jax.devices()[:8])
    sharded = jax.device_put(weights, Layout.fsdp(min_shard=1).shardings(weights, mesh))
    replicated = Layout.data_parallel().shardings(weights, mesh)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        jax.block_until_ready(jax.device_put(sharded, replicated))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@contextlib.contextmanager
def evaluation_clock(started: float, seconds: dict[int, float]) -> Iterator[None]:
    """Note the wall time since ``started`` at which each evaluation of the run is logged."""
    original = MetricsLog.record_eval

    def record_eval(log: MetricsLog, step: int, metrics: dict[str, float], spent: float) -> None:
        seconds[step] = time.perf_counter() - started
        original(log, step, metrics, spent)

    MetricsLog.record_eval = record_eval  # type: ignore[method-assign]
    try:
        yield
    finally:
        MetricsLog.record_eval = original  # type: ignore[method-assign]


def demo_curve(run_dir: Path) -> dict[str, Any]:
    """The whole grpo-demo on one device: held-out reward by step, seconds from the start to each."""
    args = ["--config", "grpo-demo", "--trainer.run_dir", str(run_dir), "--trainer.eval_every", "25"]
    args += ["--trainer.progress", "false", "--trainer.mesh.data", "1"]
    started = time.perf_counter()
    seconds: dict[int, float] = {}
    with evaluation_clock(started, seconds):
        trainer = Trainer(parse_config(TrainConfig, resolve_config_paths(args)), devices=jax.devices()[:1])
        trainer.fit()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = {r["step"]: r["eval/reward_mean"] for r in records if "eval/reward_mean" in r}
    reached = min((seconds[s] for s, value in rewards.items() if value >= 0.9 and s in seconds), default=None)
    return {
        "held_out_reward": rewards,
        "seconds": seconds,
        "seconds_to_0.9": reached,
        "total_seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, 3 steps (a smoke test)")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default=None,
        help="llama (default), quick (= --quick) or qwen-0.5b (Qwen2.5-0.5B's shape, bf16: for a TPU)",
    )
    parser.add_argument("--rows", choices=("packed", "padded"), default="packed", help="rl.pack true / false")
    parser.add_argument("--fast", action="store_true", help="rl.deterministic false (no bitwise promise)")
    parser.add_argument("--curve", action="store_true", help="also the whole grpo-demo's learning curve")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    shape = args.shape or ("quick" if args.quick else "llama")
    model, steps, new_tokens = SHAPES[shape]
    with tempfile.TemporaryDirectory() as folder:
        split = train_split(model, steps, new_tokens, Path(folder) / "run", args.rows, args.fast)
    split["backend"] = jax.default_backend()
    if len(jax.devices()) >= 8:  # 8 simulated CPU devices (this script asks for them); a TPU chip is one
        split["resharding_seconds_fsdp8_to_replicated"] = resharding_seconds(model)
    for name, value in split.items():
        print(f"{name:40s} {value:.4g}" if isinstance(value, float) else f"{name:40s} {value}")
    if args.curve:
        with tempfile.TemporaryDirectory() as folder:
            curve = demo_curve(Path(folder) / "demo")
        print("grpo-demo held-out reward by step:", curve["held_out_reward"])
        print(
            f"seconds to a held-out reward of 0.9: {curve['seconds_to_0.9']}, total {curve['total_seconds']:.0f}"
        )
        split["demo_curve"] = curve
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(split, indent=1))
    return split


if __name__ == "__main__":
    main()
