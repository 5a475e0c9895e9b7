"""``trainer.watch``'s cost: step time with the watched step at every step and at every 100 steps, against
the run without it, in the same process.

The model is a GPT-2 of the benchmark family (4 layers, hidden 256, 4 heads, seq 256, batch 8, vocab 4096,
AdamW, float32) on one CPU device; both compiled programs come from the trainer's own `RunSetup.train_step`
(``trainer.watch``: norms per module and layer, optimizer-state norms and the model's reports: activation
RMS, attention logit maximum, output logits' maximum; no histograms). Four runs train side by side, one per
mode, each with its own state; step ``s`` of every run runs before step ``s + 1`` of any (in an order that
rotates), so a machine whose load changes from minute to minute (the shared VM) slows every mode alike:

- ``off``: the plain step every step (what a run without ``trainer.watch`` runs);
- ``every 100``: the plain step, and the watched one at every 100th step;
- ``every step``: the watched step every step;
- ``no example losses``: the plain step of a run with ``trainer.spikes.worst_examples: 0``, which does not
  return each example's loss (what ``off`` pays for the spike test's worst examples).

Each step also does the host work a run does: the metrics fetched every 10 steps (``trainer.log_every``) and,
after a watched step, its statistics fetched and flattened for the trackers (`StepInsights`); a step's clock
stops when the device has finished it. Reported: the mean seconds per step of each mode over the rounds and
the ratios ``every 100 / off`` (goal <= 1.02), ``every step / off`` and ``off / no example losses``.

Usage::

    python benchmarks/training/watch.py            # 3 rounds of 100 steps of each mode, after a round of warm-up
    python benchmarks/training/watch.py --quick    # tiny model, 1 round of 10 steps, watched every 10 (a smoke test)

Results are printed and written as JSON (``--output``, default benchmarks/results/watch.json).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from halyard.models import model_config
from halyard.shard import MeshSpec, global_batch_from_local, use_layout
from halyard.train.optim.config import AdamWConfig
from halyard.train.optim.schedule_config import ConstantScheduleConfig
from halyard.train.run.setup import RunSetup
from halyard.train.run_config import DataConfig, TrainConfig, TrainerConfig
from halyard.train.watch.config import SpikeConfig, WatchConfig
from halyard.train.watch.host import flatten_arrays

RESULTS = Path(__file__).resolve().parents[1] / "results" / "watch.json"
LOG_EVERY = 10


@dataclass(frozen=True)
class Shape:
    num_layers: int = 4
    hidden_size: int = 256
    num_heads: int = 4
    seq_len: int = 256
    batch_size: int = 8
    vocab_size: int = 4096
    block: int = 100
    """Steps per round; the ``every 100`` mode watches every ``block``-th step."""


QUICK = Shape(num_layers=2, hidden_size=64, num_heads=4, seq_len=32, batch_size=8, vocab_size=512, block=10)


def run_setup(shape: Shape, *, example_losses: bool = True) -> RunSetup:
    model = model_config(
        "gpt2",
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        num_layers=shape.num_layers,
        num_heads=shape.num_heads,
        max_position=shape.seq_len,
    )
    config = TrainConfig(
        model=model,
        data=DataConfig(seq_len=shape.seq_len),
        optimizer=AdamWConfig(schedule=ConstantScheduleConfig(warmup=0.0)),
        trainer=TrainerConfig(
            steps=10**6,
            batch_size=shape.batch_size,
            mesh=MeshSpec(data=1),
            watch=WatchConfig(every=shape.block),
            spikes=SpikeConfig(worst_examples=4 if example_losses else 0),
        ),
    )
    return RunSetup(config, devices=jax.devices()[:1])


class Runs:
    """One run per mode, each with its own state, all on the same batch and compiled programs; `tick` runs the
    next step of every run, in an order that rotates, and adds each step's seconds to its mode."""

    def __init__(self, setup: RunSetup, shape: Shape) -> None:
        self.shape = shape
        key = jax.random.PRNGKey(0)
        make = jax.jit(setup.init_state, out_shardings=setup.abstract_state.shardings)
        self.states = {mode: make(key) for mode in MODES}
        tokens = np.random.default_rng(0).integers(0, shape.vocab_size, (shape.batch_size, shape.seq_len + 1))
        self.batch = global_batch_from_local(
            {"tokens": tokens.astype(np.int32)}, setup.mesh, layout=setup.layout
        )
        state = self.states["off"]
        with use_layout(setup.layout, setup.mesh):
            self.plain = setup.train_step().lower(state, self.batch).compile()
            self.watched = setup.train_step(watched=True).lower(state, self.batch).compile()
            bare = run_setup(shape, example_losses=False).train_step()
            self.bare = bare.lower(state, self.batch).compile()
        self.seconds: dict[str, float] = dict.fromkeys(MODES, 0.0)
        self.steps = 0
        self.statistics = 0

    def tick(self) -> None:
        """Step ``self.steps + 1`` of every run (the device finished before the clock stops)."""
        self.steps += 1
        shift = self.steps % len(MODES)
        for mode in MODES[shift:] + MODES[:shift]:
            watched = mode == "every step" or (mode == "every 100" and self.steps % self.shape.block == 0)
            step = self.bare if mode == "no example losses" else self.watched if watched else self.plain
            start = time.perf_counter()
            self.states[mode], metrics = step(self.states[mode], self.batch)
            if watched:  # what the trainer does with a watched step's statistics
                self.statistics = len(flatten_arrays(jax.device_get(metrics["watch"])))
            if self.steps % LOG_EVERY == 0:
                float(metrics["loss"])  # the fetch of a logging step
            jax.block_until_ready(self.states[mode])
            self.seconds[mode] += time.perf_counter() - start


