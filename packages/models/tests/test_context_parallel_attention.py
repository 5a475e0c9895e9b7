"""Context-parallel attention on 8 simulated devices (data 2 x sequence 4): ring, all_gather and ulysses
give the values and gradients of the single-device blocked kernel (float32, within 2e-5), for causal,
sliding-window, packed-segment and soft-capped masks with grouped-query attention, in the natural and the
load-balanced order; and each runs its own collectives."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from halyard.models.attention import AttentionMask, attention
from halyard.models.context_order import causal_blocks_per_device, load_balanced_order
from halyard.named import named
from halyard.shard import Layout, MeshSpec, use_layout

BATCH, LENGTH, HEADS, KV_HEADS, HEAD_SIZE = 2, 64, 8, 4, 8
BLOCK = 8  # 2 query blocks per device: block skipping inside a device's share is exercised too
TOLERANCE = 2e-5
COLLECTIVE = {"ring": "collective-permute", "all_gather": "all-gather", "ulysses": "all-to-all"}


@pytest.fixture(scope="module")
def mesh() -> jax.sharding.Mesh:
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return MeshSpec(data=2, sequence=4).build()


def _inputs(seed: int) -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.key(seed), 4)
    segments = np.zeros((BATCH, LENGTH), np.int32)
    segments[0, 21:] = 1  # row 0: three packed documents, boundaries inside device shares
    segments[0, 50:] = 2
    return {
        "query": jax.random.normal(keys[0], (BATCH, LENGTH, HEADS, HEAD_SIZE)),
        "key": jax.random.normal(keys[1], (BATCH, LENGTH, KV_HEADS, HEAD_SIZE)),
        "value": jax.random.normal(keys[2], (BATCH, LENGTH, KV_HEADS, HEAD_SIZE)),
        "cotangent": jax.random.normal(keys[3], (BATCH, LENGTH, HEADS, HEAD_SIZE)),
        "segments": jnp.asarray(segments),
    }


def _output_and_grads(inputs, *, window, softcap, order, context_parallel):  # type: ignore[no-untyped-def]
    """The attention output, the gradients of <output, cotangent> in query, key and value, and the HLO of
    the compiled program (traced under the caller's layout)."""
    take = (lambda x: x) if order is None else (lambda x: jnp.take(x, order, axis=1))
    positions = None if order is None else jnp.asarray(order, jnp.int32)

    def run(query, key, value):  # type: ignore[no-untyped-def]
        mask = AttentionMask(
            causal=True,
            sliding_window=window,
            segment_ids=named(take(inputs["segments"]), ("batch", "pos")),
            query_positions=None if positions is None else named(positions, ("pos",)),
            key_positions=None if positions is None else named(positions, ("key_pos",)),
        )
        output = attention(
            named(query, ("batch", "pos", "heads", "head_size")),
            named(key, ("batch", "key_pos", "kv_heads", "head_size")),
            named(value, ("batch", "key_pos", "kv_heads", "head_size")),
            mask,
            implementation="blocked",
            block_size=BLOCK,
            logit_softcap=softcap,
            context_parallel=context_parallel,
        )
        return output.array

    def output_and_grads(query, key, value, cotangent):  # type: ignore[no-untyped-def]
        output, pullback = jax.vjp(run, query, key, value)
        return output, pullback(cotangent)

    arguments = tuple(take(inputs[name]) for name in ("query", "key", "value", "cotangent"))
    lowered = jax.jit(output_and_grads).lower(*arguments)
    output, grads = lowered.compile()(*arguments)
    return output, grads, lowered.as_text("hlo")


MASKS = {
    "causal+segments+softcap": {"window": None, "softcap": 5.0},
    "sliding_window+segments": {"window": 12, "softcap": None},
}


@pytest.mark.parametrize("implementation", ["ring", "all_gather", "ulysses"])
@pytest.mark.parametrize("masks", list(MASKS))
@pytest.mark.parametrize("balanced", [False, True], ids=["natural", "load_balanced"])
def test_context_parallel_equals_the_single_device_kernel(mesh, implementation, masks, balanced) -> None:  # type: ignore[no-untyped-def]
    inputs = _inputs(seed=len(masks) + balanced)
    order = load_balanced_order(LENGTH, 4) if balanced else None
    settings = dict(MASKS[masks], order=order)
    expected_output, expected_grads, single_hlo = _output_and_grads(inputs, context_parallel=None, **settings)
    assert COLLECTIVE[implementation] not in single_hlo
    with use_layout(Layout.data_parallel(), mesh):
        output, grads, hlo = _output_and_grads(inputs, context_parallel=implementation, **settings)
    assert COLLECTIVE[implementation] in hlo, f"{implementation} ran without its {COLLECTIVE[implementation]}"
    np.testing.assert_allclose(output, expected_output, atol=TOLERANCE, rtol=TOLERANCE)
    for name, actual, expected in zip(("query", "key", "value"), grads, expected_grads, strict=True):
        np.testing.assert_allclose(actual, expected, atol=TOLERANCE, rtol=TOLERANCE, err_msg=name)


def test_the_load_balanced_order_gives_every_device_the_same_causal_work() -> None:
    parts, length = 4, 64
    order = load_balanced_order(length, parts)
    assert sorted(order) == list(range(length))
    assert causal_blocks_per_device(order, parts, BLOCK) == [9] * parts
    # The plain split: the last device computes 5 times the blocks of the first.
    assert causal_blocks_per_device(np.arange(length), parts, BLOCK) == [3, 7, 11, 15]
    with pytest.raises(ValueError, match="divisible by 2 \\* 4 = 8"):
        load_balanced_order(60, 4)


def test_ulysses_refuses_heads_that_do_not_divide(mesh) -> None:  # type: ignore[no-untyped-def]
    inputs = _inputs(seed=0)
    three_heads = {**inputs, "key": inputs["key"][:, :, :2], "value": inputs["value"][:, :, :2]}
    with use_layout(Layout.data_parallel(), mesh), pytest.raises(ValueError, match="kv_heads \\(2\\)"):
        _output_and_grads(three_heads, window=None, softcap=None, order=None, context_parallel="ulysses")
