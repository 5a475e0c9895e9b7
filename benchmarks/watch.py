"""``trainer.watch``'s cost: step time with the watched step at every step and at every 100 steps, against
the run without it, in the same process.

The model is a GPT-2 of the benchmark family (4 layers, hidden 256, 4 heads, seq 256, batch 8, vocab 4096,
AdamW, float32) on one CPU device; both compiled programs come from the trainer's own `RunSetup.train_step`
(``trainer.watch``: norms per module and layer, optimizer-state norms and the model's reports: activation
RMS, attention logit maximum, output logits' maximum; no histograms). Blocks of 100 steps run in three modes,
alternating in order from round to round:

- ``off``: the plain step every step (what a run without ``trainer.watch`` runs);
- ``every 100``: the plain step, and the watched one at the block's 100th step;
- ``every step``: the watched step every step;
- ``no example losses``: the plain step of a run with ``trainer.spikes.worst_examples: 0``, which does not
  return each example's loss (what ``off`` pays for the spike test's worst examples).

Each block also does the host work a run does: the metrics fetched every 10 steps (``trainer.log_every``) and,
after a watched step, its statistics fetched and flattened for the trackers (`StepInsights`). Reported: the
median seconds per step of each mode and the ratios ``every 100 / off`` (goal <= 1.02), ``every step /
off`` and ``off / no example losses``.

Usage::

    python benchmarks/watch.py            # 5 rounds of 100-step blocks
    python benchmarks/watch.py --quick    # tiny model, 1 round of 10-step blocks, every 5 (a smoke test)

Results are printed and written as JSON (``--output``, default benchmarks/results/watch.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
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

RESULTS = Path(__file__).parent / "results" / "watch.json"
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
    """Steps per timed block; the ``every 100`` mode watches the block's last step."""


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


class Modes:
    """The state, the batch and both compiled steps; `block` runs and times one block of steps in a mode."""

    def __init__(self, setup: RunSetup, shape: Shape) -> None:
        self.setup, self.shape = setup, shape
        key = jax.random.PRNGKey(0)
        self.state = jax.jit(setup.init_state, out_shardings=setup.abstract_state.shardings)(key)
        tokens = np.random.default_rng(0).integers(0, shape.vocab_size, (shape.batch_size, shape.seq_len + 1))
        self.batch = global_batch_from_local(
            {"tokens": tokens.astype(np.int32)}, setup.mesh, layout=setup.layout
        )
        with use_layout(setup.layout, setup.mesh):
            self.plain = setup.train_step().lower(self.state, self.batch).compile()
            self.watched = setup.train_step(watched=True).lower(self.state, self.batch).compile()
            bare = run_setup(shape, example_losses=False).train_step()
            self.bare = bare.lower(self.state, self.batch).compile()
        self.statistics = 0

    def block(self, mode: str) -> float:
        """Seconds for one block of ``shape.block`` steps in ``mode`` (one of `MODES`)."""
        start = time.perf_counter()
        for index in range(1, self.shape.block + 1):
            watched = mode == "every step" or (mode == "every 100" and index == self.shape.block)
            step = self.bare if mode == "no example losses" else self.watched if watched else self.plain
            self.state, metrics = step(self.state, self.batch)
            if watched:  # what the trainer does with a watched step's statistics
                self.statistics = len(flatten_arrays(jax.device_get(metrics["watch"])))
            if index % LOG_EVERY == 0 or index == self.shape.block:
                float(metrics["loss"])  # the fetch of a logging step
        return time.perf_counter() - start


MODES = ("off", "every 100", "every step", "no example losses")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 round of 10-step blocks")
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds of the four modes (default 5; quick 1)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)
    shape = QUICK if args.quick else Shape()
    rounds = args.rounds or (1 if args.quick else 5)
    print(f"shape {asdict(shape)}, {rounds} rounds of {shape.block}-step blocks", flush=True)
    modes = Modes(run_setup(shape), shape)
    for mode in MODES:  # warm-up: every program and fetch once
        modes.block(mode)
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for index in range(rounds):
        order = MODES[index % len(MODES) :] + MODES[: index % len(MODES)]
        for mode in order:
            seconds[mode].append(modes.block(mode) / shape.block)
        print(
            f"round {index + 1}: " + ", ".join(f"{mode} {seconds[mode][-1] * 1000:.2f} ms" for mode in MODES),
            flush=True,
        )
    median = {mode: statistics.median(values) for mode, values in seconds.items()}
    ratios = {
        "every_100_over_off": median["every 100"] / median["off"],
        "every_step_over_off": median["every step"] / median["off"],
        "off_over_no_example_losses": median["off"] / median["no example losses"],
    }
    result = {
        "benchmark": "watch",
        "shape": asdict(shape),
        "rounds": rounds,
        "statistics_per_watched_step": modes.statistics,
        "seconds_per_step_median": median,
        "seconds_per_step": seconds,
        "ratios": ratios,
    }
    print(f"statistics logged per watched step: {modes.statistics}")
    for mode in MODES:
        print(f"{mode:>17}: {median[mode] * 1000:8.2f} ms a step")
    every = "every 100" if shape.block == 100 else f"every {shape.block}"
    print(f"{every} / off: {ratios['every_100_over_off']:.4f} (goal <= 1.02)")
    print(f"every step / off: {ratios['every_step_over_off']:.4f}")
    print(f"off / no example losses: {ratios['off_over_no_example_losses']:.4f}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
