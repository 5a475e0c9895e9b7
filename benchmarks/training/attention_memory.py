"""Peak memory of attention forward+backward: `blocked` vs `reference` (and `xla`) at one shape.

Each implementation's training step (values and gradients of q, k, v, the attention inside a 2-layer
scan as the decoder runs it) is compiled for the same shapes
and XLA's compiled memory analysis is read: temporaries plus arguments plus outputs is the peak the
program needs. Nothing runs at full size unless ``--run`` is given, so the quadratic reference costs only
its compile time. The goal is ``blocked / reference <= 1/4`` at sequence length 8192.

Usage::

    python benchmarks/training/attention_memory.py            # seq 8192, batch 1, 2 heads (1 kv head), head_size 32
    python benchmarks/training/attention_memory.py --quick    # seq 1024, seconds
    python benchmarks/training/attention_memory.py --run      # also execute blocked once and report its wall time

Results are printed and written as JSON (``--output``, default benchmarks/results/attention_memory.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from halyard.models.attention import AttentionMask, attention
from halyard.named import Axis, NamedArray

IMPLEMENTATIONS = ("reference", "xla", "blocked")


def training_step(implementation: str, block_size: int, layers: int = 2):
    """``(q, k, v) -> (dq, dk, dv)`` of ``sum(attention(...))`` under a causal mask, the attention run in a
    ``lax.scan`` over ``layers`` (each scaling the queries by its own weight), as the decoder's layer stack
    runs it: a scan hoists out whatever depends on the mask alone, which a kernel must not let grow with
    the number of block pairs."""

    def loss(query: NamedArray, key: NamedArray, value: NamedArray) -> jax.Array:
        def layer(carry: jax.Array, weight: jax.Array) -> tuple[jax.Array, None]:
            output = attention(
                NamedArray(query.array * weight, query.axes),
                key,
                value,
                AttentionMask(causal=True),
                implementation=implementation,
                block_size=block_size,
            )
            return carry + jnp.sum(output.array.astype(jnp.float32)), None

        total, _ = jax.lax.scan(layer, jnp.zeros((), jnp.float32), jnp.linspace(0.5, 1.0, layers))
        return total

    return jax.grad(loss, argnums=(0, 1, 2))


def abstract_inputs(batch: int, seq: int, heads: int, kv_heads: int, head_size: int, dtype: str) -> tuple:
    """Shape-only NamedArrays (no memory is allocated to compile)."""

    def spec(*axes: Axis) -> NamedArray:
        return NamedArray(jax.ShapeDtypeStruct(tuple(a.size for a in axes), jnp.dtype(dtype)), axes)

    Batch, Heads, KvHeads, HeadSize = (
        Axis("batch", batch),
        Axis("heads", heads),
        Axis("kv_heads", kv_heads),
        Axis("head_size", head_size),
    )
    return (
        spec(Batch, Axis("pos", seq), Heads, HeadSize),
        spec(Batch, Axis("key_pos", seq), KvHeads, HeadSize),
        spec(Batch, Axis("key_pos", seq), KvHeads, HeadSize),
    )


def measure(implementation: str, inputs: tuple, block_size: int) -> dict:
    """Compile one implementation's training step and read XLA's memory analysis (bytes)."""
    start = time.perf_counter()
    compiled = jax.jit(training_step(implementation, block_size)).lower(*inputs).compile()
    analysis = compiled.memory_analysis()
    temp = int(analysis.temp_size_in_bytes)
    arguments = int(analysis.argument_size_in_bytes)
    outputs = int(analysis.output_size_in_bytes)
    aliased = int(getattr(analysis, "alias_size_in_bytes", 0))
    return {
        "temp_bytes": temp,
        "argument_bytes": arguments,
        "output_bytes": outputs,
        "peak_bytes": temp + arguments + outputs - aliased,
        "compile_seconds": round(time.perf_counter() - start, 2),
        "compiled": compiled,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--head-size", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quick", action="store_true", help="sequence length 1024")
    parser.add_argument("--run", action="store_true", help="also execute the blocked step once")
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "results" / "attention_memory.json",
    )
    args = parser.parse_args(argv)
    seq = 1024 if args.quick else args.seq
    inputs = abstract_inputs(args.batch, seq, args.heads, args.kv_heads, args.head_size, args.dtype)
    results = {name: measure(name, inputs, args.block_size) for name in IMPLEMENTATIONS}
    reference_peak = results["reference"]["peak_bytes"]
    print(
        f"attention forward+backward, causal, batch {args.batch}, seq {seq}, heads {args.heads} "
        f"(kv {args.kv_heads}), head_size {args.head_size}, {args.dtype}, block {args.block_size}"
    )
    print(f"{'implementation':<12} {'peak MiB':>10} {'temp MiB':>10} {'/ reference':>12} {'compile s':>10}")
    for name, result in results.items():
        ratio = result["peak_bytes"] / reference_peak
        result["ratio_to_reference"] = round(ratio, 4)
        print(
            f"{name:<12} {result['peak_bytes'] / 2**20:>10.1f} {result['temp_bytes'] / 2**20:>10.1f} "
            f"{ratio:>12.4f} {result['compile_seconds']:>10.1f}"
        )
    blocked_ratio = results["blocked"]["ratio_to_reference"]
    print(
        f"blocked / reference peak memory: {blocked_ratio:.4f} (goal <= 0.25: {'met' if blocked_ratio <= 0.25 else 'NOT met'})"
    )
    if args.run:
        concrete = [
            NamedArray(jax.random.normal(jax.random.key(i), x.array.shape, x.array.dtype), x.axes)
            for i, x in enumerate(inputs)
        ]
        compiled = results["blocked"]["compiled"]
        jax.block_until_ready(compiled(*concrete))
        start = time.perf_counter()
        jax.block_until_ready(compiled(*concrete))
        results["blocked"]["run_seconds"] = round(time.perf_counter() - start, 3)
        print(f"blocked step ran in {results['blocked']['run_seconds']} s")
    report = {
        "shape": {
            "batch": args.batch,
            "seq": seq,
            "heads": args.heads,
            "kv_heads": args.kv_heads,
            "head_size": args.head_size,
            "dtype": args.dtype,
            "block_size": args.block_size,
        },
        "backend": jax.default_backend(),
        "implementations": {
            name: {k: v for k, v in r.items() if k != "compiled"} for name, r in results.items()
        },
        "blocked_to_reference_peak_ratio": blocked_ratio,
        "goal": "blocked_to_reference_peak_ratio <= 0.25",
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
