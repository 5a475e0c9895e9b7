"""The vocabulary-blocked loss through a whole model: tied embeddings, Gemma 2's final soft-cap and the z-loss,
one device and FSDP over 8 simulated devices; each equals the full-logits loss in value and gradients."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import pytest
from float_tolerance import assert_loss_and_grads_close, training_terms
from tiny import VOCAB, tiny

from halyard.models import LmBatch, init_model
from halyard.shard import Layout, MeshSpec, init_sharded, use_layout

BATCH = LmBatch.from_tokens(np.random.default_rng(1).integers(0, VOCAB, size=(8, 17)))
FULL = {"loss_block_size": None}
BLOCKED = {"loss_block_size": 16, "loss_full_logits_max_mib": 0}  # 61 = 3 blocks of 16 and a padded one


def _loss_and_grads(model) -> tuple[float, list[np.ndarray]]:  # type: ignore[no-untyped-def]
    value_and_grad = eqx.filter_jit(eqx.filter_value_and_grad(lambda m: m.loss(BATCH, z_loss_weight=1e-2)[0]))
    loss, grads = value_and_grad(model)
    return float(loss), [np.asarray(g) for g in jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))]


@pytest.mark.parametrize(
    ("family", "overrides", "on_mesh"),
    [
        ("llama", {"tie_embeddings": True}, True),
        (
            "gemma2",
            {"final_logit_softcapping": 5.0, "intermediate_size": 48, "num_kv_heads": 2, "head_dim": 8},
            False,
        ),
    ],
    ids=["llama-tied", "gemma2-tied-softcap"],
)
def test_blocked_loss_equals_full_logits_on_one_device_and_under_fsdp(
    family: str, overrides: dict, on_mesh: bool
) -> None:
    """Llama on one device and under FSDP; Gemma 2 (its cap, the suite's time) on one device."""
    if on_mesh and jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    full = tiny(family, **overrides, **FULL)
    blocked = tiny(family, **overrides, **BLOCKED)
    expected_loss, expected_grads = _loss_and_grads(init_model(full, jax.random.key(0)))
    loss, grads = _loss_and_grads(init_model(blocked, jax.random.key(0)))
    # the step's sums, the cross-entropy's over the vocabulary, and the blocked one's rescaling per block
    terms = training_terms(full, 8, 16) + 2 * VOCAB
    assert_loss_and_grads_close((loss, grads), (expected_loss, expected_grads), terms)
    if not on_mesh:
        return
    layout, mesh = Layout.fsdp(min_shard=0, tolerance=1.0), MeshSpec(data=1, fsdp=8).build()
    sharded_model = init_sharded(blocked.init, layout, mesh, jax.random.key(0))
    assert any(len(leaf.sharding.device_set) == 8 for leaf in jax.tree.leaves(sharded_model))
    with use_layout(layout, mesh):
        sharded_loss, sharded_grads = _loss_and_grads(sharded_model)
    assert_loss_and_grads_close((sharded_loss, sharded_grads), (expected_loss, expected_grads), terms)
