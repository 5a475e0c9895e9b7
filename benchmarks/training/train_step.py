"""One training step of a benchmark model: Halyard's trainer vs plain JAX vs PyTorch (transformers).

``--model`` picks the shape (`benchmark_models.py`): ``gpt2`` (6 layers, hidden 512, 8 heads, seq 256,
batch 8, vocab 8192, tied embeddings, 23.2M parameters), ``llama`` (the same width with RMSNorm, RoPE,
SwiGLU and GQA 8/4, untied) or ``llama-49k`` (4 layers, hidden 256, GQA 4/2, seq 128, batch 16, vocab
49152: the unembedding and the loss dominate). AdamW, f32, random tokens. Three implementations in one
process:

- ``halyard``: the `halyard.models` config, `halyard.train.step.make_train_step` with
  `halyard.train.objectives.lm_loss.lm_loss_fn` and the trainer's AdamW (`AdamWConfig`: clipping at 1.0,
  decay on matrices), jitted with the state donated: the trainer's own code path;
- ``plain_jax``: the same math in jnp (lax.scan over layers, ``jax.nn.dot_product_attention``, full
  logits), optax clip + AdamW, jitted with the state donated (`gpt2_baselines.py`, `llama_baselines.py`);
- ``pytorch``: transformers' ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` (sdpa attention) +
  ``torch.optim.AdamW`` + gradient clipping on CPU.

Every implementation runs one warm-up step (timed: the first-step latency, compilation included), then the
implementations alternate for ``--rounds`` rounds, one step each, so that load changes on a shared machine
hit all of them alike. The f32 matmul rate is measured in each round in the same process (the best of a
few ``2048 x 2048`` jitted matmuls) and MFU is ``model FLOPs / (median step x median matmul rate)``. The
1-minute load average (``os.getloadavg``) is recorded before and after the rounds, and each step's CPU
time (all threads of the process). On a loaded machine, wall time favours XLA (PyTorch's OpenMP threads
stall when another process holds a core); the CPU time per step with one thread each is the fairer
comparison there::

    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false OMP_NUM_THREADS=1 taskset -c 1 \
        python benchmarks/training/train_step.py --model llama-49k

Extra Halyard configurations run beside the default with ``--variant NAME:FIELD=VALUE,...`` (model
config fields: ``attention_implementation``, ``loss_block_size`` (``none`` = full logits), ``scan_layers``,
``remat``, ``loss_full_logits_max_mib``), e.g. ``--variant full_logits:loss_block_size=none``.

Usage::

    python benchmarks/training/train_step.py                 # the GPT-2 benchmark model, 5 rounds
    python benchmarks/training/train_step.py --model llama-49k   # the large-vocabulary Llama
    python benchmarks/training/train_step.py --quick         # tiny shapes, a smoke test (seconds)
    python benchmarks/training/train_step.py --no-torch      # skip PyTorch

Results are printed and written as JSON (``--output``, default benchmarks/results/train_step.json for
``gpt2``, train_step_<model>.json for the others).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared models and baselines
from benchmark_models import MODELS, BenchmarkModel
from gpt2_baselines import torch_matmul_flops

from halyard.train.objectives.lm_loss import lm_loss_fn
from halyard.train.optim.config import AdamWConfig
from halyard.train.optim.schedule_config import ConstantScheduleConfig
from halyard.train.perf.peaks import measure_matmul_flops
from halyard.train.step import init_state, make_train_step

RESULTS = Path(__file__).resolve().parents[1] / "results"
GOALS = {"halyard_over_pytorch_tokens_per_second": 1.0, "halyard_over_plain_jax_step_time": 1.03, "mfu": 0.60}


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``"name:field=value,field=value"`` -> ``(name, {field: value})``; ``none``/``true``/``false``/ints parsed,
    a quoted value (``remat='none'``) kept as the string inside the quotes.

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
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]  # quoted: a string as written (remat='none')
        elif lowered in ("none", "null"):
            value = None
        elif lowered in ("true", "false"):
            value = lowered == "true"
        elif lowered.lstrip("-").isdigit():
            value = int(lowered)
        fields[field.strip()] = value
    return name, fields


def trainer_step(config: Any) -> tuple[Callable, Callable[[jax.Array], Any]]:
    """The trainer's step for a model config: ``(jitted step(state, batch), init(key) -> TrainState)``.

    `make_train_step` with `lm_loss_fn` and the trainer's AdamW (`AdamWConfig`: clipping at 1.0, decay
    on matrices), jitted with the state donated; a batch is ``{"tokens": int [batch, seq_len + 1]}``.
    """
    optimizer_config = AdamWConfig(schedule=ConstantScheduleConfig(warmup=0.0))
    optimizer = optimizer_config.build(total_steps=1000)
    step = make_train_step(
        lm_loss_fn(), optimizer, learning_rate=optimizer_config.learning_rate_schedule(1000)
    )
    return jax.jit(step, donate_argnums=0), lambda key: init_state(config.init(key), optimizer, key)


def make_halyard_step(
    model: BenchmarkModel, shapes: Any, key: jax.Array, **overrides: Any
) -> tuple[Callable, Any]:
    """The trainer's step for a benchmark model: ``(jitted step(state, batch), initial TrainState)``."""
    step, init = trainer_step(model.halyard_config(shapes, **overrides))
    return step, init(key)


