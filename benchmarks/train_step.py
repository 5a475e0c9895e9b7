"""One training step of the GPT-2 benchmark model: Halyard's trainer vs plain JAX vs PyTorch (transformers).

The model: 6 layers, hidden 512, 8 heads, seq 256, batch 8, vocab 8192, tied embeddings, AdamW, f32
(23.2M parameters), random tokens. Three implementations in one process:

- ``halyard``: `halyard.models` ``gpt2`` config, `halyard.train.trainer.step.make_train_step` with
  `halyard.train.trainer.loss.lm_loss_fn` and the trainer's AdamW (`AdamWConfig`: clipping at 1.0,
  decay on matrices), jitted with the state donated: the trainer's own code path;
- ``plain_jax``: the same math in jnp (lax.scan over layers, ``jax.nn.dot_product_attention``, full
  logits), optax clip + AdamW, jitted with the state donated (`gpt2_baselines.py`);
- ``pytorch``: transformers' ``GPT2LMHeadModel`` + ``torch.optim.AdamW`` + gradient clipping on CPU.

Every implementation runs one warm-up step (timed: the first-step latency, compilation included), then the
implementations alternate for ``--rounds`` rounds, one step each, so that load changes on a shared machine
hit all of them alike. The f32 matmul rate is measured in each round in the same process (the best of a
few ``2048 x 2048`` jitted matmuls) and MFU is ``model FLOPs / (median step x median matmul rate)``.

Extra Halyard configurations run beside the default with ``--variant NAME:FIELD=VALUE,...`` (model
config fields: ``attention_implementation``, ``loss_block_size`` (``none`` = full logits), ``scan_layers``,
``remat``), e.g. ``--variant full_logits:loss_block_size=none``.

Usage::

    python benchmarks/train_step.py                 # the benchmark model, 5 rounds
    python benchmarks/train_step.py --quick         # tiny shapes, a smoke test (seconds)
    python benchmarks/train_step.py --no-torch      # skip PyTorch

Results are printed and written as JSON (``--output``, default benchmarks/results/train_step.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from gpt2_baselines import Gpt2Shapes, make_plain_step, make_torch_step, torch_matmul_flops

from halyard.models import model_config
from halyard.train.optim import AdamWConfig, ConstantScheduleConfig
from halyard.train.perf import measure_matmul_flops
from halyard.train.trainer.loss import lm_loss_fn
from halyard.train.trainer.step import init_state, make_train_step

RESULTS = Path(__file__).parent / "results" / "train_step.json"
QUICK_SHAPES = Gpt2Shapes(num_layers=2, hidden_size=64, num_heads=4, seq_len=32, batch_size=2, vocab_size=256)
GOALS = {"halyard_over_pytorch_tokens_per_second": 1.0, "halyard_over_plain_jax_step_time": 1.03, "mfu": 0.60}


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``"name:field=value,field=value"`` -> ``(name, {field: value})``; ``none``/``true``/``false``/ints parsed.

    Raises:
        SystemExit: a malformed variant (the message shows the expected form).
    """
    name, _, settings = text.partition(":")
    if not name or not settings:
        raise SystemExit(f"--variant {text!r}: expected NAME:FIELD=VALUE[,FIELD=VALUE...]")
    fields: dict[str, Any] = {}
    for item in settings.split(","):
        field, equals, raw = item.partition("=")
        if not equals:
            raise SystemExit(f"--variant {text!r}: {item!r} is not FIELD=VALUE")
        lowered = raw.strip().lower()
        value: Any = raw.strip()
        if lowered in ("none", "null"):
            value = None
        elif lowered in ("true", "false"):
            value = lowered == "true"
        elif lowered.lstrip("-").isdigit():
            value = int(lowered)
        fields[field.strip()] = value
    return name, fields


def halyard_model_config(shapes: Gpt2Shapes, **overrides: Any) -> Any:
    """The ``gpt2`` config of the benchmark model (positions = seq_len, as in the baselines)."""
    return model_config(
        "gpt2",
        vocab_size=shapes.vocab_size,
        hidden_size=shapes.hidden_size,
        num_layers=shapes.num_layers,
        num_heads=shapes.num_heads,
        max_position=shapes.seq_len,
        **overrides,
    )


def make_halyard_step(shapes: Gpt2Shapes, key: jax.Array, **overrides: Any) -> tuple[Callable, Any]:
    """The trainer's step for the benchmark model: ``(jitted step(state, batch), initial TrainState)``."""
    config = halyard_model_config(shapes, **overrides)
    optimizer_config = AdamWConfig(schedule=ConstantScheduleConfig(warmup=0.0))
    optimizer = optimizer_config.build(total_steps=1000)
    step = make_train_step(
        lm_loss_fn(), optimizer, learning_rate=optimizer_config.learning_rate_schedule(1000)
    )
    state = init_state(config.init(key), optimizer, key)
    return jax.jit(step, donate_argnums=0), state


class Runner:
    """One implementation: a step callable that keeps its own state and returns the loss as a float."""

    def __init__(self, name: str, run_step: Callable[[], float]) -> None:
        self.name = name
        self._run_step = run_step
        self.first_step_seconds = 0.0
        self.first_loss = float("nan")
        self.seconds: list[float] = []

    def warm_up(self) -> None:
        start = time.perf_counter()
        self.first_loss = self._run_step()
        self.first_step_seconds = time.perf_counter() - start

    def timed_step(self) -> None:
        start = time.perf_counter()
        self._run_step()
        self.seconds.append(time.perf_counter() - start)


