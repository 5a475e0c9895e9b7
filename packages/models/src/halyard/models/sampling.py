"""Text generation with a KV cache: greedy, temperature, top-k, top-p and stop tokens, batched.

Prompts of different lengths are **left-padded** to the longest one, so every sequence writes its next
token to the same cache slot and one decode step serves the whole batch. Padding gets segment id 0 and
real tokens segment id 1 (attention never crosses segments), and positions count real tokens only, so a
padded prompt produces exactly the logits it would produce alone. The whole loop (prefill, then one
jitted decode step per token inside ``jax.lax.while_loop``) runs in one compiled function; it stops
early once every sequence has produced a stop token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from halyard.models.model import CausalLM
from halyard.named import Axis, NamedArray

PAD_SEGMENT, TOKEN_SEGMENT = 0, 1


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to pick each next token.

    Attributes:
        max_new_tokens: tokens to generate per prompt (at most).
        temperature: softmax temperature; ``0`` means greedy (argmax).
        top_k: keep only the ``top_k`` most likely tokens (None: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches ``top_p`` (None: all).
        stop_tokens: generation of a sequence ends after it emits one of these (the stop token is kept);
            None: the model config's ``eos_token_ids`` (every EOS id of an imported checkpoint).
        pad_token: id used for left padding and after a sequence stopped.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    stop_tokens: tuple[int, ...] | None = None
    pad_token: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingConfig.max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"SamplingConfig.top_k must be at least 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingConfig.top_p must lie in (0, 1] or be None, got {self.top_p}")


class Generation(eqx.Module):
    """The result of `generate`.

    Attributes:
        tokens: int32 ``[batch, max_new_tokens]`` generated ids; ``pad_token`` after a sequence stopped.
        lengths: int32 ``[batch]`` number of generated tokens per sequence (stop token included).
        logits: float32 ``[batch, max_new_tokens, vocab]`` logits each token was drawn from (before
            temperature and filtering), or None unless ``return_logits``.
    """

    tokens: jax.Array
    lengths: jax.Array
    logits: jax.Array | None


def filter_logits(logits: jax.Array, *, top_k: int | None = None, top_p: float | None = None) -> jax.Array:
    """Set the logits outside the top-k / top-p (nucleus) set to ``-inf``.

    Args:
        logits: float ``[..., vocab]``.
        top_k: keep the ``top_k`` largest logits (ties at the boundary are all kept).
        top_p: keep the most likely tokens until their softmax probability sums to at least ``top_p``
            (the token that crosses the threshold is kept, so at least one token always survives).

    Returns:
        The filtered logits, same shape.
    """
    if top_k is not None and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p is not None and top_p < 1.0:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probabilities = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probabilities, axis=-1) - probabilities  # mass strictly above each token
        keep_sorted = before < top_p
        keep = jnp.take_along_axis(keep_sorted, jnp.argsort(order, axis=-1), axis=-1)  # back to vocab order
        logits = jnp.where(keep, logits, -jnp.inf)
    return logits


def _choose(logits: jax.Array, config: SamplingConfig, key: jax.Array) -> jax.Array:
    if config.temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    filtered = filter_logits(logits / config.temperature, top_k=config.top_k, top_p=config.top_p)
    return jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)


def left_pad(prompts: Sequence[Sequence[int]], pad_token: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists to a common length.

    Args:
        prompts: one list of token ids per sequence, each non-empty.
        pad_token: the padding id.

    Returns:
        ``(tokens [batch, longest], lengths [batch])`` as int32 numpy arrays.

    Raises:
        ValueError: no prompts, or an empty prompt (its index is named).
    """
    if len(prompts) == 0:
        raise ValueError("generate needs at least one prompt")
    for index, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {index} is empty; every prompt needs at least one token (e.g. BOS)")
    longest = max(len(p) for p in prompts)
    tokens = np.full((len(prompts), longest), pad_token, np.int32)
    for index, prompt in enumerate(prompts):
        tokens[index, longest - len(prompt) :] = np.asarray(prompt, np.int32)
    return tokens, np.asarray([len(p) for p in prompts], np.int32)


