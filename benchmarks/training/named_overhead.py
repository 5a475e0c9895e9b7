"""Runtime overhead of halyard.named: a GPT-2-style block written with named axes vs plain JAX.

Both versions compute the same math on the same parameters (f32): pre-LayerNorm causal self-attention
and a GELU (tanh) MLP with residuals, forward and backward (gradients of a scalar loss with respect to
every parameter and the input), each under ``jax.jit``. The named version uses
``halyard.named.nn`` layers (`Linear`, `LayerNorm`, `dot_product_attention`, `causal_mask`); the plain
version is hand-written ``jnp.einsum`` code. Before timing, the outputs and gradients are compared.

Timing alternates the two versions in rounds (named, plain, named, plain, ...) so that load changes on
the machine hit both alike, and reports the ratio of the medians: named / plain (goal <= 1.03).

Usage::

    python benchmarks/training/named_overhead.py           # batch 4, seq 256, embed 256, 4 heads, mlp 1024
    python benchmarks/training/named_overhead.py --quick   # tiny shapes, a few seconds

Results are printed and written as JSON (``--output``, default benchmarks/results/named_overhead.json).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from halyard.named import Axis, NamedArray
from halyard.named.nn import LayerNorm, Linear, causal_mask, dot_product_attention, gelu_new

RESULTS = Path(__file__).resolve().parents[1] / "results" / "named_overhead.json"


@dataclass(frozen=True)
class Shapes:
    batch: int
    seq_len: int
    embed: int
    num_heads: int
    mlp: int


class NamedBlock(eqx.Module):
    """The block with named axes, written the way model code in Halyard reads."""

    ln_attention: LayerNorm
    qkv: Linear
    attention_out: Linear
    ln_mlp: LayerNorm
    mlp_up: Linear
    mlp_down: Linear

    @classmethod
    def init(cls, shapes: Shapes, *, key: jax.Array) -> NamedBlock:
        Embed, Mlp = Axis("embed", shapes.embed), Axis("mlp", shapes.mlp)
        Heads, HeadSize = Axis("heads", shapes.num_heads), Axis("head_size", shapes.embed // shapes.num_heads)
        keys = jax.random.split(key, 4)
        return cls(
            LayerNorm.init(Embed),
            Linear.init(Embed, (Axis("qkv", 3), Heads, HeadSize), key=keys[0], init_std=0.02),
            Linear.init((Heads, HeadSize), Embed, key=keys[1], init_std=0.02),
            LayerNorm.init(Embed),
            Linear.init(Embed, Mlp, key=keys[2], init_std=0.02),
            Linear.init(Mlp, Embed, key=keys[3], init_std=0.02),
        )

    def __call__(self, x: NamedArray, mask: NamedArray) -> NamedArray:
        qkv = self.qkv(self.ln_attention(x))
        query, key, value = (qkv["qkv", i] for i in range(3))
        x = x + self.attention_out(dot_product_attention(query, key, value, mask))
        return x + self.mlp_down(gelu_new(self.mlp_up(self.ln_mlp(x))))


def _layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, -1, keepdims=True)
    centred = x - mean
    variance = jnp.mean(centred * centred, -1, keepdims=True)
    return centred / jnp.sqrt(variance + eps) * weight + bias


def _gelu_tanh(x: jax.Array) -> jax.Array:
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def plain_block(p: dict[str, jax.Array], x: jax.Array, mask: jax.Array) -> jax.Array:
    """The same block on plain arrays: x is (batch, seq, embed), mask (seq, seq)."""
    h = _layer_norm(x, p["ln_attention.weight"], p["ln_attention.bias"])
    qkv = jnp.einsum("bse,ethd->bsthd", h, p["qkv.weight"]) + p["qkv.bias"]
    query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key) / math.sqrt(query.shape[-1])
    scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1)
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, value)
    x = x + jnp.einsum("bqhd,hde->bqe", attended, p["attention_out.weight"]) + p["attention_out.bias"]
    h = _layer_norm(x, p["ln_mlp.weight"], p["ln_mlp.bias"])
    up = _gelu_tanh(h @ p["mlp_up.weight"] + p["mlp_up.bias"])
    return x + up @ p["mlp_down.weight"] + p["mlp_down.bias"]


def plain_params(block: NamedBlock) -> dict[str, jax.Array]:
    """The named block's parameters as plain arrays (their axis orders match the einsums above)."""
    from halyard.named.serialization import to_state_dict

    return {key: jnp.asarray(value) for key, value in to_state_dict(block).items()}


