"""The GPT-2 benchmark model outside Halyard: plain JAX (jnp + lax.scan) and PyTorch (transformers).

Both compute what `halyard.models` GPT-2 computes in the trainer: token + learned position embeddings,
pre-LayerNorm causal self-attention and GELU (tanh) MLP blocks with biases, a final LayerNorm, logits
through the tied token embedding, mean next-token cross-entropy, gradients, global-norm clipping at 1.0
and AdamW (betas 0.9/0.95, eps 1e-8, decay 0.1 on matrices only). Initialisation follows GPT-2 (std
0.02, residual projections 0.02 / sqrt(2 * layers), zero biases, unit LayerNorm scales).

Used by `benchmarks/training/train_step.py`; not a library.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

LEARNING_RATE = 3e-4
BETAS = (0.9, 0.95)
EPSILON = 1e-8
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 1.0


@dataclass(frozen=True)
class Gpt2Shapes:
    """Sizes of the benchmark model and batch."""

    num_layers: int = 6
    hidden_size: int = 512
    num_heads: int = 8
    seq_len: int = 256
    batch_size: int = 8
    vocab_size: int = 8192

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


# -- plain JAX ------------------------------------------------------------------------------------------


def plain_init(shapes: Gpt2Shapes, key: jax.Array) -> dict[str, Any]:
    """GPT-2 parameters as plain arrays; per-layer weights stacked on a leading layers dimension."""
    layers, embed, vocab = shapes.num_layers, shapes.hidden_size, shapes.vocab_size
    mlp = 4 * embed
    std, residual_std = 0.02, 0.02 / math.sqrt(2 * layers)
    keys = iter(jax.random.split(key, 6))

    def normal(shape: tuple[int, ...], scale: float) -> jax.Array:
        return scale * jax.random.normal(next(keys), shape, jnp.float32)

    ones = lambda *shape: jnp.ones(shape, jnp.float32)
    zeros = lambda *shape: jnp.zeros(shape, jnp.float32)
    return {
        "wte": normal((vocab, embed), std),
        "wpe": normal((shapes.seq_len, embed), std),
        "ln_f": {"scale": ones(embed), "bias": zeros(embed)},
        "layers": {
            "ln_1": {"scale": ones(layers, embed), "bias": zeros(layers, embed)},
            "qkv": {"weight": normal((layers, embed, 3 * embed), std), "bias": zeros(layers, 3 * embed)},
            "attn_out": {
                "weight": normal((layers, embed, embed), residual_std),
                "bias": zeros(layers, embed),
            },
            "ln_2": {"scale": ones(layers, embed), "bias": zeros(layers, embed)},
            "mlp_up": {"weight": normal((layers, embed, mlp), std), "bias": zeros(layers, mlp)},
            "mlp_down": {"weight": normal((layers, mlp, embed), residual_std), "bias": zeros(layers, embed)},
        },
    }


def _layer_norm(x: jax.Array, p: dict[str, jax.Array], eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, -1, keepdims=True)
    variance = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(variance + eps) * p["scale"] + p["bias"]


def _gelu_tanh(x: jax.Array) -> jax.Array:
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def plain_loss(params: dict[str, Any], tokens: jax.Array, num_heads: int) -> jax.Array:
    """Mean next-token cross-entropy of ``tokens`` ``[batch, seq_len + 1]``."""
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    batch, seq = inputs.shape
    embed = params["wte"].shape[1]
    head_size = embed // num_heads
    x = params["wte"][inputs] + params["wpe"][:seq]

    def block(h: jax.Array, p: dict[str, Any]) -> tuple[jax.Array, None]:
        qkv = _layer_norm(h, p["ln_1"]) @ p["qkv"]["weight"] + p["qkv"]["bias"]
        query, key, value = jnp.split(qkv.reshape(batch, seq, 3 * num_heads, head_size), 3, axis=2)
        attended = jax.nn.dot_product_attention(query, key, value, is_causal=True, implementation="xla")
        h = h + attended.reshape(batch, seq, embed) @ p["attn_out"]["weight"] + p["attn_out"]["bias"]
        up = _gelu_tanh(_layer_norm(h, p["ln_2"]) @ p["mlp_up"]["weight"] + p["mlp_up"]["bias"])
        return h + up @ p["mlp_down"]["weight"] + p["mlp_down"]["bias"], None

    x, _ = jax.lax.scan(block, x, params["layers"])
    logits = _layer_norm(x, params["ln_f"]) @ params["wte"].T
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[..., None], axis=-1))


def plain_optimizer() -> optax.GradientTransformation:
    """Clip to global norm 1.0, then AdamW with decay on leaves named ``weight`` only (as the Halyard
    default: embeddings, norms and biases do not decay)."""

    def decay_mask(params: dict[str, Any]) -> Any:
        return jax.tree_util.tree_map_with_path(lambda path, leaf: path[-1].key == "weight", params)

    return optax.chain(
        optax.clip_by_global_norm(MAX_GRAD_NORM),
        optax.adamw(
            LEARNING_RATE, b1=BETAS[0], b2=BETAS[1], eps=EPSILON, weight_decay=WEIGHT_DECAY, mask=decay_mask
        ),
    )


def jit_plain_step(
    loss: Callable[[Any, jax.Array], jax.Array], params: Any
) -> tuple[Callable[..., Any], Any]:
    """``(jitted step(state, tokens) -> (state, loss) with the state donated, initial state)`` for
    ``loss(params, tokens)`` and `plain_optimizer`."""
    optimizer = plain_optimizer()

    def step(state: tuple[Any, Any], tokens: jax.Array) -> tuple[tuple[Any, Any], jax.Array]:
        params, opt_state = state
        value, grads = jax.value_and_grad(loss)(params, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    return jax.jit(step, donate_argnums=0), (params, optimizer.init(params))


def make_plain_step(shapes: Gpt2Shapes, key: jax.Array) -> tuple[Callable[..., Any], Any]:
    """``(jitted step(state, tokens) -> (state, loss) with the state donated, initial state)``."""
    return jit_plain_step(lambda p, tokens: plain_loss(p, tokens, shapes.num_heads), plain_init(shapes, key))


# -- PyTorch --------------------------------------------------------------------------------------------


def make_torch_step(shapes: Gpt2Shapes, seed: int = 0) -> Callable[[np.ndarray], float]:
    """``step(tokens [batch, seq_len + 1] int) -> loss`` for transformers' GPT2LMHeadModel + AdamW."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=shapes.vocab_size,
        n_positions=shapes.seq_len,
        n_embd=shapes.hidden_size,
        n_layer=shapes.num_layers,
        n_head=shapes.num_heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config).float().train()
    return torch_train_step(model, lambda name, p: p.ndim == 2 and "wte" not in name and "wpe" not in name)


def torch_train_step(model: Any, decays: Callable[[str, Any], bool]) -> Callable[[np.ndarray], float]:
    """``step(tokens [batch, seq_len + 1] int) -> loss`` for a transformers causal LM: mean next-token
    cross-entropy, backward, clipping at 1.0, AdamW (decay where ``decays(name, parameter)``)."""
    import torch

    named = list(model.named_parameters())
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for n, p in named if decays(n, p)], "weight_decay": WEIGHT_DECAY},
            {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0},
        ],
        lr=LEARNING_RATE,
        betas=BETAS,
        eps=EPSILON,
    )

    def step(tokens: np.ndarray) -> float:
        batch = torch.from_numpy(np.asarray(tokens, np.int64))
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        return float(loss.detach())

    return step


def torch_matmul_flops(size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of the fastest of ``repeats`` f32 ``size x size`` matmuls in PyTorch (for reference)."""
    import time

    import torch

    left, right = torch.randn(size, size), torch.randn(size, size)
    torch.matmul(left, right)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(left, right)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best