def generate(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    config: SamplingConfig,
    *,
    key: jax.Array | None = None,
    return_logits: bool = False,
) -> Generation:
    """Continue each prompt with up to ``config.max_new_tokens`` tokens.

    Args:
        model: any `CausalLM`.
        prompts: token id lists of any lengths (left-padded internally, see the module docstring).
        config: the sampling rule.
        key: PRNG key (needed unless greedy).
        return_logits: also return the logits of every generated position.

    Raises:
        ValueError: empty prompts, a missing key for stochastic sampling, or a prompt plus
            ``max_new_tokens`` longer than a learned-position model's ``max_position``.
    """
    if key is None:
        if config.temperature != 0.0:
            raise ValueError("generate with temperature > 0 needs a PRNG key (key=jax.random.key(...))")
        key = jax.random.key(0)
    tokens, lengths = left_pad(prompts, config.pad_token)
    total = tokens.shape[1] + config.max_new_tokens
    limit = model.position_limit
    if limit is not None and int(lengths.max()) + config.max_new_tokens > limit:
        raise ValueError(
            f"prompt length {int(lengths.max())} + max_new_tokens {config.max_new_tokens} exceeds the "
            f"{limit} positions the model has; shorten the prompt or generate fewer tokens"
        )
    if config.stop_tokens is None:
        stops = tuple(getattr(model.model_config, "eos_token_ids", ()))
        config = dataclasses.replace(config, stop_tokens=stops)
    return _generate(model, jnp.asarray(tokens), jnp.asarray(lengths), key, config, total, return_logits)


@eqx.filter_jit
def _generate(
    model: CausalLM,
    tokens: jax.Array,
    prompt_lengths: jax.Array,
    key: jax.Array,
    config: SamplingConfig,
    total: int,
    return_logits: bool,
) -> Generation:
    batch, prompt_length = tokens.shape
    new = config.max_new_tokens
    pad = prompt_length - prompt_lengths  # padding slots per row
    slots = jnp.arange(total, dtype=jnp.int32)
    key_segments = NamedArray(
        jnp.where(slots[None, :] >= pad[:, None], TOKEN_SEGMENT, PAD_SEGMENT).astype(jnp.int32),
        model_axes(batch, "key_pos", total),
    )
    prompt_slots = slots[None, :prompt_length]
    prompt_positions = jnp.maximum(prompt_slots - pad[:, None], 0)
    cache = model.init_cache(batch, total)
    logits, cache = model.decode_step(
        NamedArray(tokens, model_axes(batch, "pos", prompt_length)),
        cache,
        cache_index=0,
        positions=NamedArray(prompt_positions, model_axes(batch, "pos", prompt_length)),
        segment_ids=NamedArray(
            key_segments.array[:, :prompt_length], model_axes(batch, "pos", prompt_length)
        ),
        key_segment_ids=key_segments,
    )
    last = logits.unwrap("batch", "pos", "vocab")[:, -1]
    vocab = last.shape[-1]
    stop = jnp.asarray(config.stop_tokens or (-1,), jnp.int32)

    state: dict[str, Any] = dict(
        step=jnp.zeros((), jnp.int32),
        logits=last,
        cache=cache,
        key=key,
        done=jnp.zeros((batch,), bool),
        out=jnp.full((batch, new), config.pad_token, jnp.int32),
        lengths=jnp.zeros((batch,), jnp.int32),
        all_logits=jnp.zeros((batch, new, vocab) if return_logits else (0,), jnp.float32),
    )

    def keep_going(s: dict[str, Any]) -> jax.Array:
        return jnp.logical_and(s["step"] < new, jnp.logical_not(jnp.all(s["done"])))

    def step(s: dict[str, Any]) -> dict[str, Any]:
        key, draw = jax.random.split(s["key"])
        chosen = _choose(s["logits"], config, draw)
        chosen = jnp.where(s["done"], config.pad_token, chosen)
        out = s["out"].at[:, s["step"]].set(chosen)
        lengths = s["lengths"] + jnp.logical_not(s["done"]).astype(jnp.int32)
        done = jnp.logical_or(s["done"], jnp.isin(chosen, stop))
        all_logits = s["all_logits"]
        if return_logits:
            all_logits = all_logits.at[:, s["step"]].set(s["logits"])
        index = prompt_length + s["step"]
        position = (prompt_lengths + s["step"])[:, None]  # real tokens before this one
        logits, cache = model.decode_step(
            NamedArray(chosen[:, None], model_axes(batch, "pos", 1)),
            s["cache"],
            cache_index=index,
            positions=NamedArray(position.astype(jnp.int32), model_axes(batch, "pos", 1)),
            segment_ids=NamedArray(
                jnp.full((batch, 1), TOKEN_SEGMENT, jnp.int32), model_axes(batch, "pos", 1)
            ),
            key_segment_ids=key_segments,
        )
        return dict(
            step=s["step"] + 1,
            logits=logits.unwrap("batch", "pos", "vocab")[:, 0],
            cache=cache,
            key=key,
            done=done,
            out=out,
            lengths=lengths,
            all_logits=all_logits,
        )

    final = jax.lax.while_loop(keep_going, step, state)
    return Generation(final["out"], final["lengths"], final["all_logits"] if return_logits else None)


def model_axes(batch: int, name: str, size: int) -> tuple[Axis, Axis]:
    """``(Axis("batch", batch), Axis(name, size))``: the axes of a per-token array in the sampler."""
    return (Axis("batch", batch), Axis(name, size))
