"""Compile time of a deep `Stacked` (scan over layers) vs a shallow one.

Builds the training-step program (loss, forward and backward with respect to all parameters) of a stack
of pre-norm transformer blocks (RMSNorm, causal self-attention, SiLU MLP) written with
``halyard.named.nn``, for 2 and for 24 layers, and measures:

- compile seconds: ``jax.jit(step).lower(...).compile()`` (tracing, lowering, XLA compilation) of a
  fresh function each repeat, after one discarded warm-up compilation, depths alternating; the ratio
  (24 / 2 layers, goal <= 1.5) uses the fastest repeat of each, the least disturbed by other work;
- first-step seconds: compilation plus the first step, what a user waits for at start-up (parameter
  initialisation is reported separately as init seconds).

Compile times are also given in process CPU seconds (compilation is mostly single-threaded), which a
busy machine distorts less than wall-clock seconds.

With ``--unrolled`` the same is measured for `BlockSeq` (a Python loop), to show what scan saves.

Usage::

    python benchmarks/training/stacked_compile.py           # embed 256, seq 128, 2 vs 24 layers, 3 repeats
    python benchmarks/training/stacked_compile.py --quick   # tiny shapes, 1 repeat, seconds

Results are printed and written as JSON (``--output``, default benchmarks/results/stacked_compile.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from halyard.named import Axis, NamedArray
from halyard.named.nn import (
    REMAT_POLICIES,
    BlockSeq,
    Linear,
    RMSNorm,
    Stacked,
    causal_mask,
    dot_product_attention,
    silu,
)

RESULTS = Path(__file__).resolve().parents[1] / "results" / "stacked_compile.json"


class Block(eqx.Module):
    """A Llama-style block: RMSNorm, attention, RMSNorm, gated SiLU MLP."""

    attention_norm: RMSNorm
    qkv: Linear
    attention_out: Linear
    mlp_norm: RMSNorm
    gate_up: Linear
    down: Linear

    @classmethod
    def init(cls, Embed: Axis, Heads: Axis, HeadSize: Axis, Mlp: Axis, *, key: jax.Array) -> Block:
        keys = jax.random.split(key, 4)
        return cls(
            RMSNorm.init(Embed),
            Linear.init(Embed, (Axis("qkv", 3), Heads, HeadSize), key=keys[0], use_bias=False),
            Linear.init((Heads, HeadSize), Embed, key=keys[1], use_bias=False),
            RMSNorm.init(Embed),
            Linear.init(Embed, (Axis("gate_up", 2), Mlp), key=keys[2], use_bias=False),
            Linear.init(Mlp, Embed, key=keys[3], use_bias=False),
        )

    def __call__(self, x: NamedArray, mask: NamedArray) -> NamedArray:
        qkv = self.qkv(self.attention_norm(x))
        query, key, value = (qkv["qkv", i] for i in range(3))
        x = x + self.attention_out(dot_product_attention(query, key, value, mask))
        gate_up = self.gate_up(self.mlp_norm(x))
        return x + self.down(silu(gate_up["gate_up", 0]) * gate_up["gate_up", 1])


def build(num_layers: int, sizes: dict[str, int], remat: str, unrolled: bool) -> tuple[Any, Any, NamedArray]:
    """(step function, stack, input) for ``num_layers`` layers; the step is not jitted yet."""
    Embed, Mlp = Axis("embed", sizes["embed"]), Axis("mlp", sizes["mlp"])
    Heads, HeadSize = Axis("heads", sizes["heads"]), Axis("head_size", sizes["embed"] // sizes["heads"])
    Pos = Axis("pos", sizes["seq_len"])
    kind = BlockSeq if unrolled else Stacked
    stack = kind.init(
        Axis("layers", num_layers), Block, Embed, Heads, HeadSize, Mlp, key=jax.random.PRNGKey(0), remat=remat
    )
    x = NamedArray(
        jax.random.normal(jax.random.PRNGKey(1), (sizes["batch"], Pos.size, Embed.size)),
        (Axis("batch", sizes["batch"]), Pos, Embed),
    )
    mask = causal_mask(Pos, Pos.alias("key_pos"))

    def loss(stack: Any, x: NamedArray) -> jax.Array:
        return jnp.mean(jnp.square(stack.fold(x, mask).array))

    return jax.value_and_grad(loss), jax.block_until_ready(stack), x


def compile_and_run(step: Any, stack: Any, x: NamedArray) -> tuple[float, float, float, float]:
    """(compile seconds, compile CPU seconds, first-step seconds, second-step seconds) of a fresh jit."""
    fresh = jax.jit(lambda stack, x: step(stack, x))  # a new function: no cached executable
    start, cpu_start = time.perf_counter(), time.process_time()
    compiled = fresh.lower(stack, x).compile()
    compiled_at, compile_cpu = time.perf_counter(), time.process_time() - cpu_start
    jax.block_until_ready(compiled(stack, x))
    first_done = time.perf_counter()
    jax.block_until_ready(compiled(stack, x))
    return compiled_at - start, compile_cpu, first_done - start, time.perf_counter() - first_done


def measure(depths: dict[str, int], sizes: dict[str, int], remat: str, unrolled: bool, repeats: int) -> dict:
    """Compile and first-step times per depth, measured in alternating order after one warm-up."""
    built: dict[str, tuple[Any, Any, NamedArray, float]] = {}
    for name, num_layers in depths.items():
        start = time.perf_counter()
        step, stack, x = build(num_layers, sizes, remat, unrolled)
        built[name] = (step, stack, x, time.perf_counter() - start)
    compile_and_run(*built["shallow"][:3])  # warm-up: the first compilation in a process is slower
    results: dict[str, Any] = {
        name: {
            "num_layers": n,
            "init_seconds": built[name][3],
            "compile_seconds": [],
            "compile_cpu_seconds": [],
            "first_step_seconds": [],
        }
        for name, n in depths.items()
    }
    for _ in range(repeats):
        for name in depths:
            compile_seconds, compile_cpu, first_step, next_step = compile_and_run(*built[name][:3])
            results[name]["compile_seconds"].append(compile_seconds)
            results[name]["compile_cpu_seconds"].append(compile_cpu)
            results[name]["first_step_seconds"].append(first_step)
            results[name]["step_seconds"] = next_step
    for entry in results.values():
        entry["compile_seconds_min"] = min(entry["compile_seconds"])
        entry["compile_cpu_seconds_min"] = min(entry["compile_cpu_seconds"])
        entry["first_step_seconds_min"] = min(entry["first_step_seconds"])
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one repeat (a smoke test)")
    parser.add_argument("--shallow", type=int, default=2, help="layers of the shallow stack")
    parser.add_argument("--deep", type=int, default=24, help="layers of the deep stack")
    parser.add_argument("--remat", default="full", choices=REMAT_POLICIES, help="remat policy of the stack")
    parser.add_argument(
        "--repeats", type=int, default=None, help="compilations per depth (default 3; quick 1)"
    )
    parser.add_argument("--unrolled", action="store_true", help="also measure BlockSeq (unrolled loop)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)

    if args.quick:
        sizes = {"batch": 1, "seq_len": 8, "embed": 16, "heads": 2, "mlp": 32}
    else:
        sizes = {"batch": 2, "seq_len": 128, "embed": 256, "heads": 4, "mlp": 768}
    repeats = args.repeats or (1 if args.quick else 3)
    kinds = [("stacked", False)] + ([("unrolled", True)] if args.unrolled else [])

    result: dict[str, Any] = {
        "benchmark": "stacked_compile",
        "sizes": sizes,
        "remat": args.remat,
        "backend": jax.default_backend(),
        "goal_ratio": 1.5,
        "quick": args.quick,
    }
    for kind, unrolled in kinds:
        timings = measure({"shallow": args.shallow, "deep": args.deep}, sizes, args.remat, unrolled, repeats)
        shallow, deep = timings["shallow"], timings["deep"]
        ratio = deep["compile_seconds_min"] / shallow["compile_seconds_min"]
        cpu_ratio = deep["compile_cpu_seconds_min"] / shallow["compile_cpu_seconds_min"]
        result[kind] = {**timings, "compile_ratio": ratio, "compile_cpu_ratio": cpu_ratio}
        print(
            f"{kind}: compile {args.shallow} layers {shallow['compile_seconds_min']:.2f} s, "
            f"{args.deep} layers {deep['compile_seconds_min']:.2f} s; first step (compile + run) "
            f"{shallow['first_step_seconds_min']:.2f} s vs {deep['first_step_seconds_min']:.2f} s; then "
            f"{shallow['step_seconds'] * 1e3:.1f} ms vs {deep['step_seconds'] * 1e3:.1f} ms per step; "
            f"init {shallow['init_seconds']:.2f} s vs {deep['init_seconds']:.2f} s"
        )
        print(
            f"{kind}: compile ratio {args.deep}/{args.shallow} layers: {ratio:.2f} wall, {cpu_ratio:.2f} CPU "
            f"(goal <= 1.5)"
        )
    result["ratio"] = result["stacked"]["compile_ratio"]
    result["cpu_ratio"] = result["stacked"]["compile_cpu_ratio"]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
