"""A ~1B Llama training step on one accelerator: tokens/s and MFU per remat policy and attention kernel.

The model is the ``llama-1b`` built-in config's (Llama 3.2 1B shapes: 16 layers, hidden 2048, GQA 32/8,
vocab 128256, tied; 1.24B parameters) with float32 parameters and bfloat16 compute, trained with the
trainer's own step (`train_step.trainer_step`: `make_train_step`, `lm_loss_fn`, AdamW, the state
donated) on random tokens at seq 2048. For each remat policy (``none``, ``save_dots``) and attention
implementation (``xla``, ``cudnn``, ``blocked``):

1. the largest batch that fits: XLA's memory analysis of the compiled step (arguments + outputs +
   temporaries - donated aliases) at batch 1 and at a first guess gives the bytes per sequence; the
   batch predicted to fill the device's memory limit is compiled and kept if it fits (2-3 compiles);
2. ``--steps`` timed steps after a warm-up step (each waits for its loss): the median step gives tokens/s
   and MFU = model FLOPs (`flops_per_token`, remat recomputation not counted) / step / the device's
   bfloat16 peak (`halyard.train.perf.device_peak_flops`: the vendor table; measured on CPU).

A kernel the device cannot run (``cudnn`` off NVIDIA GPUs) is reported as skipped; one that fails is
reported with its error and makes the exit status 1, the others still run. The table is printed and
written to ``benchmarks/results/gpu_llama.json`` and ``gpu_llama.md``.

``--cpu-smoke`` runs the same code at tiny size on the CPU (2 layers, hidden 64, seq 64, a 64 MiB
memory limit for the batch search), which the test suite does. Usage (via ``benchmarks/training/gpu.sh``)::

    bash benchmarks/training/gpu.sh                          # the 1B Llama on the first GPU
    bash benchmarks/training/gpu.sh --remat save_dots --attention cudnn --steps 5
    bash benchmarks/training/gpu.sh --cpu-smoke              # tiny, on CPU, seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import draccus
import jax
import jax.numpy as jnp
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from train_step import trainer_step

from halyard.models import ModelConfig
from halyard.models.attention.cudnn import has_nvidia_gpu
from halyard.train.config.files import builtin_config_path
from halyard.train.perf.peaks import device_peak_flops

RESULTS = Path(__file__).resolve().parents[1] / "results"
REMATS = ("none", "save_dots")
ATTENTIONS = ("xla", "cudnn", "blocked")
SMOKE_SIZES = {
    "num_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "num_kv_heads": 2,
    "head_dim": 16, "vocab_size": 512,
}  # fmt: skip
MEMORY_HEADROOM = 0.92
"""Fraction of the device's memory limit a step may plan to use (allocator fragmentation, cuDNN workspaces)."""


def llama_1b(cpu_smoke: bool) -> Any:
    """The ``llama-1b`` built-in model config (tiny sizes with ``cpu_smoke``), f32 params, bf16 compute."""
    section = yaml.safe_load(builtin_config_path("llama-1b").read_text())["model"]  # type: ignore[union-attr]
    config = draccus.decode(ModelConfig, section)
    config = config.replace(param_dtype="float32", compute_dtype="bfloat16")
    return config.replace(**SMOKE_SIZES) if cpu_smoke else config


def step_bytes(compiled: Any) -> int:
    """Device bytes a compiled step needs: arguments + outputs + temporaries - donated (aliased) buffers."""
    memory = compiled.memory_analysis()
    return int(
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        + memory.temp_size_in_bytes
        - memory.alias_size_in_bytes
    )


def compile_step(config: Any, batch_size: int, seq_len: int) -> tuple[Any, Any, float]:
    """``(compiled step, init(key), compile seconds)`` for ``batch_size`` sequences of ``seq_len`` tokens."""
    step, init = trainer_step(config)
    abstract_state = jax.eval_shape(init, jax.random.key(0))
    tokens = jax.ShapeDtypeStruct((batch_size, seq_len + 1), jnp.int32)
    start = time.perf_counter()
    compiled = step.lower(abstract_state, {"tokens": tokens}).compile()
    return compiled, init, time.perf_counter() - start