def make_steps(shapes: Shapes) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """Jitted forward+backward steps for both versions, with their inputs bound."""
    block = NamedBlock.init(shapes, key=jax.random.PRNGKey(0))
    params = plain_params(block)
    x_raw = jax.random.normal(jax.random.PRNGKey(1), (shapes.batch, shapes.seq_len, shapes.embed))
    x_named = NamedArray(
        x_raw, (Axis("batch", shapes.batch), Axis("pos", shapes.seq_len), Axis("embed", shapes.embed))
    )
    mask_named = causal_mask(Axis("pos", shapes.seq_len), Axis("key_pos", shapes.seq_len))
    mask_raw = jnp.tril(jnp.ones((shapes.seq_len, shapes.seq_len), bool))

    def named_loss(block: NamedBlock, x: NamedArray) -> jax.Array:
        return jnp.mean(jnp.square(block(x, mask_named).array))

    def plain_loss(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return jnp.mean(jnp.square(plain_block(params, x, mask_raw)))

    named_step = jax.jit(jax.value_and_grad(named_loss, argnums=(0, 1)))
    plain_step = jax.jit(jax.value_and_grad(plain_loss, argnums=(0, 1)))

    named_value, (named_grads, named_grad_x) = named_step(block, x_named)
    plain_value, (plain_grads, plain_grad_x) = plain_step(params, x_raw)
    difference = max(
        float(jnp.max(jnp.abs(named_grad_x.array - plain_grad_x))),
        max(float(jnp.max(jnp.abs(a - plain_grads[k]))) for k, a in plain_params(named_grads).items()),
    )
    scale = float(jnp.max(jnp.abs(plain_grad_x)))
    if not np.isclose(float(named_value), float(plain_value), rtol=1e-4) or difference > 1e-3 * max(
        scale, 1e-6
    ):
        raise SystemExit(
            f"named and plain blocks disagree: loss {float(named_value)} vs {float(plain_value)}, "
            f"largest gradient difference {difference}"
        )
    return (lambda: named_step(block, x_named)), (lambda: plain_step(params, x_raw))


def time_interleaved(
    steps: dict[str, Callable[[], Any]], rounds: int, iterations: int
) -> dict[str, list[float]]:
    """Seconds per step of each function, measured in alternating rounds of ``iterations`` calls."""
    for step in steps.values():
        jax.block_until_ready(step())  # warm-up (compiled already; this warms caches)
    timings: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(iterations):
                result = step()
            jax.block_until_ready(result)
            timings[name].append((time.perf_counter() - start) / iterations)
    return timings


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few rounds (a smoke test)")
    parser.add_argument(
        "--rounds", type=int, default=None, help="alternating timing rounds (default 15; quick 3)"
    )
    parser.add_argument("--iterations", type=int, default=None, help="steps per round (default 5; quick 2)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)

    if args.quick:
        shapes = Shapes(batch=2, seq_len=16, embed=32, num_heads=4, mlp=64)
    else:
        shapes = Shapes(batch=4, seq_len=256, embed=256, num_heads=4, mlp=1024)
    rounds = args.rounds or (3 if args.quick else 15)
    iterations = args.iterations or (2 if args.quick else 5)

    named_step, plain_step = make_steps(shapes)
    timings = time_interleaved({"named": named_step, "plain": plain_step}, rounds, iterations)
    named_median, plain_median = statistics.median(timings["named"]), statistics.median(timings["plain"])
    ratio = named_median / plain_median
    result = {
        "benchmark": "named_overhead",
        "shapes": asdict(shapes),
        "dtype": "float32",
        "backend": jax.default_backend(),
        "rounds": rounds,
        "iterations_per_round": iterations,
        "named_step_seconds_median": named_median,
        "plain_step_seconds_median": plain_median,
        "named_step_seconds": timings["named"],
        "plain_step_seconds": timings["plain"],
        "ratio": ratio,
        "goal": 1.03,
        "quick": args.quick,
    }
    print(f"shapes {asdict(shapes)}, {rounds} rounds x {iterations} steps, backend {jax.default_backend()}")
    print(f"named step: {named_median * 1e3:.3f} ms   plain step: {plain_median * 1e3:.3f} ms (medians)")
    print(f"ratio named/plain: {ratio:.3f} (goal <= 1.03)")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
