"""Checkpoint save speed: orbax checkpoints through `CheckpointManager` vs plain file writes of the same bytes.

Measures, in one run on one disk:

1. raw sequential write bandwidth: every leaf's bytes written with plain ``write`` calls, then ``fsync``;
2. a synchronous checkpoint save (``save(..., wait=True)``) of the same state: params plus the two AdamW
   moments in f32 (~100M parameters each by default, 1.2 GB in all), reported as a ratio to (1) (goal
   >= 0.5);
3. the stall of an asynchronous save: how long ``save()`` blocks the training loop (the device-to-host
   copy and the bookkeeping, not the serialization or the writing), as a fraction of (2) (goal <= 0.10);
4. the slowdown of the training steps that run while the checkpoint is written in the background: a
   loop of jitted matmul steps (``1536 x 1536``, using every core) runs before, during and after an
   asynchronous save; the median step during the write over the median step outside it (goal <= 1.10).
   Measured with the manager's default writer priority (nice 19, see
   `halyard.train.checkpoint.writer_priority`) and with the writers at normal priority (nice 0), each
   trial in a fresh process (a thread's priority cannot be raised back), the two alternating.

Beside (4), two baselines run the same step loop while one thread writes the same bytes with plain
``write`` calls into new files (one per leaf, then ``fsync``), at the writers' priority (nice 19 and
``SCHED_IDLE``): once in whole-leaf calls (16 MiB) and once in 256 KiB calls. They show what any buffered
write of these bytes from one low-priority thread costs the steps on this machine, i.e. the part of (4)
that no checkpoint format can remove.

What bounds (4): the write's CPU time, almost all of it in the kernel (copying into the page cache and
allocating its pages: the CPU time of the raw write in (1) is printed, per GB). A low-priority thread
only gets a core the steps leave idle, but a kernel built without preemption (``preempt=none``) finishes
the part of a write call it is in before it gives the core back. On a VM that hands free memory back to
its host (free page reporting), every fresh page of the page cache costs a host fault, which makes that
kernel work several times longer: ``fresh memory`` prints the time to touch memory freed a few seconds
ago over memory freed just now.

Usage::

    python benchmarks/checkpoints/checkpoint_save.py            # ~100M parameters
    python benchmarks/checkpoints/checkpoint_save.py --quick    # ~2M parameters, seconds
    python benchmarks/checkpoints/checkpoint_save.py --trials 3 # more alternating concurrent-step trials

Results are printed and written as JSON (``--output``, default benchmarks/results/checkpoint_save.json).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from halyard.train.checkpoint.manager import CheckpointManager
from halyard.train.checkpoint.writer_priority import IDLE_NICENESS, LowPriorityWriters


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


def raw_write_seconds(state: dict, directory: Path) -> tuple[float, float, int]:
    """Write every leaf's bytes to one file with plain writes and fsync: ``(seconds, CPU seconds, bytes)``."""
    host_leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(state) if hasattr(leaf, "shape")]
    path = directory / "raw.bin"
    cpu_before = process_cpu_seconds()
    start = time.perf_counter()
    with open(path, "wb") as handle:
        for leaf in host_leaves:
            handle.write(memoryview(leaf).cast("B"))
        handle.flush()
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - start
    cpu_seconds = process_cpu_seconds() - cpu_before
    path.unlink()
    return seconds, cpu_seconds, sum(leaf.nbytes for leaf in host_leaves)