def largest_batch(
    config: Any, seq_len: int, limit_bytes: int, max_batch: int
) -> tuple[int, Any, Any, float, int]:
    """The largest batch whose compiled step fits in ``limit_bytes``: ``(batch, compiled, init, compile s, bytes)``.

    The bytes a step needs grow linearly with the batch. Batch 1 gives a first guess (everything beyond the
    state counted per sequence, an over-estimate: gradients and optimizer temporaries do not grow); the
    guess's own compile gives the second point of the line, whose prediction is compiled and kept if it
    fits (else the largest batch checked that fits).

    Raises:
        MemoryError: not even one sequence fits.
    """
    compiled, init, seconds = compile_step(config, 1, seq_len)
    needed = step_bytes(compiled)
    if needed > limit_bytes:
        raise MemoryError(f"one sequence of {seq_len} tokens needs {needed / 2**30:.1f} GiB, over the limit")
    fits = {1: (compiled, needed)}
    state_bytes = compiled.memory_analysis().argument_size_in_bytes
    guess = min(max_batch, max(1, int((limit_bytes - state_bytes) // max(needed - state_bytes, 1))))
    for _ in range(4):
        if guess in fits or guess < 1:
            break
        candidate, init, candidate_seconds = compile_step(config, guess, seq_len)
        seconds += candidate_seconds
        candidate_bytes = step_bytes(candidate)
        if candidate_bytes <= limit_bytes:
            fits[guess] = (candidate, candidate_bytes)
        # The line through batch 1 and this batch, solved for the limit.
        per_sequence = max((candidate_bytes - needed) / (guess - 1), 1.0)
        predicted = int(1 + (limit_bytes - needed) // per_sequence)
        largest_fit = max(fits)
        guess = min(max_batch, predicted if predicted > largest_fit else guess - 1)
        if guess <= largest_fit:
            break
    batch = max(fits)
    return batch, fits[batch][0], init, seconds, fits[batch][1]


def measure(config: Any, seq_len: int, limit_bytes: int, max_batch: int, steps: int, peak: float) -> dict:
    """One table row: the largest batch, its compile time and memory, the median step, tokens/s, MFU."""
    batch, compiled, init, compile_seconds, planned = largest_batch(config, seq_len, limit_bytes, max_batch)
    state = jax.jit(init)(jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (batch, seq_len + 1)), jnp.int32)
    seconds, losses = [], []
    for index in range(steps + 1):
        start = time.perf_counter()
        state, metrics = compiled(state, {"tokens": tokens})
        losses.append(float(metrics["loss"]))  # waits for the step
        if index:  # the first step is a warm-up
            seconds.append(time.perf_counter() - start)
    del state
    median = statistics.median(seconds)
    tokens_per_second = batch * seq_len / median
    return {
        "status": "ok",
        "batch_size": batch,
        "tokens_per_step": batch * seq_len,
        "compile_seconds": compile_seconds,
        "planned_bytes": planned,
        "step_seconds": seconds,
        "step_seconds_median": median,
        "tokens_per_second": tokens_per_second,
        "mfu": config.flops_per_token(seq_len) * tokens_per_second / peak,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


def device_memory_limit(device: jax.Device, override_mib: int | None) -> int:
    """Bytes a step may use: ``override_mib``, else the device's limit (``memory_stats``) x headroom.

    Raises:
        SystemExit: the device reports no memory limit (CPU) and none was given.
    """
    if override_mib is not None:
        return override_mib * 2**20
    stats = device.memory_stats() or {}
    if "bytes_limit" not in stats:
        raise SystemExit(f"{device.device_kind} reports no memory limit: pass --memory-limit-mib")
    return int(stats["bytes_limit"] * MEMORY_HEADROOM)


def markdown_table(result: dict) -> str:
    """The rows as a Markdown table (what benchmarks/README.md quotes)."""
    lines = [
        f"{result['model']} on {result['device']}, seq {result['seq_len']}, peak {result['peak']}",
        "",
        "| remat | attention | batch | tokens/s | MFU | step (s) | compile (s) | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        if row["status"] == "ok":
            lines.append(
                f"| {row['remat']} | {row['attention']} | {row['batch_size']} | {row['tokens_per_second']:.0f} "
                f"| {100 * row['mfu']:.1f}% | {row['step_seconds_median']:.3f} | {row['compile_seconds']:.1f} | ok |"
            )
        else:
            lines.append(f"| {row['remat']} | {row['attention']} | | | | | | {row['status']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (a smoke test)")
    parser.add_argument("--remat", nargs="+", choices=REMATS, default=list(REMATS))
    parser.add_argument("--attention", nargs="+", choices=ATTENTIONS, default=list(ATTENTIONS))
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (2048; smoke 64)")
    parser.add_argument("--max-batch", type=int, default=None, help="largest batch tried (256; smoke 4)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (10; smoke 2)")
    parser.add_argument("--memory-limit-mib", type=int, default=None, help="instead of the device's limit")
    parser.add_argument("--output", type=Path, default=RESULTS / "gpu_llama.json")
    args = parser.parse_args(argv)

    device = jax.devices()[0]
    if not args.cpu_smoke and device.platform == "cpu":
        raise SystemExit(
            "gpu.sh: JAX sees no accelerator (backend 'cpu'). Install the GPU extra "
            "(pip install -e 'packages/train[gpu]', i.e. jax[cuda12]) or run with --cpu-smoke"
        )
    seq_len = args.seq_len or (64 if args.cpu_smoke else 2048)
    max_batch = args.max_batch or (4 if args.cpu_smoke else 256)
    steps = args.steps or (2 if args.cpu_smoke else 10)
    memory_mib = args.memory_limit_mib or (64 if args.cpu_smoke else None)
    limit = device_memory_limit(device, memory_mib)
    peak = device_peak_flops(device, "bfloat16")
    base = llama_1b(args.cpu_smoke)
    print(f"{device.device_kind}: {peak.describe()}; step memory limit {limit / 2**30:.2f} GiB")
    print(f"model: {base.num_params() / 1e9:.3f}B parameters, seq {seq_len}, f32 params, bf16 compute")

    rows = []
    for remat in args.remat:
        for attention in args.attention:
            row: dict[str, Any] = {"remat": remat, "attention": attention}
            if attention == "cudnn" and not has_nvidia_gpu():
                row["status"] = f"skipped: cuDNN attention needs an NVIDIA GPU ({device.platform})"
            else:
                config = base.replace(remat=remat, attention_implementation=attention)
                try:
                    row.update(measure(config, seq_len, limit, max_batch, steps, peak.flops_per_second))
                except Exception as error:  # reported in the table; the other configurations still run
                    row["status"] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}"
                gc.collect()
            rows.append(row)
            detail = (
                f"batch {row['batch_size']}, {row['tokens_per_second']:.0f} tokens/s, MFU "
                f"{100 * row['mfu']:.1f}%, step {row['step_seconds_median']:.3f} s"
                if row["status"] == "ok"
                else row["status"]
            )
            print(f"remat {remat:>9}, attention {attention:>7}: {detail}", flush=True)

    result = {
        "benchmark": "gpu_llama",
        "cpu_smoke": args.cpu_smoke,
        "model": "llama-1b" + (" (smoke sizes)" if args.cpu_smoke else ""),
        "num_params": base.num_params(),
        "flops_per_token": base.flops_per_token(seq_len),
        "seq_len": seq_len,
        "device": device.device_kind,
        "device_count": jax.device_count(),
        "peak": peak.describe(),
        "peak_flops_per_second": peak.flops_per_second,
        "memory_limit_bytes": limit,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, jax {jax.__version__}",
        "rows": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    table = markdown_table(result)
    args.output.with_suffix(".md").write_text(table)
    print("\n" + table + f"wrote {args.output} and {args.output.with_suffix('.md')}")
    return 1 if any(row["status"].startswith("failed") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
