"""The invariant train step (``trainer.invariant``) against today's step: step time and compiled memory.

The GPT-2 benchmark model (6 layers, hidden 512, 8 heads, seq 256, batch 8, vocab 8192, AdamW clipped to
1.0, f32) is trained with the trainer's code path (`make_train_step` + `lm_loss_fn`, the state created in its
sharded layout and donated) on three meshes of simulated CPU devices:

- ``1 device``: ``MeshSpec(data=1)`` on the first device;
- ``data 8``: ``MeshSpec(data=8)``, weights replicated;
- ``fsdp 8``: ``MeshSpec(data=1, fsdp=8)``, weights and AdamW moments sharded.

On each, today's step and the invariant step (8 canonical slices of one sequence) alternate; reported per
mesh, each as a ratio measured in this run:

- step time invariant / today (medians; goal <= 1.10);
- compiled temporary bytes per device invariant / today (XLA's ``memory_analysis()``);
- that the invariant step's losses are bitwise equal on the three meshes (today's are not).

Usage::

    python benchmarks/parallelism/invariant_step.py            # benchmark model, 5 rounds
    python benchmarks/parallelism/invariant_step.py --quick    # tiny model, 2 rounds (a smoke test)
    python benchmarks/parallelism/invariant_step.py --mesh "fsdp 8"   # one mesh
    python benchmarks/parallelism/invariant_step.py --slices 2        # 2 canonical slices of 4 sequences

The script sets ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` itself when JAX is not yet loaded.
Results are printed and written as JSON (``--output``, default benchmarks/results/invariant_step.json).
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared models and baselines
from benchmark_models import gpt2_config
from scaling import QUICK, Setup  # the GPT-2 benchmark shape and its quick size

from halyard.shard import Layout, MeshSpec, global_batch_from_local, use_layout
from halyard.train.invariant.slices import CanonicalSlices
from halyard.train.objectives.lm_loss import lm_loss_fn
from halyard.train.optim.config import AdamWConfig
from halyard.train.optim.schedule_config import ConstantScheduleConfig
from halyard.train.step import TrainState, init_state, make_train_step

RESULTS = Path(__file__).resolve().parents[1] / "results" / "invariant_step.json"
NUM_DEVICES = 8
MAX_GRAD_NORM = 1.0


class Arm:
    """One (mesh, step) pair: its sharded state, compiled step, memory and timings."""

    def __init__(
        self,
        mesh_name: str,
        mesh: jax.sharding.Mesh,
        layout: Layout,
        setup: Setup,
        invariant: bool,
        slices: int | None = None,
    ) -> None:
        self.name = f"{mesh_name} {'invariant' if invariant else 'today'}"
        self.mesh, self.layout = mesh, layout
        config = gpt2_config(setup)  # type: ignore[arg-type]  # the same fields as Gpt2Shapes
        # The invariant step clips with its canonical norm, so its optimizer does not clip itself.
        clipping = None if invariant else MAX_GRAD_NORM
        adamw = AdamWConfig(schedule=ConstantScheduleConfig(warmup=0.0), max_grad_norm=clipping)
        optimizer = adamw.build(total_steps=1000)

        def make_state(key: jax.Array) -> TrainState:
            return init_state(config.init(key), optimizer, key)

        key = jax.random.PRNGKey(0)
        shardings = layout.shardings(jax.eval_shape(make_state, key), mesh)
        self.state = jax.jit(make_state, out_shardings=shardings)(key)
        tokens = np.random.default_rng(0).integers(0, setup.vocab_size, (setup.batch_size, setup.seq_len + 1))
        self.batch = global_batch_from_local({"tokens": tokens.astype(np.int32)}, mesh, layout=layout)
        canonical = (
            CanonicalSlices(mesh, slices or setup.batch_size, MAX_GRAD_NORM, layout) if invariant else None
        )
        step = make_train_step(lm_loss_fn(), optimizer, invariant=canonical)
        jitted = jax.jit(step, donate_argnums=0, out_shardings=(shardings, None))
        start = time.perf_counter()
        with use_layout(layout, mesh):
            self.step = jitted.lower(self.state, self.batch).compile()
        self.compile_seconds = time.perf_counter() - start
        memory = self.step.memory_analysis()
        self.temp_bytes = int(getattr(memory, "temp_size_in_bytes", 0)) if memory else 0
        self.argument_bytes = int(getattr(memory, "argument_size_in_bytes", 0)) if memory else 0
        self.seconds: list[float] = []
        self.losses: list[float] = []

    def run(self, timed: bool = True) -> None:
        start = time.perf_counter()
        self.state, metrics = self.step(self.state, self.batch)
        self.losses.append(float(metrics["loss"]))
        if timed:
            self.seconds.append(time.perf_counter() - start)

    def row(self) -> dict[str, Any]:
        return {
            "step_seconds_median": statistics.median(self.seconds),
            "step_seconds": self.seconds,
            "compile_seconds": self.compile_seconds,
            "compiled_temp_bytes_per_device": self.temp_bytes,
            "compiled_argument_bytes_per_device": self.argument_bytes,
            "losses": self.losses,
        }


MESHES = ("1 device", "data 8", "fsdp 8")


def meshes() -> dict[str, tuple[jax.sharding.Mesh, Layout]]:
    return {
        "1 device": (MeshSpec(data=1).build(jax.devices()[:1]), Layout.data_parallel()),
        "data 8": (MeshSpec(data=NUM_DEVICES).build(), Layout.data_parallel()),
        "fsdp 8": (MeshSpec(data=1, fsdp=NUM_DEVICES).build(), Layout.fsdp(min_shard=1024)),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 rounds (a smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 5; quick 2)")
    parser.add_argument(
        "--mesh",
        action="append",
        choices=list(MESHES),
        help="measure only this mesh (repeatable; default all)",
    )
    parser.add_argument(
        "--slices",
        type=int,
        default=None,
        help="canonical slices a batch (trainer.invariant_slices; default the batch size: one sequence each)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)
    if jax.device_count() != NUM_DEVICES:
        raise SystemExit(
            f"invariant_step.py needs {NUM_DEVICES} devices, JAX sees {jax.device_count()}: run it in a fresh "
            f"process with XLA_FLAGS=--xla_force_host_platform_device_count={NUM_DEVICES}"
        )
    setup = QUICK if args.quick else Setup()
    rounds = args.rounds or (2 if args.quick else 5)
    slices = args.slices or setup.batch_size
    if setup.batch_size % slices or slices & (slices - 1):
        raise SystemExit(
            f"--slices {slices}: give a power of two that divides the batch ({setup.batch_size})"
        )
    if slices % NUM_DEVICES and set(args.mesh or MESHES) != {"1 device"}:
        raise SystemExit(
            f"--slices {slices} does not spread over {NUM_DEVICES} devices: add --mesh '1 device'"
        )
    result: dict[str, Any] = {
        "benchmark": "invariant_step",
        "setup": asdict(setup),
        "rounds": rounds,
        "slices": slices,
    }
    rows: dict[str, dict[str, Any]] = {}
    ratios: dict[str, float] = {}
    print(f"setup {asdict(setup)}, {rounds} rounds, {slices} canonical slices")
    print(f"{'arm':>20} {'step (s)':>9} {'compile (s)':>12} {'temp MB/device':>15} {'args MB/device':>15}")
    for mesh_name, (mesh, layout) in meshes().items():
        if args.mesh and mesh_name not in args.mesh:
            continue
        arms = [Arm(mesh_name, mesh, layout, setup, invariant, args.slices) for invariant in (False, True)]
        for arm in arms:
            arm.run(timed=False)  # warm-up
        for index in range(rounds):
            for arm in arms if index % 2 == 0 else arms[::-1]:
                arm.run()
        today, invariant = arms
        for arm in arms:
            rows[arm.name] = arm.row()
            print(
                f"{arm.name:>20} {statistics.median(arm.seconds):9.3f} {arm.compile_seconds:12.2f} "
                f"{arm.temp_bytes / 2**20:15.2f} {arm.argument_bytes / 2**20:15.2f}"
            )
        key = mesh_name.replace(" ", "_")
        ratios[f"{key}_step_time"] = statistics.median(invariant.seconds) / statistics.median(today.seconds)
        ratios[f"{key}_temp_bytes"] = invariant.temp_bytes / max(today.temp_bytes, 1)
        del arms, today, invariant  # free this mesh's states before the next
    invariant_losses = [row["losses"] for name, row in rows.items() if name.endswith("invariant")]
    today_losses = [row["losses"] for name, row in rows.items() if name.endswith("today")]
    result.update(
        arms=rows,
        ratios=ratios,
        worst_step_time_ratio=max(value for name, value in ratios.items() if name.endswith("step_time")),
        invariant_losses_bitwise_equal=all(losses == invariant_losses[0] for losses in invariant_losses),
        today_losses_bitwise_equal=all(losses == today_losses[0] for losses in today_losses),
        goals={"worst_step_time_ratio": 1.10},
    )
    for name, value in ratios.items():
        goal = " (goal <= 1.10)" if name.endswith("step_time") else ""
        print(f"invariant / today {name}: {value:.3f}{goal}")
    print(f"invariant losses bitwise equal on the 3 meshes: {result['invariant_losses_bitwise_equal']}")
    print(f"today's losses bitwise equal on the 3 meshes: {result['today_losses_bitwise_equal']}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
