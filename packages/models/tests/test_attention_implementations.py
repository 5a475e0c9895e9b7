"""Every attention implementation equals `reference` in values and gradients (float32, 1e-5)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import attention_terms, summation_tolerance

from halyard.models.attention import AttentionMask, attention
from halyard.models.attention.block_pairs import static_visible_pairs
from halyard.models.attention.cudnn import has_nvidia_gpu
from halyard.named import NamedArray, named

IMPLEMENTATIONS = ["xla", "blocked"]


@dataclass(frozen=True)
class Case:
    """One attention problem: sizes plus a mask built from numpy arrays."""

    name: str
    batch: int = 2
    num_queries: int = 13
    num_keys: int = 13
    heads: int = 4
    kv_heads: int = 4
    head_size: int = 8
    causal: bool = True
    window: int | None = None
    segments: list | None = None
    key_segments: list | None = None
    query_positions: list | None = None
    key_valid: list | None = None
    block_size: int = 4
    scale: float | None = None
    extra: dict = field(default_factory=dict)

    def mask(self) -> AttentionMask:
        def per_batch(values: list | None, axis: str) -> NamedArray | None:
            return None if values is None else named(jnp.asarray(values), ("batch", axis))

        return AttentionMask(
            causal=self.causal,
            sliding_window=self.window,
            segment_ids=per_batch(self.segments, "pos"),
            key_segment_ids=per_batch(self.key_segments, "key_pos"),
            query_positions=per_batch(self.query_positions, "pos"),
            key_valid=per_batch(self.key_valid, "key_pos"),
        )


PACKED = [[0] * 5 + [1] * 6 + [2] * 2, [3] * 9 + [4] * 4]
# Row 0 is left-padded, row 1 right-padded; row 1's segment 4 then has no visible key at all.
PADDING = [[False] * 4 + [True] * 9, [True] * 9 + [False] * 4]
CASES = [
    # GQA + packed documents + padding; 13 is not a multiple of the block size; some rows see nothing.
    Case("causal_gqa_segments_padding", heads=6, kv_heads=2, segments=PACKED, key_valid=PADDING),
    # Sliding window with multi-query attention and no per-token arrays (the default positions path).
    Case("window_mqa", heads=4, kv_heads=1, window=4),
    # KV-cache decoding: 3 new tokens at absolute positions, unfilled cache slots, window, GQA.
    Case(
        "decode_window_gqa",
        num_queries=3,
        num_keys=11,
        heads=4,
        kv_heads=2,
        query_positions=[[5, 6, 7], [8, 9, 10]],
        window=4,
        key_valid=[[True] * 8 + [False] * 3, [True] * 11],
    ),
    # Bidirectional attention between different query and key lengths with separate key segment ids.
    Case(
        "bidirectional_cross_segments",
        num_queries=6,
        num_keys=9,
        causal=False,
        segments=[[0, 0, 1, 1, 1, 2], [0] * 6],
        key_segments=[[0, 0, 0, 1, 1, 1, 1, 2, 2], [0] * 5 + [1] * 4],
    ),
    # Plain causal, one block bigger than the sequence, muP's 1/head_size scale.
    Case("causal_single_block_mup_scale", block_size=64, scale=1.0 / 8),
    # Default positions with more visible block pairs than the blocked kernel unrolls (55 > 16): the
    # scanned driver with conditionals, on packed documents.
    Case("causal_many_blocks_scanned", num_queries=38, num_keys=38, segments=[[0] * 20 + [1] * 18] * 2),
    # Default positions, a window of 3 with blocks of 2: the unrolled driver leaves out far pairs.
    Case("window_small_blocks_unrolled", num_queries=11, num_keys=11, window=3, block_size=2),
]
CASES_BY_NAME = {case.name: case for case in CASES}


def case_tolerance(case: Case, want: Any, gradient: bool = False) -> float:
    """The bound on ``case``'s output (or, with ``gradient``, its query/key/value gradients) of two
    implementations (`attention_terms`, the blocked one's key blocks included), scaled by ``want``."""
    queries_per_key = case.num_queries * case.heads // case.kv_heads if gradient else 0
    blocks = -(-case.num_keys // case.block_size)
    return summation_tolerance(want, attention_terms(case.head_size, case.num_keys, blocks, queries_per_key))


def _jitted(implementation: str, **options: Any):
    """``attention`` compiled as one program (eager mode would compile every small op separately)."""
    return jax.jit(functools.partial(attention, implementation=implementation, **options))


def _inputs(case: Case, dtype: jnp.dtype = jnp.float32) -> tuple[NamedArray, NamedArray, NamedArray]:
    rng = np.random.default_rng(len(case.name))
    query = rng.normal(size=(case.batch, case.num_queries, case.heads, case.head_size))
    key = rng.normal(size=(case.batch, case.num_keys, case.kv_heads, case.head_size))
    value = rng.normal(size=(case.batch, case.num_keys, case.kv_heads, case.head_size))
    return (
        named(jnp.asarray(query, dtype), ("batch", "pos", "heads", "head_size")),
        named(jnp.asarray(key, dtype), ("batch", "key_pos", "kv_heads", "head_size")),
        named(jnp.asarray(value, dtype), ("batch", "key_pos", "kv_heads", "head_size")),
    )


def _value_and_grads(
    case: Case, implementation: str, inputs: tuple, mask: AttentionMask, logit_softcap: float | None = None
) -> tuple:
    rng = np.random.default_rng(1)
    cotangent = jnp.asarray(rng.normal(size=inputs[0].array.shape), inputs[0].dtype)

    def loss(query: NamedArray, key: NamedArray, value: NamedArray, mask: AttentionMask) -> tuple:
        output = attention(
            query,
            key,
            value,
            mask,
            implementation=implementation,
            scale=case.scale,
            block_size=case.block_size,
            logit_softcap=logit_softcap,
        )
        return jnp.sum(output.array * cotangent), output

    (_, output), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*inputs, mask)
    return output, grads


@functools.cache
def _reference(case_name: str) -> tuple:
    case = CASES_BY_NAME[case_name]
    return _value_and_grads(case, "reference", _inputs(case), case.mask())


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference_values_and_gradients(case: Case, implementation: str) -> None:
    inputs, mask = _inputs(case), case.mask()
    expected, expected_grads = _reference(case.name)
    actual, actual_grads = _value_and_grads(case, implementation, inputs, mask)
    assert actual.axes == expected.axes == inputs[0].axes
    np.testing.assert_allclose(
        actual.array, expected.array, atol=case_tolerance(case, expected.array), rtol=0
    )
    for name, got, want in zip(("query", "key", "value"), actual_grads, expected_grads):
        assert got.axes == want.axes
        bound = case_tolerance(case, want.array, gradient=True)
        np.testing.assert_allclose(got.array, want.array, atol=bound, rtol=0, err_msg=f"d{name}")


def _numpy_attention(
    query: np.ndarray, key: np.ndarray, value: np.ndarray, visible: np.ndarray, scale: float
):
    """Loops over batch and heads in float64: an implementation independent of JAX."""
    batch, num_queries, heads, _ = query.shape
    group = heads // key.shape[2]
    output = np.zeros(query.shape)
    for b in range(batch):
        for h in range(heads):
            logits = query[b, :, h] @ key[b, :, h // group].T * scale
            for i in range(num_queries):
                seen = visible[b, i]
                if not seen.any():
                    continue
                weights = np.exp(logits[i, seen] - logits[i, seen].max())
                output[b, i, h] = weights @ value[b][seen, h // group] / weights.sum()
    return output


@pytest.mark.parametrize(
    ("num_queries", "block", "causal", "window"),
    [(13, 4, True, None), (11, 2, True, 3), (11, 2, False, 3), (9, 4, False, None), (38, 4, True, 5)],
)
def test_static_visible_pairs_are_exactly_the_pairs_with_a_visible_key(
    num_queries: int, block: int, causal: bool, window: int | None
) -> None:
    positions = np.arange(num_queries)
    seen = np.ones((num_queries, num_queries), bool)
    if causal:
        seen &= positions[None, :] <= positions[:, None]
    if window is not None:
        seen &= positions[None, :] > positions[:, None] - window
    blocks = -(-num_queries // block)
    expected = tuple(
        (i, j)
        for i in range(blocks)
        for j in range(blocks)
        if seen[i * block : (i + 1) * block, j * block : (j + 1) * block].any()
    )
    pairs = static_visible_pairs(num_queries, num_queries, block, block, causal=causal, sliding_window=window)
    assert pairs == expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_numpy_loops(case: Case) -> None:
    query, key, value = _inputs(case)
    mask = case.mask()
    visible = np.broadcast_to(
        np.asarray(mask.materialize(query.axis("pos"), key.axis("key_pos")).array),
        (case.batch, case.num_queries, case.num_keys),
    )
    scale = case.scale or 1 / np.sqrt(case.head_size)
    query64, key64, value64 = (np.asarray(x.array, np.float64) for x in (query, key, value))
    expected = _numpy_attention(query64, key64, value64, visible=visible, scale=scale)
    actual = _jitted("reference", scale=case.scale)(query, key, value, mask)
    np.testing.assert_allclose(actual.array, expected, atol=case_tolerance(case, expected), rtol=0)


@pytest.mark.parametrize("implementation", ["reference", *IMPLEMENTATIONS])
def test_fully_masked_rows_are_zero_with_finite_gradients(implementation: str) -> None:
    case = CASES_BY_NAME["causal_gqa_segments_padding"]
    if implementation == "reference":
        output, grads = _reference(case.name)
    else:
        output, grads = _value_and_grads(case, implementation, _inputs(case), case.mask())
    # Row 0's first 4 queries see only padding; row 1's segment 4 (positions 9..12) lost its keys.
    hidden = np.zeros((2, 13), bool)
    hidden[0, :4] = True
    hidden[1, 9:] = True
    output_array = np.asarray(output.array)
    assert np.all(output_array[hidden] == 0)
    assert np.all(np.abs(output_array[~hidden]).sum(axis=(-1, -2)) > 0)
    for grad in grads:
        assert np.all(np.isfinite(np.asarray(grad.array)))
    assert np.all(np.asarray(grads[0].array)[hidden] == 0)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_extra_batch_axes_and_any_axis_order(implementation: str) -> None:
    rng = np.random.default_rng(3)

    def random(axes: tuple[str, ...], sizes: dict[str, int]) -> NamedArray:
        return named(jnp.asarray(rng.normal(size=[sizes[a] for a in axes]), jnp.float32), axes)

    sizes = {"beam": 2, "batch": 2, "pos": 7, "key_pos": 7, "heads": 3, "kv_heads": 1, "head_size": 8}
    query = random(("heads", "beam", "pos", "batch", "head_size"), sizes)
    key = random(("key_pos", "batch", "beam", "kv_heads", "head_size"), sizes)
    value = random(("batch", "beam", "key_pos", "head_size", "kv_heads"), sizes)
    # Segment ids vary over batch only: they broadcast over beam by name.
    segments = named(jnp.asarray([[0, 0, 0, 1, 1, 1, 1], [0] * 7]), ("batch", "pos"))
    mask = AttentionMask(segment_ids=segments, sliding_window=3)
    expected = _jitted("reference")(query, key, value, mask)
    actual = _jitted(implementation, block_size=2)(query, key, value, mask)
    assert actual.axes == query.axes
    bound = summation_tolerance(expected.array, attention_terms(8, 7, key_blocks=4))  # 7 keys in blocks of 2
    np.testing.assert_allclose(actual.array, expected.array, atol=bound, rtol=0)


def test_bfloat16_inputs_keep_their_dtype_and_stay_close() -> None:
    case = CASES_BY_NAME["causal_gqa_segments_padding"]
    inputs32 = _inputs(case)
    inputs16 = tuple(x.astype(jnp.bfloat16) for x in inputs32)
    expected, _ = _reference(case.name)
    for implementation in ["reference", *IMPLEMENTATIONS]:
        actual = _jitted(implementation, block_size=4)(*inputs16, case.mask())
        assert actual.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(actual.array, np.float32), expected.array, atol=5e-2)


if has_nvidia_gpu():
    # Defined only where cuDNN can run (an NVIDIA GPU); cuDNN takes half precision, hence the tolerances.

    @pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
    def test_cudnn_matches_reference_on_gpu(case: Case) -> None:
        inputs = tuple(x.astype(jnp.bfloat16) for x in _inputs(case))
        mask = case.mask()
        expected, expected_grads = _value_and_grads(case, "reference", inputs, mask)
        actual, actual_grads = _value_and_grads(case, "cudnn", inputs, mask)
        np.testing.assert_allclose(
            np.asarray(actual.array, np.float32), np.asarray(expected.array, np.float32), atol=2e-2
        )
        for got, want in zip(actual_grads, expected_grads):
            np.testing.assert_allclose(
                np.asarray(got.array, np.float32), np.asarray(want.array, np.float32), atol=5e-2
            )
