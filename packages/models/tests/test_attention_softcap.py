"""Logit soft-capping (Gemma 2): ``blocked`` equals ``reference`` in values and gradients, both equal
transformers' Gemma2 eager attention, and ``xla``/``cudnn`` (which cannot cap) are refused or avoided."""

from __future__ import annotations

import functools
import math
import re
import types
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention_implementations import (
    CASES,
    CASES_BY_NAME,
    Case,
    _inputs,
    _value_and_grads,
    case_tolerance,
)

from halyard.models.attention import attention, choose_implementation
from halyard.models.attention.layout import flatten_inputs
from halyard.named import NamedArray

# Scaled logits here are about N(0, 1), so a cap of 1.5 bends most of them.
SOFTCAP = 1.5
SUPPORTED = ("reference", "blocked", "splash", "auto")


@functools.cache
def _reference(case_name: str, logit_softcap: float | None) -> tuple:
    case = CASES_BY_NAME[case_name]
    output, grads = _value_and_grads(case, "reference", _inputs(case), case.mask(), logit_softcap)
    return (output.array, *(grad.array for grad in grads))


@pytest.mark.parametrize("implementation", ["blocked"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_capped_attention_matches_reference_values_and_gradients(case: Case, implementation: str) -> None:
    expected = _reference(case.name, SOFTCAP)
    output, grads = _value_and_grads(case, implementation, _inputs(case), case.mask(), SOFTCAP)
    actual = (output.array, *(grad.array for grad in grads))
    for name, got, want in zip(("output", "dquery", "dkey", "dvalue"), actual, expected, strict=True):
        bound = case_tolerance(case, want, gradient=name != "output")
        np.testing.assert_allclose(got, want, atol=bound, rtol=0, err_msg=name)


def test_the_cap_changes_values_and_gradients() -> None:
    """The comparisons above would pass vacuously if the cap did nothing."""
    case = CASES[0]
    for capped, uncapped in zip(_reference(case.name, SOFTCAP), _reference(case.name, None), strict=True):
        assert np.max(np.abs(np.asarray(capped) - np.asarray(uncapped))) > 1e-2


def _gemma2_eager(
    query: np.ndarray, key: np.ndarray, value: np.ndarray, visible: np.ndarray, scale: float
) -> np.ndarray:
    """transformers' Gemma2 ``eager_attention_forward`` on ``[batch, pos, heads, head_size]`` arrays."""
    torch = pytest.importorskip("torch")
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    def heads_first(array: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(array.transpose(0, 2, 1, 3)))

    module = types.SimpleNamespace(
        num_key_value_groups=query.shape[2] // key.shape[2], training=False, head_dim=query.shape[3]
    )
    additive = np.where(visible, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None]
    output, _ = eager_attention_forward(
        cast(Any, module),
        heads_first(query),
        heads_first(key),
        heads_first(value),
        torch.from_numpy(additive),
        scaling=scale,
        softcap=SOFTCAP,
    )
    return output.numpy()


@pytest.mark.parametrize("window", [None, 3])
def test_matches_transformers_gemma2_eager_attention(window: int | None) -> None:
    case = Case("gemma2", num_queries=7, num_keys=7, heads=4, kv_heads=2, window=window, scale=0.3)
    query, key, value = _inputs(case)
    mask = case.mask()
    visible = np.broadcast_to(
        np.asarray(mask.materialize(query.axis("pos"), key.axis("key_pos")).array), (2, 7, 7)
    )
    assert case.scale is not None
    expected = _gemma2_eager(
        np.asarray(query.array), np.asarray(key.array), np.asarray(value.array), visible, case.scale
    )
    for implementation in ("reference", "blocked"):
        run = functools.partial(
            attention, implementation=implementation, scale=case.scale, block_size=4, logit_softcap=SOFTCAP
        )
        actual = jax.jit(run)(query, key, value, mask)
        bound = case_tolerance(case, expected)
        np.testing.assert_allclose(actual.array, expected, atol=bound, rtol=0, err_msg=implementation)


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_auto_picks_blocked_when_capped(backend: str) -> None:
    query, key, value = _inputs(CASES[0])
    flat = flatten_inputs(query, key, value, CASES[0].mask())
    assert choose_implementation(flat, backend=backend, logit_softcap=SOFTCAP) == "blocked"


@pytest.mark.parametrize("implementation", ["xla", "cudnn"])
def test_implementations_without_capping_refuse_a_cap(implementation: str) -> None:
    (query, key, value), mask = _inputs(CASES[0]), CASES[0].mask()
    message = f"implementation='{implementation}' has no logit soft-capping; .*" + re.escape(str(SUPPORTED))
    with pytest.raises(ValueError, match=message):
        attention(query, key, value, mask, implementation=implementation, logit_softcap=SOFTCAP)


@pytest.mark.parametrize("cap", [0.0, -1.0, math.nan, math.inf, True, "50"])
def test_bad_caps_are_refused(cap: object) -> None:
    (query, key, value), mask = _inputs(CASES[0]), CASES[0].mask()
    with pytest.raises(ValueError, match="attention: logit_softcap must be a positive finite number"):
        attention(query, key, value, mask, implementation="reference", logit_softcap=cap)  # type: ignore[arg-type]


@pytest.mark.parametrize("implementation", ["reference", "blocked"])
def test_no_cap_adds_no_operation(implementation: str) -> None:
    """The uncapped program (forward and backward) holds no tanh; the capped one does."""
    (query, key, value), mask = _inputs(CASES[0]), CASES[0].mask()

    def program(logit_softcap: float | None) -> str:
        def loss(query: NamedArray) -> jax.Array:
            output = attention(
                query, key, value, mask, implementation=implementation, logit_softcap=logit_softcap
            )
            return jnp.sum(output.array)

        return str(jax.make_jaxpr(jax.grad(loss))(query))

    assert "tanh" not in program(None)
    assert "tanh" in program(SOFTCAP)