class Runner:
    """One implementation: a step callable that keeps its own state and returns the loss as a float."""

    def __init__(self, name: str, run_step: Callable[[], float]) -> None:
        self.name = name
        self._run_step = run_step
        self.first_step_seconds = 0.0
        self.first_loss = float("nan")
        self.seconds: list[float] = []
        self.cpu_seconds: list[float] = []

    def warm_up(self) -> None:
        start = time.perf_counter()
        self.first_loss = self._run_step()
        self.first_step_seconds = time.perf_counter() - start

    def timed_step(self) -> None:
        cpu_start, start = process_cpu_seconds(), time.perf_counter()
        self._run_step()
        self.seconds.append(time.perf_counter() - start)
        self.cpu_seconds.append(process_cpu_seconds() - cpu_start)


def process_cpu_seconds() -> float:
    """User + system CPU time of this process (all threads): with one thread each (see the module
    docstring), the least load-sensitive measure of a step's work on a shared machine."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def jax_runner(name: str, step: Callable, state: Any, batch: Any, loss_of: Callable[[Any], Any]) -> Runner:
    holder = {"state": state}

    def run() -> float:
        holder["state"], output = step(holder["state"], batch)
        return float(loss_of(output))  # float() blocks until the step has finished

    return Runner(name, run)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", choices=sorted(MODELS), default="gpt2", help="the benchmark shape (default gpt2)"
    )
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
    parser.add_argument("--output", type=Path, default=None, help="where to write the JSON result")
    args = parser.parse_args(argv)

    model = MODELS[args.model]
    shapes = model.quick_shapes if args.quick else model.shapes
    suffix = "" if args.model == "gpt2" else "_" + args.model.replace("-", "_")
    output = args.output or RESULTS / f"train_step{suffix}.json"
    rounds = args.rounds or (2 if args.quick else 5)
    matmul_size = args.matmul_size or (256 if args.quick else 2048)
    variants = [("halyard", {})] + [parse_variant(v) for v in args.variant]

    tokens = np.random.default_rng(0).integers(0, shapes.vocab_size, (shapes.batch_size, shapes.seq_len + 1))
    runners: list[Runner] = []
    flops_per_step = 0.0
    for name, overrides in variants:
        step, state = make_halyard_step(model, shapes, jax.random.PRNGKey(0), **overrides)
        runners.append(
            jax_runner(name, step, state, {"tokens": jax.numpy.asarray(tokens)}, lambda m: m["loss"])
        )
        flops_per_step = model.halyard_config(shapes).flops_per_token(shapes.seq_len) * shapes.tokens_per_step
    if not args.no_plain:
        step, state = model.make_plain_step(shapes, jax.random.PRNGKey(0))
        runners.append(jax_runner("plain_jax", step, state, jax.numpy.asarray(tokens), lambda loss: loss))
    if not args.no_torch:
        torch_step = model.make_torch_step(shapes)
        runners.append(Runner("pytorch", lambda: torch_step(tokens)))

    for runner in runners:
        runner.warm_up()
        print(
            f"{runner.name:>16}: first step {runner.first_step_seconds:7.2f} s, loss {runner.first_loss:.4f}"
        )
    load_before = os.getloadavg()[0]
    matmul_rates: list[float] = []
    for round_index in range(rounds):
        matmul_rates.append(measure_matmul_flops("float32", size=matmul_size, repeats=3))
        for runner in runners if round_index % 2 == 0 else runners[::-1]:
            runner.timed_step()
    torch_rate = None if args.no_torch else torch_matmul_flops(matmul_size, repeats=3)
    load_average = {"before_rounds": load_before, "after_rounds": os.getloadavg()[0]}

    peak = statistics.median(matmul_rates)
    table: dict[str, dict[str, float]] = {}
    for runner in runners:
        median = statistics.median(runner.seconds)
        table[runner.name] = {
            "step_seconds_median": median,
            "step_seconds": runner.seconds,
            "cpu_seconds_median": statistics.median(runner.cpu_seconds),
            "cpu_seconds": runner.cpu_seconds,
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
    if "pytorch" in table:
        ratios["halyard_over_pytorch_cpu_seconds"] = (
            table["halyard"]["cpu_seconds_median"] / table["pytorch"]["cpu_seconds_median"]
        )
    best_name = min((n for n, _ in variants), key=lambda n: table[n]["step_seconds_median"])
    result = {
        "benchmark": "train_step",
        "model": args.model,
        "model_description": model.description,
        "shapes": asdict(shapes),
        "dtype": "float32",
        "quick": args.quick,
        "machine": f"{platform.machine()} {jax.default_backend()}, {jax.device_count()} device(s)",
        "rounds": rounds,
        "load_average_1min": load_average,
        "cpu_count": os.cpu_count(),
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
    print(
        f"1-minute load average {load_average['before_rounds']:.2f} before the rounds, "
        f"{load_average['after_rounds']:.2f} after ({os.cpu_count()} CPUs)"
    )
    print(
        f"{'implementation':>16} {'step (s)':>9} {'CPU (s)':>8} {'tokens/s':>9} {'MFU':>6} {'first step (s)':>15}"
    )
    for name, row in table.items():
        print(
            f"{name:>16} {row['step_seconds_median']:9.3f} {row['cpu_seconds_median']:8.3f} "
            f"{row['tokens_per_second']:9.1f} {100 * row['mfu']:5.1f}% {row['first_step_seconds']:15.2f}"
        )
    for name, value in ratios.items():
        goal = GOALS.get(name)
        print(
            f"{name}: {value:.3f}"
            + (f" (goal {'<=' if 'step_time' in name else '>='} {goal})" if goal else "")
        )
    if len(variants) > 1:
        print(f"fastest Halyard variant: {best_name}")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {output}")
    return result


if __name__ == "__main__":
    main()
