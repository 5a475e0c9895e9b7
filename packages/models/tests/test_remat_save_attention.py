"""``remat: save_attention`` keeps only the attention kernel's inputs and output: the same loss and gradients as
keeping everything, with less memory saved for the backward pass than ``save_dots`` and more than ``full``."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
from float_tolerance import assert_loss_and_grads_close, training_terms
from tiny import random_tokens, tiny

from halyard.models import LmBatch

BATCH = LmBatch.from_tokens(random_tokens(4, 65, seed=2))


def _config(remat: str):  # type: ignore[no-untyped-def]
    return tiny("llama", remat=remat, hidden_size=64, intermediate_size=256, num_layers=3)


def _loss_and_grads(remat: str):  # type: ignore[no-untyped-def]
    config = _config(remat)
    params, static = eqx.partition(config.init(jax.random.key(0)), eqx.is_inexact_array)
    function = jax.jit(jax.value_and_grad(lambda p: eqx.combine(p, static).loss(BATCH)[0]))
    compiled = function.lower(params).compile()
    loss, grads = compiled(params)
    leaves = [np.asarray(g) for g in jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))]
    return float(loss), leaves, compiled.memory_analysis().temp_size_in_bytes


def test_save_attention_keeps_less_than_save_dots_and_computes_the_same() -> None:
    expected_loss, expected_grads, _ = _loss_and_grads("none")
    loss, grads, kept = _loss_and_grads("save_attention")
    # the rematerialised program may fuse, and so add up, otherwise: the training step's sums and the
    # cross-entropy's over the vocabulary
    terms = training_terms(_config("none"), 4, 64) + _config("none").vocab_size
    assert_loss_and_grads_close((loss, grads), (expected_loss, expected_grads), terms)
    _, _, dots = _loss_and_grads("save_dots")
    _, _, full = _loss_and_grads("full")
    assert full < kept < dots, (full, kept, dots)