def jax_runner(name: str, step: Callable, state: Any, batch: Any, loss_of: Callable[[Any], Any]) -> Runner:
    holder = {"state": state}

    def run() -> float:
        holder["state"], output = step(holder["state"], batch)
        return float(loss_of(output))  # float() blocks until the step has finished

    return Runner(name, run)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes and 2 rounds (a smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 5; quick 2)")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch baseline")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain-JAX baseline")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="extra Halyard config NAME:FIELD=VALUE,... (repeatable)",
    )
    parser.add_argument(
        "--matmul-size", type=int, default=None, help="side of the peak matmul (2048; quick 256)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)

    shapes = QUICK_SHAPES if args.quick else Gpt2Shapes()
    rounds = args.rounds or (2 if args.quick else 5)
    matmul_size = args.matmul_size or (256 if args.quick else 2048)
    variants = [("halyard", {})] + [parse_variant(v) for v in args.variant]

    tokens = np.random.default_rng(0).integers(0, shapes.vocab_size, (shapes.batch_size, shapes.seq_len + 1))
    runners: list[Runner] = []
    flops_per_step = 0.0
    for name, overrides in variants:
        step, state = make_halyard_step(shapes, jax.random.PRNGKey(0), **overrides)
        runners.append(
            jax_runner(name, step, state, {"tokens": jax.numpy.asarray(tokens)}, lambda m: m["loss"])
        )
        flops_per_step = halyard_model_config(shapes).flops_per_token(shapes.seq_len) * shapes.tokens_per_step
    if not args.no_plain:
        step, state = make_plain_step(shapes, jax.random.PRNGKey(0))
        runners.append(jax_runner("plain_jax", step, state, jax.numpy.asarray(tokens), lambda loss: loss))
    if not args.no_torch:
        torch_step = make_torch_step(shapes)
        runners.append(Runner("pytorch", lambda: torch_step(tokens)))

    for runner in runners:
        runner.warm_up()
        print(
            f"{runner.name:>16}: first step {runner.first_step_seconds:7.2f} s, loss {runner.first_loss:.4f}"
        )
    matmul_rates: list[float] = []
    for round_index in range(rounds):
        matmul_rates.append(measure_matmul_flops("float32", size=matmul_size, repeats=3))
        for runner in runners if round_index % 2 == 0 else runners[::-1]:
            runner.timed_step()
    torch_rate = None if args.no_torch else torch_matmul_flops(matmul_size, repeats=3)

    peak = statistics.median(matmul_rates)
    table: dict[str, dict[str, float]] = {}
    for runner in runners:
        median = statistics.median(runner.seconds)
        table[runner.name] = {
            "step_seconds_median": median,
            "step_seconds": runner.seconds,
            "tokens_per_second": shapes.tokens_per_step / median,
            "mfu": flops_per_step / median / peak,
            "first_step_seconds": runner.first_step_seconds,
            "first_loss": runner.first_loss,
        }
    ratios: dict[str, float] = {}
    halyard = table["halyard"]["step_seconds_median"]
    if "pytorch" in table:
        ratios["halyard_over_pytorch_tokens_per_second"] = table["pytorch"]["step_seconds_median"] / halyard
        if "plain_jax" in table:
            ratios["plain_jax_over_pytorch_tokens_per_second"] = (
                table["pytorch"]["step_seconds_median"] / table["plain_jax"]["step_seconds_median"]
            )
    if "plain_jax" in table:
        ratios["halyard_over_plain_jax_step_time"] = halyard / table["plain_jax"]["step_seconds_median"]
    ratios["mfu"] = table["halyard"]["mfu"]
    best_name = min((n for n, _ in variants), key=lambda n: table[n]["step_seconds_median"])
    result = {
        "benchmark": "train_step",
        "shapes": asdict(shapes),
        "dtype": "float32",
        "quick": args.quick,
        "machine": f"{platform.machine()} {jax.default_backend()}, {jax.device_count()} device(s)",
        "rounds": rounds,
        "flops_per_step": flops_per_step,
        "matmul_size": matmul_size,
        "matmul_flops_per_second": peak,
        "matmul_flops_per_second_rounds": matmul_rates,
        "torch_matmul_flops_per_second": torch_rate,
        "variants": {name: overrides for name, overrides in variants},
        "implementations": table,
        "ratios": ratios,
        "goals": GOALS,
        "best_halyard_variant": best_name,
    }
    print(f"\nshapes {asdict(shapes)}, {rounds} rounds, f32 matmul rate {peak / 1e9:.1f} GFLOP/s (median)")
    print(f"model FLOPs per step {flops_per_step / 1e9:.1f} G")
    print(f"{'implementation':>16} {'step (s)':>9} {'tokens/s':>9} {'MFU':>6} {'first step (s)':>15}")
    for name, row in table.items():
        print(
            f"{name:>16} {row['step_seconds_median']:9.3f} {row['tokens_per_second']:9.1f} "
            f"{100 * row['mfu']:5.1f}% {row['first_step_seconds']:15.2f}"
        )
    for name, value in ratios.items():
        goal = GOALS.get(name)
        print(
            f"{name}: {value:.3f}"
            + (f" (goal {'<=' if 'step_time' in name else '>='} {goal})" if goal else "")
        )
    if len(variants) > 1:
        print(f"fastest Halyard variant: {best_name}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
