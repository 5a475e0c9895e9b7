"""Checkpoint save speed: orbax checkpoints through `CheckpointManager` vs plain file writes of the same bytes.

Measures, in one run on one disk:

1. raw sequential write bandwidth: every leaf's bytes written with plain ``write`` calls, then ``fsync``;
2. a synchronous checkpoint save (``save(..., wait=True)``) of the same state: params plus the two AdamW
   moments in f32 (~100M parameters each by default, 1.2 GB in all), reported as a ratio to (1) (goal
   >= 0.5);
3. the training-loop stall of an asynchronous save: a loop of jitted matmul steps is timed without a save
   (before and after, averaged) and with an asynchronous save started at its first step; the extra time divided by the synchronous save
   duration is the stall fraction (goal < 10%). On a machine with few cores the background write competes
   with the training computation for the CPU, which this number includes; the CPU time of a save is
   printed too (on a machine with spare cores, or a GPU doing the training, that CPU is free).

Usage::

    python benchmarks/checkpoint_save.py            # ~100M parameters
    python benchmarks/checkpoint_save.py --quick    # ~2M parameters, seconds

Results are printed and written as JSON (``--output``, default benchmarks/results/checkpoint_save.json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from halyard.train.checkpoint import CheckpointManager


def make_state(num_layers: int, width: int) -> dict:
    """Params and two Adam moments: ``num_layers`` f32 matrices of ``width x width`` in each."""
    key = jax.random.key(0)
    params = {
        f"layer_{i}": jax.random.normal(jax.random.fold_in(key, i), (width, width)) for i in range(num_layers)
    }
    mu = jax.tree.map(lambda leaf: leaf * 0.1, params)
    nu = jax.tree.map(lambda leaf: leaf * leaf, params)
    state = {"params": params, "opt_state": {"mu": mu, "nu": nu}, "step": 1}
    jax.block_until_ready(state)
    return state


def raw_write_seconds(state: dict, directory: Path) -> tuple[float, int]:
    """Write every leaf's bytes to one file with plain writes, fsync, and time it (host copy excluded)."""
    host_leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(state) if hasattr(leaf, "shape")]
    path = directory / "raw.bin"
    start = time.perf_counter()
    with open(path, "wb") as handle:
        for leaf in host_leaves:
            handle.write(memoryview(leaf).cast("B"))
        handle.flush()
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - start
    path.unlink()
    return seconds, sum(leaf.nbytes for leaf in host_leaves)


