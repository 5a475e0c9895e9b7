"""Scanned and unrolled layers, and every remat policy, compute the same values and gradients."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import numpy as np
import pytest
from float_tolerance import assert_loss_and_grads_close, training_terms
from tiny import VOCAB, tiny

from halyard.models import LmBatch, init_model


def _loss_and_grads(config, batch):
    model = init_model(config, jax.random.key(0))
    loss, grads = eqx.filter_jit(eqx.filter_value_and_grad(lambda m: m.loss(batch)[0]))(model)
    return float(loss), [np.asarray(g) for g in jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))]


BATCH = LmBatch.from_tokens(np.random.default_rng(0).integers(0, VOCAB, size=(2, 9)))
BASE = tiny("gpt2", num_layers=4)


@functools.cache
def _plain_scan() -> tuple[float, list[np.ndarray]]:
    return _loss_and_grads(BASE, BATCH)


@pytest.mark.parametrize(
    "scan,remat", [(False, "none"), (True, "full"), (True, "save_dots"), (True, "nested"), (True, "offload")]
)
def test_execution_modes_agree_with_a_plain_scan(scan: bool, remat: str) -> None:
    expected_loss, expected_grads = _plain_scan()
    config = BASE.replace(scan_layers=scan, remat=remat)
    # the same sums, which XLA may fuse and order otherwise in each mode
    terms = training_terms(config, BATCH.tokens.axis_size("batch"), BATCH.tokens.axis_size("pos"))
    assert_loss_and_grads_close(_loss_and_grads(config, BATCH), (expected_loss, expected_grads), terms)


def test_switching_execution_mode_keeps_the_parameter_tree() -> None:
    scanned = init_model(tiny("llama"), jax.random.key(0))
    unrolled = init_model(tiny("llama", scan_layers=False, remat="full"), jax.random.key(0))
    scanned_leaves = jax.tree_util.tree_leaves_with_path(scanned)
    unrolled_leaves = jax.tree_util.tree_leaves_with_path(unrolled)
    assert [jax.tree_util.keystr(p) for p, _ in scanned_leaves] == [
        jax.tree_util.keystr(p) for p, _ in unrolled_leaves
    ]
    for (_, a), (_, b) in zip(scanned_leaves, unrolled_leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
