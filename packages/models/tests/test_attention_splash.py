"""The Pallas splash kernel (`halyard.models.attention.splash`) in Pallas's interpret mode on CPU: the code
the TPU runs, checked against `reference` in values and gradients (float32) for causal, sliding-window,
bidirectional, packed-document, soft-capped and grouped-query attention, on one device and inside
``shard_map`` on 8 simulated devices; what it cannot run is refused in one line naming the field."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import assert_loss_and_grads_close, attention_terms, summation_tolerance, training_terms
from tiny import random_tokens, tiny

from halyard.models import model_config
from halyard.models.attention import AttentionMask, attention, choose_implementation
from halyard.models.attention.layout import flatten_inputs
from halyard.models.attention.splash import SplashBlockSizes
from halyard.models.batch import LmBatch
from halyard.named import NamedArray, named
from halyard.shard import Layout, MeshSpec, use_layout

SMALL_BLOCKS = SplashBlockSizes(query=128, key=128, key_compute=128, backward_query=128, backward_key=128)


@dataclass(frozen=True)
class Case:
    name: str
    length: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_size: int = 32
    causal: bool = True
    window: int | None = None
    packed: bool = False
    softcap: float | None = None
    blocks: SplashBlockSizes = SMALL_BLOCKS

    def mask(self) -> AttentionMask:
        segments = None
        if self.packed:  # three documents in row 0, one in row 1
            ids = np.zeros((2, self.length), np.int32)
            ids[0, self.length // 3 :] = 1
            ids[0, 2 * self.length // 3 :] = 2
            segments = named(jnp.asarray(ids), ("batch", "pos"))
        return AttentionMask(causal=self.causal, sliding_window=self.window, segment_ids=segments)


CASES = [
    # GQA, packed documents, 2 x 2 blocks (the masked upper block is skipped).
    Case("causal_gqa_packed", packed=True),
    # Multi-query attention with a window smaller than a block: blocks outside it are skipped.
    Case("window_mqa", kv_heads=1, window=40),
    # Not a multiple of 128: padded keys hidden by a segment id, padded queries dropped; bidirectional.
    Case("bidirectional_padded_window_packed", length=200, causal=False, window=50, packed=True),
    # Gemma 2's attention logit soft-cap, GQA, with the fused backward kernel and default (clipped) blocks.
    Case("softcap_fused_backward", softcap=5.0, blocks=SplashBlockSizes(fused_backward=True)),
]


def _inputs(case: Case) -> tuple[NamedArray, NamedArray, NamedArray, jax.Array]:
    keys = jax.random.split(jax.random.key(len(case.name)), 4)
    query = jax.random.normal(keys[0], (2, case.length, case.heads, case.head_size))
    key = jax.random.normal(keys[1], (2, case.length, case.kv_heads, case.head_size))
    value = jax.random.normal(keys[2], (2, case.length, case.kv_heads, case.head_size))
    cotangent = jax.random.normal(keys[3], query.shape)
    return (
        named(query, ("batch", "pos", "heads", "head_size")),
        named(key, ("batch", "key_pos", "kv_heads", "head_size")),
        named(value, ("batch", "key_pos", "kv_heads", "head_size")),
        cotangent,
    )


def assert_output_and_grads_close(case: Case, got: tuple, want: tuple) -> None:
    """``(output, (dquery, dkey, dvalue))`` of two implementations (or meshes) equal to the order of
    `attention_terms` of ``case`` (every key block of 128 keys rescales the softmax)."""
    blocks = -(-case.length // 128)
    output_bound = summation_tolerance(want[0], attention_terms(case.head_size, case.length, blocks))
    np.testing.assert_allclose(got[0], want[0], atol=output_bound, rtol=0)
    queries_per_key = case.length * case.heads // case.kv_heads
    terms = attention_terms(case.head_size, case.length, blocks, queries_per_key)
    for name, a, b in zip(("query", "key", "value"), got[1], want[1], strict=True):
        np.testing.assert_allclose(
            a.array, b.array, atol=summation_tolerance(b.array, terms), rtol=0, err_msg=f"d{name}"
        )


def _output_and_grads(case: Case, implementation: str) -> tuple[jax.Array, tuple]:
    query, key, value, cotangent = _inputs(case)
    run = functools.partial(
        attention,
        mask=case.mask(),
        implementation=implementation,
        logit_softcap=case.softcap,
        splash_block_sizes=case.blocks,
    )

    def output_and_grads(query: NamedArray, key: NamedArray, value: NamedArray) -> tuple:
        output, pullback = jax.vjp(lambda q, k, v: run(q, k, v).array, query, key, value)
        return output, pullback(cotangent)

    return jax.jit(output_and_grads)(query, key, value)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_splash_matches_reference_values_and_gradients(case: Case) -> None:
    assert_output_and_grads_close(
        case, _output_and_grads(case, "splash"), _output_and_grads(case, "reference")
    )


def test_splash_inside_shard_map_on_8_devices_matches_one_device() -> None:
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    case = Case("sharded_gqa_packed", length=128, heads=8, kv_heads=4, packed=True)
    expected = _output_and_grads(case, "splash")
    with use_layout(Layout.fsdp(), MeshSpec(data=2, fsdp=4).build()):
        assert_output_and_grads_close(case, _output_and_grads(case, "splash"), expected)


def test_bfloat16_inputs_stay_bfloat16_and_close() -> None:
    case = CASES[0]
    query, key, value, _ = _inputs(case)
    expected = attention(query, key, value, case.mask(), implementation="reference")
    low = [x.astype(jnp.bfloat16) for x in (query, key, value)]
    actual = attention(*low, case.mask(), implementation="splash", splash_block_sizes=SMALL_BLOCKS)
    assert actual.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(actual.array, np.float32), expected.array, atol=5e-2)


def test_auto_picks_splash_on_tpu_for_training_masks_only() -> None:
    case = CASES[0]
    query, key, value, _ = _inputs(case)
    training = flatten_inputs(query, key, value, case.mask())
    assert choose_implementation(training, backend="tpu") == "splash"
    assert choose_implementation(training, backend="tpu", logit_softcap=30.0) == "splash"
    assert choose_implementation(training, backend="cpu") == "blocked"
    positions = named(jnp.arange(case.length, dtype=jnp.int32), ("pos",))
    decoding = flatten_inputs(query, key, value, AttentionMask(query_positions=positions))
    assert choose_implementation(decoding, backend="tpu") != "splash"


@pytest.mark.parametrize(
    ("field", "mask"),
    [
        ("key_valid", lambda n: AttentionMask(key_valid=named(jnp.ones((n,), bool), ("key_pos",)))),
        ("positions", lambda n: AttentionMask(query_positions=named(jnp.arange(n), ("pos",)))),
    ],
)
def test_unsupported_masks_are_refused_in_one_line(field: str, mask) -> None:  # type: ignore[no-untyped-def]
    query, key, value, _ = _inputs(Case("refused", length=128))
    with pytest.raises(ValueError, match=f"attention\\(implementation='splash'\\): .*{field}") as error:
        attention(query, key, value, mask(128), implementation="splash")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"key": 100}, "model.splash_block_sizes.key=100 must be a multiple of 128"),
        (
            {"key": 256, "key_compute": 384},
            "model.splash_block_sizes.key=256 must be a multiple of key_compute",
        ),
        ({"query": 0}, "model.splash_block_sizes.query must be a positive int"),
    ],
)
def test_bad_block_sizes_name_the_key(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SplashBlockSizes(**overrides)


def test_a_model_with_splash_has_the_reference_models_loss_and_gradients() -> None:
    """Through the model config (``attention_implementation: splash``): a tiny Llama on packed documents."""
    segments = np.zeros((2, 129), np.int32)
    segments[0, 50:] = 1
    batch = LmBatch.from_tokens(random_tokens(2, 129), segment_ids=jnp.asarray(segments))
    results = []
    for implementation in ("reference", "splash"):
        config = tiny("llama", attention_implementation=implementation, splash_block_sizes=SMALL_BLOCKS)
        model = config.init(jax.random.key(0))
        loss_and_grads = eqx.filter_jit(eqx.filter_value_and_grad(lambda m: m.loss(batch)[0]))
        results.append(loss_and_grads(model))
    (expected, expected_grads), (actual, actual_grads) = results
    terms = training_terms(tiny("llama"), 2, 128) + tiny("llama").vocab_size  # + the cross-entropy's sum
    assert_loss_and_grads_close(
        (float(actual), [np.asarray(leaf) for leaf in jax.tree.leaves(actual_grads)]),
        (float(expected), [np.asarray(leaf) for leaf in jax.tree.leaves(expected_grads)]),
        terms,
    )
    with pytest.raises(ValueError, match="attention_implementation='flash'"):
        model_config("llama", attention_implementation="flash")


@pytest.mark.parametrize(
    ("remat", "recomputed"), [("save_dots", False), ("save_attention", False), ("full", True)]
)
def test_the_backward_reads_the_kernels_residuals_instead_of_running_its_forward_again(
    remat: str, recomputed: bool
) -> None:
    # A layer (a projection, then splash attention) under the remat policy, differentiated and compiled: the
    # policies that keep kernel residuals run the splash forward kernel in the forward pass only; "full" runs
    # it in the backward pass's recomputation (the op names of the compiled program say where each runs).
    from halyard.named.nn.remat import checkpoint_layer

    case = Case("remat", length=128)
    query, key, value, _ = _inputs(case)

    def layer(weight: jax.Array) -> jax.Array:
        projected = NamedArray(query.array @ weight, query.axes)
        output = attention(
            projected, key, value, case.mask(), implementation="splash", splash_block_sizes=SMALL_BLOCKS
        )
        return output.array.sum()

    program = (
        jax.jit(jax.grad(checkpoint_layer(layer, remat))).lower(jnp.eye(case.head_size)).compile().as_text()
    )
    forward_kernels = set(re.findall(r'"[^"]*splash_mha_fwd', program))
    assert forward_kernels, "the splash forward kernel is in the program"
    assert any("rematted_computation" in name for name in forward_kernels) == recomputed, forward_kernels