def process_cpu_seconds() -> float:
    """User + system CPU time of this process, all threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sync_save_seconds(state: dict, directory: Path, step: int) -> float:
    with CheckpointManager(directory) as manager:
        start = time.perf_counter()
        manager.save(step, state, {"benchmark": True}, wait=True)
        return time.perf_counter() - start


def steps_around_write(quick: bool, start_write: Callable[[], Callable[[], bool]]) -> dict[str, Any]:
    """Time matmul steps before, during and after a background write.

    Args:
        quick: small steps (``384 x 384``) instead of ``1536 x 1536``.
        start_write: starts the write and returns a callable that says whether it is still in progress.

    Returns the start call's duration (the loop's stall), the write's duration (start to done), the step
    durations in each phase and the median step during / outside the write.
    """
    step_fn = jax.jit(lambda x: jnp.tanh(x @ x) * 0.5)
    work = jax.random.normal(jax.random.key(1), (384, 384) if quick else (1536, 1536))
    jax.block_until_ready(step_fn(work))

    def timed_step() -> float:
        nonlocal work
        start = time.perf_counter()
        work = jax.block_until_ready(step_fn(work))
        return time.perf_counter() - start

    outside_steps = 10 if quick else 30
    before = [timed_step() for _ in range(outside_steps)]
    start = time.perf_counter()
    in_progress = start_write()
    save_call_seconds = time.perf_counter() - start
    during = []
    while in_progress():
        during.append(timed_step())
    write_seconds = time.perf_counter() - start
    after = [timed_step() for _ in range(outside_steps)]
    outside = statistics.median(before + after)
    return {
        "save_call_seconds": save_call_seconds,
        "write_seconds": write_seconds,
        "steps_before": before,
        "steps_during": during,
        "steps_after": after,
        "median_step_outside_write": outside,
        "median_step_during_write": statistics.median(during) if during else outside,
        "step_slowdown_during_write": (statistics.median(during) / outside) if during else 1.0,
        "load_average_1min": os.getloadavg()[0],
    }


def concurrent_steps_trial(quick: bool, directory: Path, niceness: int) -> dict[str, Any]:
    """Steps around one asynchronous checkpoint save of the benchmark state, writers at ``niceness``."""
    state = make_state(*(SHAPES_QUICK if quick else SHAPES_FULL))
    with CheckpointManager(directory / "warmup", writer_niceness=niceness) as manager:
        manager.save(0, make_state(1, 64), wait=True)  # orbax and TensorStore start-up, outside the trial
    manager = CheckpointManager(directory / "async", writer_niceness=niceness)

    def start_save() -> Callable[[], bool]:
        manager.save(1, state, {"benchmark": True})
        return lambda: manager.in_progress_step is not None

    try:
        return {"writer_niceness": niceness, **steps_around_write(quick, start_save)}
    finally:
        manager.close()


def plain_write_trial(quick: bool, directory: Path, write_bytes: int) -> dict[str, Any]:
    """Steps around a plain write of the benchmark state's bytes, ``write_bytes`` per call, at nice 19 + idle.

    One thread writes each leaf into a new file (unbuffered ``write`` calls, then ``fsync``) with the
    checkpoint writers' default priority: the floor for any buffered write of these bytes.
    """
    state = make_state(*(SHAPES_QUICK if quick else SHAPES_FULL))
    host_leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(state) if hasattr(leaf, "shape")]
    done = threading.Event()

    def write_leaves() -> None:
        with LowPriorityWriters(IDLE_NICENESS):  # lowers this thread as well
            for index, leaf in enumerate(host_leaves):
                data = memoryview(leaf).cast("B")
                with open(directory / f"leaf_{index}.bin", "wb", buffering=0) as handle:
                    for offset in range(0, len(data), write_bytes):
                        handle.write(data[offset : offset + write_bytes])
                    os.fsync(handle.fileno())
        done.set()

    def start_write() -> Callable[[], bool]:
        threading.Thread(target=write_leaves, name="plain-writer", daemon=True).start()
        return lambda: not done.is_set()

    return {"write_bytes": write_bytes, **steps_around_write(quick, start_write)}


def fresh_memory_seconds(megabytes: int, wait_seconds: float) -> tuple[float, float]:
    """Seconds to touch ``megabytes`` of new memory right after freeing as much, and ``wait_seconds`` after.

    On a VM with free page reporting, memory free for a while has gone back to the host, and touching it
    again costs a host fault per page (the page cache of a new file is such memory).
    """
    count = megabytes * 2**20 // 8

    def touch_seconds() -> float:
        start = time.perf_counter()
        buffer = np.ones(count)
        seconds = time.perf_counter() - start
        del buffer
        return seconds

    touch_seconds()
    right_away = touch_seconds()
    time.sleep(wait_seconds)
    return right_away, touch_seconds()


def run_trial_in_child(quick: bool, directory: Path, trial: str) -> dict[str, Any]:
    """One trial in a fresh Python process (its threads start at normal priority).

    Args:
        trial: ``nice:N`` (a checkpoint save with writers at nice N) or ``plain:BYTES`` (`plain_write_trial`).
    """
    command = [sys.executable, __file__, "--child-trial", trial, "--dir", str(directory)]
    completed = subprocess.run(
        command + (["--quick"] if quick else []), capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        raise RuntimeError(f"trial {trial} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def child_trial(quick: bool, directory: Path, trial: str) -> dict[str, Any]:
    kind, value = trial.split(":")
    if kind == "nice":
        return concurrent_steps_trial(quick, directory, int(value))
    return plain_write_trial(quick, directory, int(value))


SHAPES_QUICK = (8, 512)
SHAPES_FULL = (24, 2048)
NICENESS_COMPARED = (19, 0)
"""The manager's default writer priority, and normal priority (what the write costs the steps)."""
PLAIN_WRITE_BYTES = (16 * 2**20, 256 * 2**10)
"""Write-call sizes of the plain-write baselines: a whole leaf of the full state, and 256 KiB."""
FRESH_MEMORY_WAIT = 3.0
"""Seconds memory stays free before it is touched again in the fresh-memory probe (> the 2 s after which
Linux's free page reporting hands free memory back to a VM's host)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~2M parameters instead of ~100M")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary dir)")
    parser.add_argument("--trials", type=int, default=None, help="concurrent-step trials per priority (2)")
    parser.add_argument("--child-trial", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "results" / "checkpoint_save.json",
    )
    args = parser.parse_args()
    if args.child_trial is not None:
        child_dir = Path(tempfile.mkdtemp(prefix="trial_", dir=args.dir))
        try:
            print(json.dumps(child_trial(args.quick, child_dir, args.child_trial)))
        finally:
            shutil.rmtree(child_dir, ignore_errors=True)
        return

    state = make_state(*(SHAPES_QUICK if args.quick else SHAPES_FULL))
    work_dir = Path(tempfile.mkdtemp(prefix="halyard_checkpoint_bench_", dir=args.dir))
    trials: dict[int, list[dict[str, Any]]] = {niceness: [] for niceness in NICENESS_COMPARED}
    plain: dict[int, list[dict[str, Any]]] = {size: [] for size in PLAIN_WRITE_BYTES}
    try:
        raw_seconds, raw_cpu_seconds, num_bytes = raw_write_seconds(state, work_dir)
        sync_save_seconds(state, work_dir / "warmup", 0)  # first save pays orbax/tensorstore start-up costs
        sync_seconds = min(sync_save_seconds(state, work_dir / f"sync_{i}", 1) for i in range(2))
        cpu_before = process_cpu_seconds()
        sync_save_seconds(state, work_dir / "sync_cpu", 1)
        sync_cpu_seconds = process_cpu_seconds() - cpu_before
        del state  # the children build their own
        fresh_right_away, fresh_after_wait = fresh_memory_seconds(
            64 if args.quick else 512, FRESH_MEMORY_WAIT
        )
        for _ in range(args.trials or (1 if args.quick else 2)):
            for niceness in NICENESS_COMPARED:
                trials[niceness].append(run_trial_in_child(args.quick, work_dir, f"nice:{niceness}"))
            for size in PLAIN_WRITE_BYTES:
                plain[size].append(run_trial_in_child(args.quick, work_dir, f"plain:{size}"))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)

    default = trials[NICENESS_COMPARED[0]]
    stall_seconds = statistics.median(trial["save_call_seconds"] for trial in default)
    summary = {
        niceness: {
            "step_slowdown_during_write": statistics.median(t["step_slowdown_during_write"] for t in rows),
            "write_seconds": statistics.median(t["write_seconds"] for t in rows),
            "save_call_seconds": statistics.median(t["save_call_seconds"] for t in rows),
            "steps_during_write": statistics.median(len(t["steps_during"]) for t in rows),
        }
        for niceness, rows in trials.items()
    }
    plain_summary = {
        size: {
            "step_slowdown_during_write": statistics.median(t["step_slowdown_during_write"] for t in rows),
            "write_seconds": statistics.median(t["write_seconds"] for t in rows),
        }
        for size, rows in plain.items()
    }
    num_layers, width = SHAPES_QUICK if args.quick else SHAPES_FULL
    num_parameters = num_layers * width * width
    result = {
        "quick": args.quick,
        "num_parameters": int(num_parameters),
        "state_bytes": int(num_bytes),
        "raw_write_seconds": raw_seconds,
        "raw_write_cpu_seconds": raw_cpu_seconds,
        "raw_write_cpu_seconds_per_gb": raw_cpu_seconds / (num_bytes / 1e9),
        "raw_write_gb_per_second": num_bytes / raw_seconds / 1e9,
        "sync_save_seconds": sync_seconds,
        "checkpoint_gb_per_second": num_bytes / sync_seconds / 1e9,
        "checkpoint_to_raw_bandwidth_ratio": raw_seconds / sync_seconds,
        "sync_save_cpu_seconds": sync_cpu_seconds,
        "async_save_call_seconds": stall_seconds,
        "async_stall_seconds": stall_seconds,
        "async_stall_fraction_of_sync_save": stall_seconds / sync_seconds,
        "step_slowdown_during_write": summary[NICENESS_COMPARED[0]]["step_slowdown_during_write"],
        "by_writer_niceness": {str(niceness): row for niceness, row in summary.items()},
        "trials": {str(niceness): rows for niceness, rows in trials.items()},
        "plain_write_by_bytes_per_call": {str(size): row for size, row in plain_summary.items()},
        "plain_write_trials": {str(size): rows for size, rows in plain.items()},
        "fresh_memory_seconds": {"right_away": fresh_right_away, "after_wait": fresh_after_wait},
        "fresh_memory_wait_seconds": FRESH_MEMORY_WAIT,
        "fresh_memory_cost_ratio": fresh_after_wait / fresh_right_away,
        "load_average_1min": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
        "jax_backend": jax.default_backend(),
    }
    print(f"state: {num_parameters / 1e6:.1f}M parameters x 3 (params, mu, nu), {num_bytes / 1e9:.2f} GB")
    print(
        f"raw write + fsync:        {raw_seconds:7.2f} s  {result['raw_write_gb_per_second']:.2f} GB/s, "
        f"{result['raw_write_cpu_seconds_per_gb']:.2f} CPU s per GB"
    )
    print(f"checkpoint save (sync):   {sync_seconds:7.2f} s  {result['checkpoint_gb_per_second']:.2f} GB/s")
    print(f"bandwidth ratio checkpoint/raw: {result['checkpoint_to_raw_bandwidth_ratio']:.2f}  (goal >= 0.5)")
    print(f"CPU time of one sync save (all threads): {sync_cpu_seconds:.2f} s on {os.cpu_count()} cores")
    for niceness, rows in trials.items():
        for trial in rows:
            print(
                f"writers at nice {niceness:>2}: save() blocked {trial['save_call_seconds']:.3f} s; write took "
                f"{trial['write_seconds']:6.2f} s; {len(trial['steps_during'])} steps during it, median "
                f"{1e3 * trial['median_step_during_write']:.1f} ms vs {1e3 * trial['median_step_outside_write']:.1f}"
                f" ms outside: x{trial['step_slowdown_during_write']:.3f} (load {trial['load_average_1min']:.1f})"
            )
    for size, rows in plain.items():
        for trial in rows:
            print(
                f"plain write, {size / 2**20:g} MiB calls, nice 19 + idle: write took {trial['write_seconds']:6.2f} s; "
                f"{len(trial['steps_during'])} steps during it: x{trial['step_slowdown_during_write']:.3f} "
                f"(load {trial['load_average_1min']:.1f})"
            )
    print(
        f"fresh memory ({64 if args.quick else 512} MiB): touched {FRESH_MEMORY_WAIT:g} s after a free "
        f"{fresh_after_wait:.3f} s, right after {fresh_right_away:.3f} s: x{result['fresh_memory_cost_ratio']:.1f}"
    )
    print(
        f"async stall (save() call) / sync save: {result['async_stall_fraction_of_sync_save']:.1%}  (goal <= 10%)"
    )
    for niceness, row in summary.items():
        print(
            f"steps during the write / outside it, writers at nice {niceness}: "
            f"{row['step_slowdown_during_write']:.3f}"
            + ("  (goal <= 1.10)" if niceness == NICENESS_COMPARED[0] else "")
        )
    for size, row in plain_summary.items():
        print(
            f"steps during a plain write of the same bytes in {size / 2**20:g} MiB calls (nice 19 + idle): "
            f"{row['step_slowdown_during_write']:.3f}"
        )
    print(f"1-minute load average at the end: {result['load_average_1min']:.2f} ({os.cpu_count()} CPUs)")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
