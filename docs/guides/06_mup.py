# %% [markdown]
# # muP: tune on a narrow model, train a wide one
#
# Tuning the learning rate of a large model costs many large runs. Under the maximal-update
# parametrization (muP, Yang et al., "Tensor Programs V"), the best learning rate of a narrow model is
# also the best for a wide one, so the sweep runs on the narrow model and the wide model is trained once.
# Halyard's `mup` model family applies the muP rules (initialisation, `1/head_dim` attention scale, output
# scale), and `lr_multipliers` gives each weight its learning-rate multiplier (`d_base / width` for hidden
# matrices and the unembedding, 1 for embeddings and gains).
#
# This guide sweeps the learning rate at two widths, shows that the optimum stays put, and draws the
# coordinate check: activations keep their size as the width grows.

# %%
import os
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from halyard.models import LmBatch, init_model, lr_multipliers, model_config, registered_models
from halyard.named import named

SMOKE = os.environ.get("HALYARD_DOCS_SMOKE") == "1"
FIGURES = Path(os.environ.get("HALYARD_DOCS_FIGURES", Path(__file__).resolve().parent / "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
print("model families:", registered_models())

WIDTHS = [32, 64, 128] if SMOKE else [32, 64, 128, 256]
NARROW, WIDE = WIDTHS[0], WIDTHS[-1]
LEARNING_RATES = [3e-3, 1e-2, 3e-2, 1e-1] if SMOKE else [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
STEPS = 12 if SMOKE else 60
VOCAB, SEQ_LEN, BATCH = 64, 32, 16

# %% [markdown]
# ## Data: a Markov chain
#
# A synthetic language where each token depends on the previous one, so a model can learn something in a
# few dozen steps and the loss floor (the chain's entropy) is known.

# %%
rng = np.random.default_rng(0)
logits = rng.normal(size=(VOCAB, VOCAB)) * 3.0
transitions = np.exp(logits - logits.max(-1, keepdims=True))
transitions /= transitions.sum(-1, keepdims=True)
floor = float(-(transitions * np.log(transitions)).sum(-1).mean())


def sample_tokens(rng: np.random.Generator) -> np.ndarray:
    tokens = np.zeros((BATCH, SEQ_LEN + 1), np.int32)
    tokens[:, 0] = rng.integers(0, VOCAB, size=BATCH)
    for position in range(1, SEQ_LEN + 1):
        previous = transitions[tokens[:, position - 1]]
        tokens[:, position] = [rng.choice(VOCAB, p=row) for row in previous]
    return tokens


batches = [sample_tokens(rng) for _ in range(STEPS)]
print(f"loss floor {floor:.3f} nats; a uniform guess scores {np.log(VOCAB):.3f}")

# %% [markdown]
# ## Adam with muP multipliers
#
# One training function per width; the learning rate is an argument (not a constant), so a sweep compiles
# once per width. The only muP-specific line is the multiplication by `multipliers`.


# %%
def make_trainer(width: int):
    config = model_config(
        "mup", vocab_size=VOCAB, hidden_size=width, d_base=NARROW, head_dim=8, num_layers=2,
        max_position=SEQ_LEN, loss_block_size=None,
    )  # fmt: skip
    model = init_model(config, jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    multipliers, _ = eqx.partition(lr_multipliers(config, model), lambda leaf: isinstance(leaf, float))

    def loss_fn(params, tokens):
        return eqx.combine(params, static).loss(LmBatch.from_tokens(tokens))[0]

    @jax.jit
    def step(params, moments, tokens, learning_rate, count):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        first, second = moments
        first = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, first, grads)
        second = jax.tree.map(lambda v, g: 0.99 * v + 0.01 * g * g, second, grads)

        def update(p, m, v, multiplier):
            adam = (m / (1 - 0.9**count)) / (jnp.sqrt(v / (1 - 0.99**count)) + 1e-8)
            return p - learning_rate * multiplier * adam

        return jax.tree.map(update, params, first, second, multipliers), (first, second), loss

    @jax.jit
    def coordinates(params, tokens):
        return eqx.combine(params, static).coordinates(named(tokens[:, :-1], ("batch", "pos")))

    def train(learning_rate: float, steps: int = STEPS, record=None) -> list[float]:
        state = params
        moments = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))
        losses = []
        for count, tokens in enumerate(batches[:steps], start=1):
            if record is not None:
                record.append(jax.device_get(coordinates(state, tokens)))
            state, moments, loss = step(state, moments, tokens, learning_rate, count)
            losses.append(float(loss))
        return losses

    return train


trainers = {width: make_trainer(width) for width in WIDTHS}

# %% [markdown]
# ## The sweep: narrow, then wide
#
# Final training loss (mean of the last few steps) for each learning rate, at the narrowest and the widest
# width. Under muP the two curves have the same shape with their minimum in the same place (on a grid
# with steps of about 3x, the same or a neighbouring point), and the wide model is better at every
# learning rate near it.

# %%
final = {}
for width in (NARROW, WIDE):
    final[width] = []
    for learning_rate in LEARNING_RATES:
        losses = trainers[width](learning_rate)
        final[width].append(float(np.mean(losses[-3:])) if np.all(np.isfinite(losses)) else np.nan)
    print(
        f"width {width:4d}:",
        " ".join(f"{lr:g}->{loss:.3f}" for lr, loss in zip(LEARNING_RATES, final[width])),
    )
best = {width: LEARNING_RATES[int(np.nanargmin(losses))] for width, losses in final.items()}
print("best learning rate:", best)

figure, ax = plt.subplots(figsize=(6, 3.6))
for width, losses in final.items():
    ax.plot(LEARNING_RATES, losses, "o-", label=f"width {width}")
ax.axhline(floor, color="gray", linestyle=":", label="loss floor")
ax.set_xscale("log")
ax.set_xlabel("base learning rate")
ax.set_ylabel(f"training loss after {STEPS} steps")
ax.set_title("muP: the best learning rate transfers across width")
ax.legend()
figure.tight_layout()
figure.savefig(FIGURES / "06_lr_transfer.png", dpi=100)

# %% [markdown]
# ![Loss against learning rate for the narrow and the wide model](figures/06_lr_transfer.png)
#
# ## Transfer: train the wide model once
#
# The narrow model's best learning rate, used as it is for the wide model, against the wide model's own
# sweep: the wide run needs no tuning of its own, and comes within a few percent of its best loss (here
# at most 3%, checked).

# %%
transferred = best[NARROW]
wide_at_transferred = final[WIDE][LEARNING_RATES.index(transferred)]
print(f"wide model at the transferred rate {transferred:g}: {wide_at_transferred:.3f}")
print(f"wide model at its own best rate {best[WIDE]:g}: {np.nanmin(final[WIDE]):.3f}")
print(f"narrow model at its best rate: {np.nanmin(final[NARROW]):.3f}")
assert wide_at_transferred <= 1.03 * np.nanmin(final[WIDE]), "the transferred rate should be near-optimal"

# %% [markdown]
# ## The coordinate check
#
# The test behind muP: train every width for a few steps at one learning rate and record the mean
# absolute value of each layer's output. Under muP each line is flat in width (the updates change
# activations by an amount that does not grow with width); in the standard parametrization the later
# steps grow with width, which is why the best learning rate of a wide model is smaller there.

# %%
check_steps = 4
records = {}
for width in WIDTHS:
    records[width] = []
    trainers[width](transferred, steps=check_steps, record=records[width])

names = ["embedding", "attention", "mlp", "logits"]
figure, axes = plt.subplots(1, len(names), figsize=(12, 3), sharex=True)
for ax, name in zip(axes, names):
    for step in range(check_steps):
        values = [float(np.mean(records[width][step][name])) for width in WIDTHS]
        ax.plot(WIDTHS, values, "o-", label=f"step {step}")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)  # from zero: a flat line should look flat
    ax.set_title(name)
    ax.set_xlabel("width")
axes[0].set_ylabel("mean |activation|")
axes[-1].legend(fontsize=8)
figure.suptitle("Coordinate check (muP): activation size does not grow with width")
figure.tight_layout()
figure.savefig(FIGURES / "06_coordinate_check.png", dpi=100)
for name in names:
    sizes = [float(np.mean(records[width][-1][name])) for width in WIDTHS]
    print(
        f"{name:10s} after {check_steps - 1} steps, widths {WIDTHS}: " + " ".join(f"{s:.3f}" for s in sizes)
    )

# %% [markdown]
# ![Mean absolute activations against width, one line per training step](figures/06_coordinate_check.png)
#
# ## In a run config
#
# The trainer applies the multipliers itself when the model is `type: mup`:
#
# ```yaml
# model:
#   type: mup
#   hidden_size: 1024   # the wide model
#   d_base: 256         # the width the learning rate was tuned at
#   head_dim: 64
# optimizer:
#   type: adamw
#   learning_rate: 0.01 # the narrow model's best
# ```
#
# `benchmarks/training/mup_wider_is_better.py` checks the same property on more widths and steps.
