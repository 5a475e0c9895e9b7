# %% [markdown]
# # Named arrays in ten minutes
#
# Halyard's model code never says "dimension 2". Every array carries the names of its axes (`batch`,
# `pos`, `embed`, `heads`, ...) and every operation takes names. This guide shows why, then walks through
# the operations a transformer needs: axes, `dot` / `einsum` / `rearrange`, indexing, a layer and an
# attention block, each checked against plain `jax.numpy`.

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

import halyard.named as hn
from halyard.named import Axis, NamedArray, named, nn

FIGURES = Path(os.environ.get("HALYARD_DOCS_FIGURES", Path(__file__).resolve().parent / "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## Why names: the bug positional code hides
#
# Layer norm subtracts each token's mean over the embedding. With positional arrays it is easy to forget
# `keepdims=True`. When the sequence is as long as the embedding is wide, numpy broadcasts the
# `(pos,)` means along the *last* axis: column `j` loses the mean of token `j`. No error, wrong numbers.

# %%
activations = np.random.default_rng(0).normal(size=(4, 4)) + np.arange(4)[:, None]  # (pos, embed)
wrong = activations - activations.mean(axis=-1)  # forgot keepdims: broadcast along embed, silently
right = activations - activations.mean(axis=-1, keepdims=True)
print("positional: max error", np.abs(wrong - right).max(), "and no exception")

# %% [markdown]
# With names, the mean over `embed` is an array over `pos`, and subtracting it broadcasts *by name*: there
# is nothing to forget. If the sizes really disagree, the error names the axis and both shapes.

# %%
x = named(jnp.asarray(activations), ("pos", "embed"))
centered = x - x.mean("embed")
assert np.allclose(centered.array, right)
try:
    x + hn.zeros(Axis("embed", 3))
except ValueError as error:
    print("named:", error)

# %% [markdown]
# ## Axes and named arrays
#
# An `Axis` is a name and a size. By convention a variable holding one is a CamelCase noun, while the
# names themselves are lower-case words from the paper. A `NamedArray` is a JAX array plus its axes; it is
# a pytree, so `jit`, `grad`, `vmap` and `scan` take it unchanged.

# %%
Batch, Pos, Embed, Heads, HeadSize = (
    Axis("batch", 2),
    Axis("pos", 6),
    Axis("embed", 16),
    Axis("heads", 4),
    Axis("head_size", 4),
)
key = jax.random.key(0)
key_x, key_q, key_k, key_v, key_o, key_layer = jax.random.split(key, 6)

h = hn.random.normal(key_x, (Batch, Pos, Embed))
print(h.axes)  # (Axis('batch', 2), Axis('pos', 6), Axis('embed', 16))
print(h.shape)  # {'batch': 2, 'pos': 6, 'embed': 16}
print(h.axis_size("embed"), h.has_axis("heads"))
print(h.rearrange("embed", ...).axes)  # transpose by name: embed first, the rest in order
print(h.rename({"pos": "key_pos"}).axes)

# %% [markdown]
# Operators broadcast by name: the result has the union of the axes, the first operand's first. A bias
# over `embed` adds to `h` whatever the order of `h`'s axes.

# %%
bias = hn.arange(Embed) * 0.1
moved = h.rearrange("embed", "batch", "pos")
assert (moved + bias).rearrange("batch", "pos", "embed").axes == (h + bias).axes
assert np.allclose((h + bias).array, h.array + 0.1 * np.arange(16))

# %% [markdown]
# ## dot, einsum and rearrange
#
# `hn.dot` contracts the named axes and keeps the others. `hn.einsum` takes axis names instead of letters.
# `rearrange` splits and merges axes by name: `(embed: heads head_size)` splits `embed` into two new axes.

# %%
w_q = hn.random.normal(key_q, (Embed, Axis("out", 16))) * Embed.size**-0.5
projected = hn.dot(h, w_q, axis="embed")  # (batch, pos, out)
same = hn.einsum("batch pos embed, embed out -> batch pos out", h, w_q)
assert np.allclose(projected.array, same.array, atol=1e-5)
assert np.allclose(projected.array, jnp.einsum("bpe,eo->bpo", h.array, w_q.array), atol=1e-5)

split = projected.rearrange("... (out: heads head_size) -> batch heads pos head_size", heads=4)
print(split.axes)  # batch, heads, pos, head_size
merged = split.rearrange("... -> batch pos (out: heads head_size)")
assert np.array_equal(merged.array, projected.array)

# %% [markdown]
# ## Indexing
#
# Slices and indices name their axis, so they do not depend on where the axis sits. Updates use `.at`.

# %%
first_tokens = h["pos", :3]  # (batch, pos=3, embed)
one_example = h[{"batch": 0}]  # (pos, embed): the axis is gone
last_feature = h["embed", -1]  # (batch, pos)
print(first_tokens.axes, one_example.axes, last_feature.axes)
zeroed = h.at["pos", 0].set(0.0)
assert float(hn.abs(zeroed["pos", 0]).sum().array) == 0.0
assert np.array_equal(h["pos", :3].array, h.array[:, :3])


# %% [markdown]
# ## A layer
#
# Layers are equinox modules built by `init` from `Axis` objects. `nn.Linear.init(In, Out)` may take
# several output axes: here it produces heads directly. Axes the layer does not touch (`batch`, `pos`)
# pass through, so the same layer works on one token or a batch of sequences.


# %%
class Mlp(eqx.Module):
    up: nn.Linear
    down: nn.Linear

    @classmethod
    def init(cls, Embed: Axis, Hidden: Axis, *, key: jax.Array) -> "Mlp":
        key_up, key_down = jax.random.split(key)
        return cls(nn.Linear.init(Embed, Hidden, key=key_up), nn.Linear.init(Hidden, Embed, key=key_down))

    def __call__(self, x: NamedArray) -> NamedArray:
        return self.down(nn.gelu(self.up(x)))


mlp = Mlp.init(Embed, Axis("mlp", 64), key=key_layer)
out = mlp(h)
assert out.axes == h.axes
print(mlp(h[{"batch": 0, "pos": 0}]).axes)  # one token: only embed

# Gradients are NamedArrays with the parameters' axes.
grads = jax.grad(lambda m: m(h).sum().array)(mlp)
print(grads.up.weight.axes)


# %% [markdown]
# ## An attention block
#
# Causal self-attention, written as the formula: project to heads, score queries against keys, mask,
# softmax over `key_pos`, mix values, merge heads. The keys get their own position axis (`key_pos`), so
# the score array `(batch, heads, pos, key_pos)` says what it is.


# %%
class Attention(eqx.Module):
    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    o: nn.Linear

    @classmethod
    def init(cls, Embed: Axis, Heads: Axis, HeadSize: Axis, *, key: jax.Array) -> "Attention":
        keys = jax.random.split(key, 4)
        to_heads = [nn.Linear.init(Embed, (Heads, HeadSize), key=k, use_bias=False) for k in keys[:3]]
        return cls(*to_heads, nn.Linear.init((Heads, HeadSize), Embed, key=keys[3], use_bias=False))

    def weights(self, x: NamedArray) -> NamedArray:
        q = self.q(x)
        k = self.k(x).rename({"pos": "key_pos"})
        scores = hn.dot(q, k, axis="head_size") / jnp.sqrt(q.axis_size("head_size"))
        causal = nn.causal_mask(x.axis("pos"), x.axis("pos").alias("key_pos"))
        return hn.softmax(scores, "key_pos", where=causal)

    def __call__(self, x: NamedArray) -> NamedArray:
        v = self.v(x).rename({"pos": "key_pos"})
        return self.o(hn.dot(self.weights(x), v, axis="key_pos"))


attention = Attention.init(Embed, Heads, HeadSize, key=key_o)
y = eqx.filter_jit(attention)(h)  # modules hold arrays: equinox's jit traces them
assert y.axes == h.axes

# %% [markdown]
# The same computation in plain `jax.numpy`, with every axis tracked by hand, agrees:


# %%
def reference_attention(layer: Attention, x: jax.Array) -> jax.Array:
    q, k, v = (jnp.einsum("bpe,ehd->bhpd", x, w.weight.array) for w in (layer.q, layer.k, layer.v))
    scores = jnp.einsum("bhpd,bhkd->bhpk", q, k) / jnp.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhpd,hde->bpe", jnp.einsum("bhpk,bhkd->bhpd", weights, v), layer.o.weight.array)


assert np.allclose(y.array, reference_attention(attention, h.array), atol=1e-5)
print("attention matches the plain-JAX reference")

# %% [markdown]
# Because the weights are named, selecting what to plot reads like the question: example 0, every head.

# %%
weights = attention.weights(h)[{"batch": 0}].rearrange("heads", "pos", "key_pos")
figure, axes = plt.subplots(1, Heads.size, figsize=(2.4 * Heads.size, 2.6))
for head, ax in enumerate(axes):
    ax.imshow(np.asarray(weights["heads", head].array), cmap="viridis", vmin=0, vmax=1)
    ax.set_title(f"head {head}")
    ax.set_xlabel("key_pos")
axes[0].set_ylabel("pos")
figure.suptitle("Causal attention weights at initialisation (example 0)")
figure.tight_layout()
figure.savefig(FIGURES / "01_attention_weights.png", dpi=100)

# %% [markdown]
# ![Causal attention weights per head: zero above the diagonal](figures/01_attention_weights.png)
#
# Next: [train your first model](02_first_model.md) with the models built from these pieces. The full
# list of operations is in the [halyard.named package page](../packages/named.md).
