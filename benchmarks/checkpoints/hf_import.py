"""Hugging Face import/export of a ~100M-parameter GPT-2: time and peak host memory vs the model's bytes.

A transformers ``GPT2LMHeadModel`` (12 layers, hidden 768, vocab 32768: ~111M parameters, f32) is saved
as a safetensors folder. Then, each in a fresh process (so the peak memory belongs to that step alone):

- ``import_sharded``: `halyard.export.import_hf` into an FSDP layout on 8 simulated CPU devices
  (``MeshSpec(data=1, fsdp=8)``, ``Layout.fsdp()``): every device's block is read from the memory-mapped file;
- ``import_unsharded``: `import_hf` onto one device;
- ``export``: `halyard.export.export_hf` of the sharded model back to a safetensors folder (the child
  imports the model first, then returns the import's freed heap to the OS with ``malloc_trim`` before
  the baseline, so that the export's allocations cannot hide in memory the import freed).

Memory is the process's anonymous resident memory (``RssAnon`` of /proc/self/status, sampled every
2 ms): memory-mapped file pages are page cache, not memory the import allocated. On CPU the "devices"
live in host memory too, so the imported model's own bytes are part of the peak; the figure the goal is
about is the transient extra beyond them:

    transient = peak RssAnon - RssAnon before the import - bytes of the imported parameters
    goal: transient < 1.5 x the largest single tensor (sharded import)

Usage::

    python benchmarks/checkpoints/hf_import.py            # ~111M parameters
    python benchmarks/checkpoints/hf_import.py --quick    # ~2M parameters (a smoke test)

Results are printed and written as JSON (``--output``, default benchmarks/results/hf_import.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "hf_import.json"
FULL = {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 32768, "n_positions": 1024}
QUICK = {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 4096, "n_positions": 256}
GOAL = 1.5


def anonymous_resident_bytes() -> int:
    """This process's anonymous resident memory (``RssAnon``), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no RssAnon line (Linux only)")


def release_freed_heap() -> None:
    """Return memory freed earlier in this process to the OS (glibc ``malloc_trim``), so that a later
    step's allocations raise ``RssAnon`` instead of silently reusing the freed heap; no-op elsewhere."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakSampler:
    """Samples `anonymous_resident_bytes` in a thread; ``peak`` is the largest value seen."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak = anonymous_resident_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, anonymous_resident_bytes())
            time.sleep(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, anonymous_resident_bytes())


def write_hf_folder(folder: Path, sizes: dict[str, int]) -> dict[str, int]:
    """Save a randomly initialised transformers GPT-2 of ``sizes``; returns parameter count and tensor bytes."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**sizes, bos_token_id=0, eos_token_id=0))
    model.save_pretrained(folder, safe_serialization=True)
    tensors = {name: p.numel() * p.element_size() for name, p in model.state_dict().items()}
    return {
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "largest_tensor_bytes": max(tensors.values()),
    }


def measure(step: str, folder: Path, export_folder: Path) -> dict[str, Any]:
    """Run one step in this (fresh) process and return its time and memory figures."""
    import jax

    from halyard.export import export_hf, import_hf
    from halyard.shard import Layout, MeshSpec

    jax.numpy.zeros(1).block_until_ready()  # start the backend before the baseline
    sharded = step in ("import_sharded", "export")
    mesh = MeshSpec(data=1, fsdp=8).build() if sharded else None
    layout = Layout.fsdp(min_shard=1024) if sharded else None
    if step == "export":
        _, model = import_hf(folder, layout=layout, mesh=mesh)
        jax.block_until_ready(model)
        release_freed_heap()  # the import's freed transient memory would otherwise hide the export's
    baseline = anonymous_resident_bytes()
    start = time.perf_counter()
    with PeakSampler() as sampler:
        if step == "export":
            export_hf(model, export_folder, overwrite=True)
        else:
            _, model = import_hf(folder, layout=layout, mesh=mesh)
            jax.block_until_ready(model)
    seconds = time.perf_counter() - start
    parameter_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model))
    return {
        "seconds": seconds,
        "baseline_bytes": baseline,
        "peak_bytes": sampler.peak,
        "peak_over_baseline_bytes": sampler.peak - baseline,
        "imported_parameter_bytes": parameter_bytes,
    }


def run_child(step: str, folder: Path, export_folder: Path) -> dict[str, Any]:
    environment = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    command = [
        sys.executable,
        __file__,
        "--child",
        step,
        "--folder",
        str(folder),
        "--export-folder",
        str(export_folder),
    ]
    completed = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"{step} failed:\n{completed.stdout[-3000:]}{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~2M parameters (a smoke test)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON result")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--export-folder", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.folder, args.export_folder)))
        return {}

    sizes = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="halyard-hf-import-") as work:
        folder, export_folder = Path(work) / "hf", Path(work) / "exported"
        start = time.perf_counter()
        model_info = write_hf_folder(folder, sizes)
        write_seconds = time.perf_counter() - start
        steps = {
            step: run_child(step, folder, export_folder)
            for step in ("import_sharded", "import_unsharded", "export")
        }
    largest = model_info["largest_tensor_bytes"]
    for name, row in steps.items():
        # An import's peak includes the imported parameters themselves (device memory is host memory here).
        resident = row["imported_parameter_bytes"] if name.startswith("import") else 0
        row["transient_bytes"] = row["peak_over_baseline_bytes"] - resident
    ratios = {
        "sharded_import_transient_over_largest_tensor": steps["import_sharded"]["transient_bytes"] / largest,
        "unsharded_import_transient_over_largest_tensor": steps["import_unsharded"]["transient_bytes"]
        / largest,
        "export_peak_extra_over_largest_tensor": steps["export"]["transient_bytes"] / largest,
        "sharded_import_seconds_per_gb": steps["import_sharded"]["seconds"]
        / (model_info["model_bytes"] / 1e9),
    }
    result = {
        "benchmark": "hf_import",
        "quick": args.quick,
        "sizes": sizes,
        **model_info,
        "hf_write_seconds": write_seconds,
        "steps": steps,
        "ratios": ratios,
        "goal": f"sharded_import_transient_over_largest_tensor < {GOAL}",
    }
    mib = 2**20
    print(
        f"GPT-2 {sizes}: {model_info['num_parameters'] / 1e6:.1f}M parameters, {model_info['model_bytes'] / mib:.0f} MiB, "
        f"largest tensor {largest / mib:.0f} MiB"
    )
    print(f"{'step':>17} {'seconds':>8} {'peak-baseline MiB':>18} {'transient MiB':>14} {'/ largest':>10}")
    for name, row in steps.items():
        print(
            f"{name:>17} {row['seconds']:8.2f} {row['peak_over_baseline_bytes'] / mib:18.1f} "
            f"{row['transient_bytes'] / mib:14.1f} {row['transient_bytes'] / largest:10.2f}"
        )
    value = ratios["sharded_import_transient_over_largest_tensor"]
    print(
        f"sharded import transient / largest tensor: {value:.2f} (goal < {GOAL}: {'met' if value < GOAL else 'NOT met'})"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
