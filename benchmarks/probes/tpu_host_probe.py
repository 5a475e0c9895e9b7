"""What a start costs on a host, apart from the model: the Python interpreter's speed, the accelerator runtime's
start under the settings that may change it, and tracing the engine's step programs (in the main thread, in
a thread, with the garbage collector off). Run on the TPU's host and on a CPU, the figures side by side say
whether the chip's host is slow in general or slow at some thing.

Parts, each in a fresh process where it starts a runtime:

- ``python``: a fixed pure-Python workload (no JAX), in the main thread and in a second thread.
- ``start``: ``import jax``, ``jax.devices()``, 1 GiB put on the device and a 2 GiB ``jnp.zeros`` program, once
  per environment in `START_VARIANTS` (libtpu's premapped host buffer, its metadata-server query); with
  ``--log-dir``, the runtime's own log of the default start.
- ``load``: a Hugging Face folder (``--folder``, e.g. `serve_first_request.py`'s) loaded as ``halyard serve``
  loads it (`halyard.serve.server.host_transfer.size_host_buffer`, then `halyard.serve.server.load_hf_folder`),
  once per environment in `LOAD_VARIANTS`: the runtime's start and the weights' put, which both depend on the
  premapped buffer's size.
- ``trace``: the engine's decode program of one page traced and lowered (Qwen2.5-0.5B's shape, bf16, its
  vocabulary cut to 4,096), after `jax.clear_caches` each time, in the main thread, in a thread, with the
  garbage collector off; then once under cProfile (``--log-dir``: its 40 largest entries). On a CPU the
  programs are built as for a v5e (`tpu_aot_programs.py`).

Usage::

    python benchmarks/probes/tpu_host_probe.py --log-dir /tmp/probe            # every part
    python benchmarks/probes/tpu_host_probe.py --parts python trace

Results: printed, and JSON (``--output``, default benchmarks/results/tpu_host_probe.json).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "tpu_host_probe.json"
START_VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "default_again": {},
    "skip_metadata_query": {"TPU_SKIP_MDS_QUERY": "1"},
    "premapped_256MiB": {"TPU_PREMAPPED_BUFFER_SIZE": str(256 * 2**20)},
    "premapped_1GiB": {"TPU_PREMAPPED_BUFFER_SIZE": str(2**30)},
    "premapped_256MiB_skip_query": {"TPU_PREMAPPED_BUFFER_SIZE": str(256 * 2**20), "TPU_SKIP_MDS_QUERY": "1"},
}
LOAD_VARIANTS: dict[str, dict[str, str]] = {
    "sized_for_the_folder": {},
    "premapped_4GiB": {"TPU_PREMAPPED_BUFFER_SIZE": str(4 * 2**30)},
    "premapped_1GiB": {"TPU_PREMAPPED_BUFFER_SIZE": str(2**30)},
}
"""The buffer as ``halyard serve`` sizes it for the folder (`size_host_buffer`), and as set by hand."""
LOAD_CHILD = """
import json, sys, time
began = time.perf_counter()
import jax
from halyard.serve.server.host_transfer import size_host_buffer
from halyard.serve.server.loading import load_hf_folder
imported = time.perf_counter()
buffer = size_host_buffer(sys.argv[1])
jax.devices()
started = time.perf_counter()
served = load_hf_folder(sys.argv[1])
jax.block_until_ready(served.model)
loaded = time.perf_counter()
print(json.dumps(dict(import_=imported - began, buffer=buffer, devices=started - imported, load=loaded - started)))
"""
START_CHILD = """
import json, time
began = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np
imported = time.perf_counter()
device = jax.devices()[0]
started = time.perf_counter()
host = np.ones((512, 1024, 1024), np.uint16)
made = time.perf_counter()
jax.device_put(host, device).block_until_ready()
put = time.perf_counter()
jax.jit(lambda: jnp.zeros((1024, 1024, 1024), jnp.bfloat16))().block_until_ready()
zeros = time.perf_counter()
print(json.dumps(dict(platform=device.platform, import_jax=imported - began, devices=started - imported,
                      put_1GiB=put - made, zeros_2GiB=zeros - put)))