def process_cpu_seconds() -> float:
    """User + system CPU time of this process, all threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sync_save_seconds(state: dict, directory: Path, step: int) -> float:
    with CheckpointManager(directory) as manager:
        start = time.perf_counter()
        manager.save(step, state, {"benchmark": True}, wait=True)
        return time.perf_counter() - start


def training_loop_seconds(num_steps: int, work: jax.Array, save: Callable[[], None] | None) -> float:
    """Time ``num_steps`` jitted matmul steps; ``save`` (if any) is called after the first step."""
    step_fn = jax.jit(lambda x: jnp.tanh(x @ x) * 0.5)
    jax.block_until_ready(step_fn(work))  # compile outside the timing
    start = time.perf_counter()
    for step in range(num_steps):
        work = step_fn(work)
        jax.block_until_ready(work)
        if step == 0 and save is not None:
            save()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~2M parameters instead of ~100M")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary dir)")
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).parent / "results" / "checkpoint_save.json"
    )
    args = parser.parse_args()

    num_layers, width = (8, 512) if args.quick else (24, 2048)
    state = make_state(num_layers, width)
    work_dir = Path(tempfile.mkdtemp(prefix="halyard_checkpoint_bench_", dir=args.dir))
    try:
        raw_seconds, num_bytes = raw_write_seconds(state, work_dir)
        sync_save_seconds(state, work_dir / "warmup", 0)  # first save pays orbax/tensorstore start-up costs
        sync_seconds = min(sync_save_seconds(state, work_dir / f"sync_{i}", 1) for i in range(2))

        cpu_before = process_cpu_seconds()
        sync_save_seconds(state, work_dir / "sync_cpu", 1)
        sync_cpu_seconds = process_cpu_seconds() - cpu_before

        work = jax.random.normal(jax.random.key(1), (384, 384) if args.quick else (768, 768))
        step_seconds = training_loop_seconds(3, work, None) / 3
        num_steps = max(10, int(3 * sync_seconds / step_seconds))
        # Alternate baseline and async loops (B A B A ... B) so drifts in machine load hit both alike; each
        # async loop is compared with the mean of the baselines on either side of it.
        baselines = [training_loop_seconds(num_steps, work, None)]
        async_runs: list[dict] = []
        for pair in range(1 if args.quick else 2):
            manager = CheckpointManager(work_dir / f"async_{pair}")
            run: dict = {}

            def start_async_save(manager: CheckpointManager = manager, run: dict = run) -> None:
                start = time.perf_counter()
                manager.save(2, state, {"benchmark": True})
                run["save_call_seconds"] = time.perf_counter() - start

            run["loop_seconds"] = training_loop_seconds(num_steps, work, start_async_save)
            run["still_writing_after_loop"] = manager.in_progress_step is not None
            wait_start = time.perf_counter()
            manager.close()
            run["final_wait_seconds"] = time.perf_counter() - wait_start
            baselines.append(training_loop_seconds(num_steps, work, None))
            baseline = (baselines[-2] + baselines[-1]) / 2
            run["stall_seconds"] = max(0.0, run["loop_seconds"] + run["final_wait_seconds"] - baseline)
            async_runs.append(run)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)

    stall_seconds = float(np.median([run["stall_seconds"] for run in async_runs]))
    num_parameters = sum(leaf.size for leaf in jax.tree.leaves(state["params"]))
    result = {
        "quick": args.quick,
        "num_parameters": int(num_parameters),
        "state_bytes": int(num_bytes),
        "raw_write_seconds": raw_seconds,
        "raw_write_gb_per_second": num_bytes / raw_seconds / 1e9,
        "sync_save_seconds": sync_seconds,
        "checkpoint_gb_per_second": num_bytes / sync_seconds / 1e9,
        "checkpoint_to_raw_bandwidth_ratio": raw_seconds / sync_seconds,
        "sync_save_cpu_seconds": sync_cpu_seconds,
        "training_steps": num_steps,
        "baseline_loop_seconds": baselines,
        "async_runs": async_runs,
        "async_save_call_seconds": max(run["save_call_seconds"] for run in async_runs),
        "async_stall_seconds": stall_seconds,
        "async_stall_fraction_of_sync_save": stall_seconds / sync_seconds,
        "cpu_count": os.cpu_count(),
        "jax_backend": jax.default_backend(),
    }
    print(f"state: {num_parameters / 1e6:.1f}M parameters x 3 (params, mu, nu), {num_bytes / 1e9:.2f} GB")
    print(f"raw write + fsync:        {raw_seconds:7.2f} s  {result['raw_write_gb_per_second']:.2f} GB/s")
    print(f"checkpoint save (sync):   {sync_seconds:7.2f} s  {result['checkpoint_gb_per_second']:.2f} GB/s")
    print(f"bandwidth ratio checkpoint/raw: {result['checkpoint_to_raw_bandwidth_ratio']:.2f}  (goal >= 0.5)")
    print(f"CPU time of one sync save (all threads): {sync_cpu_seconds:.2f} s on {os.cpu_count()} cores")
    for run, before, after in zip(async_runs, baselines, baselines[1:]):
        print(
            f"async save() call blocked {run['save_call_seconds']:.3f} s; {num_steps} steps took "
            f"{run['loop_seconds']:.2f} s (+{run['final_wait_seconds']:.2f} s final wait) vs {before:.2f} / "
            f"{after:.2f} s without a save"
        )
    print(f"async stall / sync save: {result['async_stall_fraction_of_sync_save']:.1%}  (goal < 10%)")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
