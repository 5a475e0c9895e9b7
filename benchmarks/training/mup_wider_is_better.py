"""muP "wider is better": at one fixed learning rate, training loss falls as the width grows.

Under muP (`halyard.models` ``mup`` family, with `lr_multipliers`) the learning rate tuned at ``d_base``
transfers across widths, so every wider model should be at least as good as a narrower one throughout
training. The data is a synthetic Markov chain (the next token depends on the previous one), generated
here so the script needs no files and no network; the printed floor is the chain's entropy.

Usage::

    python benchmarks/training/mup_wider_is_better.py --quick      # widths 64 128 256, 60 steps (a minute or two on CPU)
    python benchmarks/training/mup_wider_is_better.py              # widths 64 .. 512, 300 steps
    python benchmarks/training/mup_wider_is_better.py --learning-rate 3e-3 --widths 64 256 1024

Prints the loss of every width at a few checkpoints, then whether the final losses fall with width.
"""

from __future__ import annotations

import argparse
import itertools
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from halyard.models import LmBatch, init_model, lr_multipliers, model_config

VOCAB = 64


def markov_chain(seed: int, vocab: int, sharpness: float) -> np.ndarray:
    """Transition probabilities ``[vocab, vocab]`` (previous token -> next), peaked by ``sharpness``."""
    logits = np.random.default_rng(seed).normal(size=(vocab, vocab)) * sharpness
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    return probabilities / probabilities.sum(-1, keepdims=True)


def sample_batch(rng: np.random.Generator, chain: np.ndarray, batch: int, length: int) -> np.ndarray:
    """``[batch, length]`` token windows drawn from the chain."""
    vocab = chain.shape[0]
    tokens = np.zeros((batch, length), np.int32)
    tokens[:, 0] = rng.integers(0, vocab, size=batch)
    cumulative = chain.cumsum(-1)
    for t in range(1, length):
        draws = rng.random(batch)[:, None]
        tokens[:, t] = (cumulative[tokens[:, t - 1]] < draws).sum(-1).clip(max=vocab - 1)
    return tokens


def entropy(chain: np.ndarray) -> float:
    """Mean next-token entropy (nats) under uniform contexts: roughly the loss floor."""
    return float(-(chain * np.log(chain + 1e-12)).sum(-1).mean())


def train(width: int, args: argparse.Namespace, batches: list[np.ndarray]) -> list[float]:
    """Train one width with Adam and muP learning-rate multipliers; return the loss of every step."""
    config = model_config(
        "mup", vocab_size=VOCAB, hidden_size=width, d_base=args.d_base, head_dim=args.head_dim,
        ff_multiple=4, num_layers=args.layers, max_position=args.seq_len, loss_block_size=None,
    )  # fmt: skip
    model = init_model(config, jax.random.key(args.seed))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    multipliers, _ = eqx.partition(lr_multipliers(config, model), lambda x: isinstance(x, float))
    first = jax.tree.map(jnp.zeros_like, params)
    second = jax.tree.map(jnp.zeros_like, params)

    @jax.jit
    def step(params, first, second, tokens, count):
        loss, grads = jax.value_and_grad(
            lambda p: eqx.combine(p, static).loss(LmBatch.from_tokens(tokens))[0]
        )(params)
        first = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, first, grads)
        second = jax.tree.map(lambda v, g: 0.95 * v + 0.05 * g * g, second, grads)
        bias1, bias2 = 1 - 0.9**count, 1 - 0.95**count
        params = jax.tree.map(
            lambda p, m, v, mult: p - args.learning_rate * mult * (m / bias1) / (jnp.sqrt(v / bias2) + 1e-8),
            params, first, second, multipliers,
        )  # fmt: skip
        return params, first, second, loss

    losses = []
    for count, tokens in enumerate(batches, start=1):
        params, first, second, loss = step(params, first, second, tokens, count)
        losses.append(float(loss))
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="widths 64 128 256 and 60 steps")
    parser.add_argument("--widths", type=int, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--learning-rate", type=float, default=1e-2, help="the fixed base learning rate")
    parser.add_argument("--d-base", type=int, default=64)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    widths = args.widths or ([64, 128, 256] if args.quick else [64, 128, 256, 512])
    steps = args.steps or (60 if args.quick else 300)

    chain = markov_chain(args.seed, VOCAB, sharpness=3.0)
    rng = np.random.default_rng(args.seed + 1)
    batches = [sample_batch(rng, chain, args.batch, args.seq_len + 1) for _ in range(steps)]
    print(
        f"{steps} steps, learning rate {args.learning_rate}, d_base {args.d_base}; loss floor ~{entropy(chain):.3f} nats"
    )

    results = {}
    for width in widths:
        start = time.perf_counter()
        results[width] = train(width, args, batches)
        print(f"  width {width:5d}: trained in {time.perf_counter() - start:.1f}s")

    checkpoints = sorted({max(1, steps // 10), steps // 4, steps // 2, steps})
    window = max(1, steps // 20)
    print("\nmean loss over the preceding steps")
    print("step   " + "".join(f"{f'width {w}':>13s}" for w in widths))
    for point in checkpoints:
        row = [np.mean(results[w][max(0, point - window) : point]) for w in widths]
        print(f"{point:5d}  " + "".join(f"{value:13.4f}" for value in row))
    final = [np.mean(results[w][-window:]) for w in widths]
    monotone = all(later <= earlier + 1e-3 for earlier, later in itertools.pairwise(final))
    ratios = ", ".join(f"{w}: {value / final[0]:.3f}" for w, value in zip(widths, final))
    print(f"\nfinal loss relative to width {widths[0]}: {ratios}")
    print(f"wider is better: {'yes' if monotone else 'NO'}")


if __name__ == "__main__":
    main()
