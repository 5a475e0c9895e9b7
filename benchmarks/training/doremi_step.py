"""DoReMi's cost: the proxy's step (the reference's forward, the weights' step, the proxy's forward and
backward: `halyard.train.doremi.step`) against the plain step of the same model on the same batch.

The model and batch are ``doremi-demo``'s (a 2-layer Llama, hidden 96, a token per byte, seq 128, batch 16)
on one CPU device; both programs come from the trainer's own `RunSetup.train_step`. The two runs train side
by side, step ``s`` of each before step ``s + 1`` of either (the first of the two alternating), so a machine
whose load changes from minute to minute slows both alike. A step's clock stops when the device has
finished it. Reported: the mean seconds per step of each and the ratio proxy / plain (``proxy_over_plain``),
printed and written as JSON (``--output``, default benchmarks/results/doremi_step.json).

Usage::

    python benchmarks/training/doremi_step.py            # 3 rounds of 50 steps each, after a round of warm-up
    python benchmarks/training/doremi_step.py --quick    # 1 round of 5 steps (a smoke test)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from halyard.shard import global_batch_from_local, use_layout
from halyard.train.builtin_configs import resolve_config_paths
from halyard.train.config.parse import parse_config
from halyard.train.doremi.step import REFERENCE_MODEL
from halyard.train.run.setup import RunSetup
from halyard.train.run_config import TrainConfig


def run_setup(objective: str) -> RunSetup:
    """``doremi-demo`` on one device, as a plain lm run or as a proxy (``trainer.objective: doremi``)."""
    args = ["--config", "doremi-demo", "--trainer.objective", objective, "--doremi.reference", "unused"]
    config = parse_config(TrainConfig, resolve_config_paths(args))
    return RunSetup(config, devices=jax.devices()[:1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--output", default="benchmarks/results/doremi_step.json")
    args = parser.parse_args(argv)
    rounds, steps = (1, 5) if args.quick else (args.rounds, args.steps)
    setups = {"plain": run_setup("lm"), "proxy": run_setup("doremi")}
    config = setups["plain"].config
    rows, width = config.trainer.batch_size, config.data.seq_len + 1
    rng = np.random.default_rng(0)
    sources = len(config.data.mixture.sources)
    local = {
        "tokens": rng.integers(1, 257, (rows, width)).astype(np.int32),
        "segment_ids": np.zeros((rows, width), np.int32),
        "source_one_hot": np.eye(sources, dtype=np.int32)[rng.integers(0, sources, rows)],
    }
    programs, states, batches = {}, {}, {}
    for name, setup in setups.items():
        with use_layout(setup.layout, setup.mesh):
            batch = global_batch_from_local(local, setup.mesh, layout=setup.layout)
            states[name] = jax.jit(setup.init_state)(jax.random.PRNGKey(0))
            if name == "proxy":  # a reference of the same shape (its values do not change the time)
                batch = {**batch, REFERENCE_MODEL: jax.jit(setup.init_state)(jax.random.PRNGKey(1)).params}
            batches[name] = batch
            programs[name] = setup.train_step().lower(states[name], batch).compile()
    seconds: dict[str, list[float]] = {name: [] for name in setups}

    def step(name: str) -> float:
        started = time.perf_counter()
        states[name], metrics = programs[name](states[name], batches[name])
        jax.block_until_ready((states[name], metrics))
        return time.perf_counter() - started

    for round_index in range(rounds + 1):  # round 0 warms up
        for index in range(steps):
            order = list(setups) if index % 2 == 0 else list(reversed(setups))
            for name in order:
                elapsed = step(name)
                if round_index > 0:
                    seconds[name].append(elapsed)
    result = {name: float(np.mean(values)) for name, values in seconds.items()}
    result["proxy_over_plain"] = result["proxy"] / result["plain"]
    result["rounds"], result["steps"] = rounds, steps
    print(json.dumps(result, indent=2))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
