"""FSDP vs data parallelism on 8 simulated CPU devices: step time and per-device training-state memory.

The GPT-2 benchmark model (6 layers, hidden 512, 8 heads, seq 256, batch 8, vocab 8192, AdamW, f32) is
trained with the trainer's code path (`make_train_step` + `lm_loss_fn`, the state created directly in
its sharded layout and donated, the batch assembled with `global_batch_from_local`) under two layouts of
`halyard.shard` on the same 8 devices:

- ``data_parallel``: ``MeshSpec(data=8)``, every weight replicated;
- ``fsdp``: ``MeshSpec(data=1, fsdp=8)``, weights and AdamW moments split along their first dividing axis.

Reported, each as a ratio measured in this run:

- step time FSDP / DP (medians of alternating steps; on one CPU the 8 "devices" share the cores, so the
  all-gathers and reduce-scatters of FSDP are pure overhead here: the figure bounds the cost, not a
  speed-up);
- per-device bytes of params + optimizer state: FSDP / unsharded (the bytes of device 0's shards over the
  bytes of the whole state; goal about 1/8 = 0.125), checked against the compiled step's
  ``memory_analysis()`` (argument bytes per device).

Usage::

    python benchmarks/parallelism/scaling.py            # benchmark model, 5 rounds
    python benchmarks/parallelism/scaling.py --quick    # tiny model, 2 rounds (a smoke test)

The script sets ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` itself when JAX is not yet loaded.
Results are printed and written as JSON (``--output``, default benchmarks/results/scaling.json).
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
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from halyard.models import model_config
from halyard.shard import Layout, MeshSpec, global_batch_from_local, use_layout
from halyard.train.objectives.lm_loss import lm_loss_fn
from halyard.train.optim.config import AdamWConfig
from halyard.train.optim.schedule_config import ConstantScheduleConfig
from halyard.train.step import TrainState, init_state, make_train_step

RESULTS = Path(__file__).resolve().parents[1] / "results" / "scaling.json"
NUM_DEVICES = 8


@dataclass(frozen=True)
class Setup:
    num_layers: int = 6
    hidden_size: int = 512
    num_heads: int = 8
    seq_len: int = 256
    batch_size: int = 8
    vocab_size: int = 8192


QUICK = Setup(num_layers=2, hidden_size=128, num_heads=4, seq_len=32, batch_size=8, vocab_size=512)


def state_bytes(state: Any) -> tuple[int, int]:
    """``(bytes of the whole state, bytes device 0 holds)`` over every array leaf."""
    total = device0 = 0
    first = jax.devices()[0]
    for leaf in jax.tree.leaves(state):
        if not isinstance(leaf, jax.Array):
            continue
        total += leaf.size * leaf.dtype.itemsize
        device0 += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == first)
    return total, device0


class Arm:
    """One layout: its mesh, sharded state, compiled step and timings."""

    def __init__(self, name: str, layout: Layout, mesh_spec: MeshSpec, setup: Setup, constrain: bool) -> None:
        self.name = name
        self.mesh = mesh_spec.build()
        self.layout = layout
        config = model_config(
            "gpt2",
            vocab_size=setup.vocab_size,
            hidden_size=setup.hidden_size,
            num_layers=setup.num_layers,
            num_heads=setup.num_heads,
            max_position=setup.seq_len,
        )
        optimizer = AdamWConfig(schedule=ConstantScheduleConfig(warmup=0.0)).build(total_steps=1000)

        def make_state(key: jax.Array) -> TrainState:
            return init_state(config.init(key), optimizer, key)

        key = jax.random.PRNGKey(0)
        abstract = jax.eval_shape(make_state, key)
        shardings = layout.shardings(abstract, self.mesh)
        self.state = jax.jit(make_state, out_shardings=shardings)(key)
        self.total_bytes, self.device_bytes = state_bytes(self.state)
        tokens = np.random.default_rng(0).integers(0, setup.vocab_size, (setup.batch_size, setup.seq_len + 1))
        self.batch = global_batch_from_local({"tokens": tokens.astype(np.int32)}, self.mesh, layout=layout)
        step = jax.jit(
            make_train_step(lm_loss_fn(), optimizer), donate_argnums=0, out_shardings=(shardings, None)
        )
        start = time.perf_counter()
        if constrain:
            with use_layout(layout, self.mesh):
                compiled = step.lower(self.state, self.batch).compile()
        else:
            compiled = step.lower(self.state, self.batch).compile()
        self.compile_seconds = time.perf_counter() - start
        memory = compiled.memory_analysis()
        self.argument_bytes = int(getattr(memory, "argument_size_in_bytes", 0)) if memory else 0
        self.temp_bytes = int(getattr(memory, "temp_size_in_bytes", 0)) if memory else 0
        self.step = compiled
        self.seconds: list[float] = []
        self.losses: list[float] = []

    def run(self, timed: bool = True) -> None:
        start = time.perf_counter()
        self.state, metrics = self.step(self.state, self.batch)
        self.losses.append(float(metrics["loss"]))
        if timed:
            self.seconds.append(time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 rounds (a smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 5; quick 2)")
    parser.add_argument(
        "--no-constrain", action="store_true", help="compile without `use_layout` (no activation constraints)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)
    if jax.device_count() != NUM_DEVICES:
        raise SystemExit(
            f"scaling.py needs {NUM_DEVICES} devices, JAX sees {jax.device_count()}: run it in a fresh process "
            f"with XLA_FLAGS=--xla_force_host_platform_device_count={NUM_DEVICES}"
        )
    setup = QUICK if args.quick else Setup()
    rounds = args.rounds or (2 if args.quick else 5)
    constrain = not args.no_constrain
    arms = [
        Arm("data_parallel", Layout.data_parallel(), MeshSpec(data=NUM_DEVICES), setup, constrain),
        Arm(
            "fsdp",
            Layout.fsdp(min_shard=1024 if args.quick else 2**16),
            MeshSpec(data=1, fsdp=NUM_DEVICES),
            setup,
            constrain,
        ),
    ]
    for arm in arms:
        arm.run(timed=False)  # warm-up
    for index in range(rounds):
        for arm in arms if index % 2 == 0 else arms[::-1]:
            arm.run()
    dp, fsdp = arms
    for arm in arms:
        if not np.allclose(arm.losses, dp.losses, rtol=1e-3):
            raise SystemExit(f"{arm.name} losses {arm.losses} differ from data parallel's {dp.losses}")

    rows = {
        arm.name: {
            "step_seconds_median": statistics.median(arm.seconds),
            "step_seconds": arm.seconds,
            "compile_seconds": arm.compile_seconds,
            "state_bytes_total": arm.total_bytes,
            "state_bytes_per_device": arm.device_bytes,
            "compiled_argument_bytes_per_device": arm.argument_bytes,
            "compiled_temp_bytes_per_device": arm.temp_bytes,
        }
        for arm in arms
    }
    ratios = {
        "fsdp_over_dp_step_time": rows["fsdp"]["step_seconds_median"]
        / rows["data_parallel"]["step_seconds_median"],
        "fsdp_state_bytes_per_device_over_unsharded": fsdp.device_bytes / fsdp.total_bytes,
        "fsdp_over_dp_compiled_argument_bytes": fsdp.argument_bytes / max(dp.argument_bytes, 1),
    }
    result = {
        "benchmark": "scaling",
        "setup": asdict(setup),
        "devices": NUM_DEVICES,
        "activation_constraints": constrain,
        "quick": args.quick,
        "rounds": rounds,
        "layouts": rows,
        "ratios": ratios,
        "goals": {"fsdp_state_bytes_per_device_over_unsharded": 1 / NUM_DEVICES},
    }
    print(f"setup {asdict(setup)} on {NUM_DEVICES} simulated CPU devices, {rounds} rounds")
    print(
        f"{'layout':>14} {'step (s)':>9} {'compile (s)':>12} {'state MB/device':>16} {'args MB/device':>15}"
    )
    for name, row in rows.items():
        print(
            f"{name:>14} {row['step_seconds_median']:9.3f} {row['compile_seconds']:12.2f} "
            f"{row['state_bytes_per_device'] / 2**20:16.2f} {row['compiled_argument_bytes_per_device'] / 2**20:15.2f}"
        )
    print(f"fsdp_over_dp_step_time: {ratios['fsdp_over_dp_step_time']:.3f} (report)")
    print(
        "fsdp_state_bytes_per_device_over_unsharded: "
        f"{ratios['fsdp_state_bytes_per_device_over_unsharded']:.4f} (goal about {1 / NUM_DEVICES:.3f})"
    )
    print(f"fsdp_over_dp_compiled_argument_bytes: {ratios['fsdp_over_dp_compiled_argument_bytes']:.4f}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