MODES = ("off", "every 100", "every step", "no example losses")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny model, 1 round of 10 steps (watched every 10)"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds of 100 steps of every mode (default 3; quick 1)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)
    shape = QUICK if args.quick else Shape()
    rounds = args.rounds or (1 if args.quick else 3)
    print(f"shape {asdict(shape)}, {rounds} rounds of {shape.block} steps of each mode", flush=True)
    runs = Runs(run_setup(shape), shape)
    for _ in range(shape.block):  # warm-up: a whole round, each program and fetch at least once
        runs.tick()
    runs.seconds, runs.steps = dict.fromkeys(MODES, 0.0), 0
    per_round: list[dict[str, float]] = []
    for index in range(rounds):
        before = dict(runs.seconds)
        for _ in range(shape.block):
            runs.tick()
        per_round.append({mode: (runs.seconds[mode] - before[mode]) / shape.block for mode in MODES})
        print(
            f"round {index + 1}: " + ", ".join(f"{m} {t * 1000:.2f} ms" for m, t in per_round[-1].items()),
            flush=True,
        )
    mean = {mode: runs.seconds[mode] / runs.steps for mode in MODES}
    ratios = {
        "every_100_over_off": mean["every 100"] / mean["off"],
        "every_step_over_off": mean["every step"] / mean["off"],
        "off_over_no_example_losses": mean["off"] / mean["no example losses"],
    }
    result = {
        "benchmark": "watch",
        "shape": asdict(shape),
        "rounds": rounds,
        "statistics_per_watched_step": runs.statistics,
        "seconds_per_step": mean,
        "seconds_per_step_by_round": per_round,
        "ratios": ratios,
    }
    print(f"statistics logged per watched step: {runs.statistics}")
    for mode in MODES:
        print(f"{mode:>17}: {mean[mode] * 1000:8.2f} ms a step")
    every = "every 100" if shape.block == 100 else f"every {shape.block}"
    print(f"{every} / off: {ratios['every_100_over_off']:.4f} (goal <= 1.02)")
    print(f"every step / off: {ratios['every_step_over_off']:.4f}")
    print(f"off / no example losses: {ratios['off_over_no_example_losses']:.4f}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
