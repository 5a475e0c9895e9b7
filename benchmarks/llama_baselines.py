"""The Llama benchmark models outside Halyard: plain JAX (jnp + lax.scan) and PyTorch (transformers).

Both compute what `halyard.models` ``llama`` computes in the trainer: token embedding, pre-RMSNorm causal
self-attention with rotary positions (Hugging Face's half-rotation layout, theta 10000) and grouped-query
heads, a SwiGLU MLP, no biases, a final RMSNorm, an untied output projection, mean next-token
cross-entropy, gradients, global-norm clipping at 1.0 and AdamW (betas 0.9/0.95, eps 1e-8, decay 0.1 on
the layers' matrices; embeddings and norms do not decay, as Halyard's default mask). Every weight starts
as N(0, 0.02^2) (Hugging Face's initialisation), norm scales at one.

Used by `benchmarks/training/train_step.py`; not a library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gpt2_baselines import Gpt2Shapes, jit_plain_step, torch_train_step

ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-5
INIT_STD = 0.02


@dataclass(frozen=True)
class LlamaShapes(Gpt2Shapes):
    """Sizes of a Llama benchmark model and its batch (GPT-2's, plus the MLP width and the KV heads)."""

    intermediate_size: int = 1536
    num_kv_heads: int = 4

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads


# -- plain JAX ------------------------------------------------------------------------------------------


def plain_init(shapes: LlamaShapes, key: jax.Array) -> dict[str, Any]:
    """Llama parameters as plain arrays; per-layer weights stacked on a leading layers dimension."""
    layers, embed, mlp, vocab = (
        shapes.num_layers,
        shapes.hidden_size,
        shapes.intermediate_size,
        shapes.vocab_size,
    )
    q_width, kv_width = shapes.num_heads * shapes.head_size, shapes.num_kv_heads * shapes.head_size
    keys = iter(jax.random.split(key, 9))

    def normal(*shape: int) -> jax.Array:
        return INIT_STD * jax.random.normal(next(keys), shape, jnp.float32)

    return {
        "embed_tokens": normal(vocab, embed),
        "final_norm": jnp.ones(embed, jnp.float32),
        "lm_head": normal(embed, vocab),
        "layers": {
            "input_norm": jnp.ones((layers, embed), jnp.float32),
            "q": {"weight": normal(layers, embed, q_width)},
            "k": {"weight": normal(layers, embed, kv_width)},
            "v": {"weight": normal(layers, embed, kv_width)},
            "o": {"weight": normal(layers, q_width, embed)},
            "post_attention_norm": jnp.ones((layers, embed), jnp.float32),
            "gate": {"weight": normal(layers, embed, mlp)},
            "up": {"weight": normal(layers, embed, mlp)},
            "down": {"weight": normal(layers, mlp, embed)},
        },
    }


def _rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + RMS_NORM_EPS) * scale


def _rotary(seq_len: int, head_size: int) -> tuple[jax.Array, jax.Array]:
    inverse_frequency = 1.0 / ROPE_THETA ** (jnp.arange(0, head_size, 2, dtype=jnp.float32) / head_size)
    angles = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inverse_frequency[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)  # [seq, head_size], HF's half-rotation layout
    return jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    first, second = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-second, first], axis=-1) * sin


def plain_loss(params: dict[str, Any], tokens: jax.Array, shapes: LlamaShapes) -> jax.Array:
    """Mean next-token cross-entropy of ``tokens`` ``[batch, seq_len + 1]``."""
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    batch, seq = inputs.shape
    heads, kv_heads, head_size = shapes.num_heads, shapes.num_kv_heads, shapes.head_size
    cos, sin = _rotary(seq, head_size)
    x = params["embed_tokens"][inputs]

    def block(h: jax.Array, p: dict[str, Any]) -> tuple[jax.Array, None]:
        normed = _rms_norm(h, p["input_norm"])
        query = _rotate((normed @ p["q"]["weight"]).reshape(batch, seq, heads, head_size), cos, sin)
        key = _rotate((normed @ p["k"]["weight"]).reshape(batch, seq, kv_heads, head_size), cos, sin)
        value = (normed @ p["v"]["weight"]).reshape(batch, seq, kv_heads, head_size)
        attended = jax.nn.dot_product_attention(query, key, value, is_causal=True, implementation="xla")
        h = h + attended.reshape(batch, seq, heads * head_size) @ p["o"]["weight"]
        normed = _rms_norm(h, p["post_attention_norm"])
        gated = jax.nn.silu(normed @ p["gate"]["weight"]) * (normed @ p["up"]["weight"])
        return h + gated @ p["down"]["weight"], None

    x, _ = jax.lax.scan(block, x, params["layers"])
    logits = _rms_norm(x, params["final_norm"]) @ params["lm_head"]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[..., None], axis=-1))


def make_plain_step(shapes: LlamaShapes, key: jax.Array) -> tuple[Callable[..., Any], Any]:
    """``(jitted step(state, tokens) -> (state, loss) with the state donated, initial state)``."""
    return jit_plain_step(lambda params, tokens: plain_loss(params, tokens, shapes), plain_init(shapes, key))


# -- PyTorch --------------------------------------------------------------------------------------------


def make_torch_step(shapes: LlamaShapes, seed: int = 0) -> Callable[[np.ndarray], float]:
    """``step(tokens [batch, seq_len + 1] int) -> loss`` for transformers' LlamaForCausalLM + AdamW."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=shapes.vocab_size,
        hidden_size=shapes.hidden_size,
        intermediate_size=shapes.intermediate_size,
        num_hidden_layers=shapes.num_layers,
        num_attention_heads=shapes.num_heads,
        num_key_value_heads=shapes.num_kv_heads,
        max_position_embeddings=shapes.seq_len,
        rms_norm_eps=RMS_NORM_EPS,
        rope_theta=ROPE_THETA,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        initializer_range=INIT_STD,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
    )
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).float().train()
    return torch_train_step(
        model, lambda name, p: p.ndim == 2 and "embed_tokens" not in name and "lm_head" not in name
    )