"""


def python_workload() -> int:
    """A fixed amount of interpreter work: calls, dicts, strings, attribute lookups."""
    total = 0
    for i in range(400_000):
        entry: dict[str, Any] = {"value": i, "name": str(i)}
        total += len(entry["name"]) + entry["value"] % 7
    return total


def timed(work: Callable[[], Any], *, in_thread: bool = False) -> float:
    """Seconds ``work`` takes, in this thread or in a new one."""
    if not in_thread:
        began = time.perf_counter()
        work()
        return time.perf_counter() - began
    seconds: list[float] = []
    thread = threading.Thread(target=lambda: seconds.append(timed(work)))
    thread.start()
    thread.join()
    return seconds[0]


def python_part() -> dict[str, Any]:
    """The interpreter's speed, main thread and a second thread (best of 3 each)."""
    return dict(
        main_thread=min(timed(python_workload) for _ in range(3)),
        second_thread=min(timed(python_workload, in_thread=True) for _ in range(3)),
    )


def start_part(log_dir: Path | None) -> dict[str, Any]:
    """The runtime's start in a fresh process per `START_VARIANTS` entry."""
    return in_children(START_CHILD, [], START_VARIANTS, log_dir)


def in_children(
    child: str, argv: list[str], variants: dict[str, dict[str, str]], log_dir: Path | None
) -> dict[str, Any]:
    """``child`` (code printing one JSON line last) run in a fresh process per entry of ``variants`` (its
    environment's additions); with ``log_dir``, the runtime's log of the ``default`` one."""
    results: dict[str, Any] = {}
    for name, extra in variants.items():
        env = {**os.environ, **extra}
        logged = log_dir is not None and name == "default"
        if logged:
            env.update(TPU_STDERR_LOG_LEVEL="0", TPU_MIN_LOG_LEVEL="0")
        done = subprocess.run([sys.executable, "-c", child, *argv], env=env, capture_output=True, text=True)
        if logged and log_dir is not None:
            (log_dir / f"runtime_start_{name}.log").write_text(done.stderr)
        lines = done.stdout.strip().splitlines()
        results[name] = (
            json.loads(lines[-1]) if done.returncode == 0 and lines else {"error": done.stderr[-800:]}
        )
        print(name, results[name], flush=True)
    return results


def trace_part(log_dir: Path | None) -> dict[str, Any]:
    """Tracing and lowering the decode program of one page under each condition (module docstring)."""
    import jax

    sys.path.insert(0, str(Path(__file__).parent))
    import tpu_aot_programs

    on_tpu = jax.default_backend() == "tpu"
    step, arguments, devices = tpu_aot_programs.decode_program("1,1,1", chip=on_tpu)

    def trace_and_lower() -> tuple[float, float]:
        jax.clear_caches()
        began = time.perf_counter()
        with jax.default_device(devices[0]):
            traced = step.trace(*arguments[0], **arguments[1])
            traced_at = time.perf_counter()
            traced.lower()
        return traced_at - began, time.perf_counter() - traced_at

    def in_thread() -> tuple[float, float]:
        found: list[tuple[float, float]] = []
        thread = threading.Thread(target=lambda: found.append(trace_and_lower()))
        thread.start()
        thread.join()
        return found[0]

    def gc_off() -> tuple[float, float]:
        gc.collect()
        gc.disable()
        try:
            return trace_and_lower()
        finally:
            gc.enable()

    results: dict[str, Any] = {"backend": jax.default_backend()}
    for name, run in (("main", trace_and_lower), ("thread", in_thread), ("gc_off", gc_off)):
        runs = [run() for _ in range(2)]
        results[name] = dict(trace=[r[0] for r in runs], lower=[r[1] for r in runs])
        print(name, results[name], flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    results["profiled"] = trace_and_lower()
    profiler.disable()
    if log_dir is not None:
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(40)
        (log_dir / f"trace_profile_{jax.default_backend()}.txt").write_text(text.getvalue())
    return results


def host_facts() -> dict[str, Any]:
    """The host's CPU model, cores and the environment's TPU settings."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    tpu_env = {k: v for k, v in os.environ.items() if k.startswith(("TPU_", "JAX_", "XLA_", "LIBTPU"))}
    return dict(cpu=model, cores=os.cpu_count(), affinity=len(os.sched_getaffinity(0)), env=tpu_env)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["python", "start", "trace"])
    parser.add_argument("--log-dir", type=Path, default=None)
    parser.add_argument("--folder", type=Path, default=None, help="the Hugging Face folder of ``load``")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), host=host_facts())
    print(results, flush=True)
    if "python" in args.parts:
        results["python"] = python_part()
        print("python", results["python"], flush=True)
    if "start" in args.parts:
        results["start"] = start_part(args.log_dir)
    if "load" in args.parts:
        results["load"] = in_children(LOAD_CHILD, [str(args.folder)], LOAD_VARIANTS, None)
    if "trace" in args.parts:
        results["trace"] = trace_part(args.log_dir)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
