"""Tiny models of the families for engine tests (a few thousand parameters, compile in seconds)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from float_tolerance import decoder_terms, summation_tolerance

from halyard.models import CausalLM, init_model, model_config
from halyard.named import named

VOCAB = 61


def tiny_model(family: str, seed: int = 0, **overrides: Any) -> CausalLM:
    """A small model of ``family`` with wide initialisation (logits far from uniform)."""
    settings: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, initializer_range=0.3
    )
    if family in ("llama", "mistral", "qwen2", "qwen3", "mixtral"):
        settings.update(intermediate_size=48, num_kv_heads=2, max_position=512)
    if family == "mistral":
        settings.update(sliding_window=5)
    if family == "gpt2":
        settings.update(max_position=256)
    settings.update(overrides)
    return init_model(model_config(family, **settings), jax.random.key(seed))


@jax.jit
def _logprobs(model: CausalLM, tokens: jax.Array) -> jax.Array:
    logits = model(named(tokens, ("batch", "pos"))).unwrap("batch", "pos", "vocab")
    return jax.nn.log_softmax(logits, axis=-1)


def forward_logprobs(model: CausalLM, tokens: list[int], padded_to: int = 64) -> np.ndarray:
    """``log_softmax`` of the full forward's logits over ``tokens``: ``[len(tokens), vocab]``.

    The sequence is padded on the right to a multiple of ``padded_to`` (causal attention: padding never
    reaches an earlier position), so sequences of many lengths share one compiled program.
    """
    length = -(-len(tokens) // padded_to) * padded_to
    padded = jnp.asarray([list(tokens) + [0] * (length - len(tokens))], jnp.int32)
    return np.asarray(_logprobs(model, padded))[0, : len(tokens)]


def greedy_reference(model: CausalLM, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy continuation by the full forward over the whole sequence at every step (no cache)."""
    tokens, logprobs = list(prompt), []
    for _ in range(steps):
        row = forward_logprobs(model, tokens)[-1]
        token = int(np.argmax(row))
        tokens.append(token)
        logprobs.append(float(row[token]))
    return tokens[len(prompt) :], logprobs


def logprob_tolerance(model: CausalLM, sequences: list[list[int]]) -> float:
    """How far two computations of ``model``'s log-probs over ``sequences`` may differ by summation order
    alone (the engine's pages and chunks against the full forward, one device against several):
    `summation_tolerance` of the forward pass's reductions and the log-softmax's sum over the vocabulary.

    The scale is the largest ``|log-prob|`` of any token at any position (these random models' logits are
    centred on 0, so their spread, which that is at least, is at least their magnitude).
    """
    scale = max(float(np.abs(forward_logprobs(model, sequence)).max()) for sequence in sequences)
    config = model.model_config
    terms = decoder_terms(config, max(map(len, sequences))) + config.shape.vocab
    return summation_tolerance(scale, terms)
