"""Batch-invariant arithmetic (`halyard.named.nn.batch_invariant`): a row's numbers are the same bits whatever
the number of rows beside it and its place among them, where XLA's own products and sums are not (each
test first shows the plain operation differing, so it can fail); values and gradients stay those of the
plain operations to rounding; `unfuse_multiply_add` changes the environment only while it can take effect."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance

from halyard.named import Axis, named
from halyard.named.nn import (
    ROW_BLOCK,
    UNFUSED_FLAG,
    Linear,
    RMSNorm,
    batch_invariant,
    invariant_rows,
    row_log_softmax,
    row_softmax,
    row_sum,
    unfuse_multiply_add,
)

Embed, Hidden = Axis("embed", 256), Axis("hidden", 256)
ROWS = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
LINEAR = Linear.init(Embed, Hidden, key=jax.random.key(0), use_bias=False)


def _linear(invariant: bool):
    def apply(rows: jax.Array) -> jax.Array:
        with batch_invariant() if invariant else contextlib.nullcontext():
            return LINEAR(named(rows, ("batch", "embed"))).array

    return jax.jit(apply)


def _differs_somewhere(apply, reference: np.ndarray) -> bool:
    """Whether some leading slice of `ROWS`, or a rotation of its first rows, gets other bits than
    ``reference`` (the whole batch's result) for the same rows."""
    for count in (1, 5, 32, 33, 100):
        if not np.array_equal(np.asarray(apply(jnp.asarray(ROWS[:count]))), reference[:count]):
            return True
    rotated = np.asarray(apply(jnp.asarray(np.roll(ROWS[:64], 7, axis=0))))
    return not np.array_equal(np.roll(rotated, -7, axis=0), reference[:64])


def test_linear_rows_are_bitwise_invariant_inside_the_context() -> None:
    plain, invariant = _linear(False), _linear(True)
    assert _differs_somewhere(plain, np.asarray(plain(jnp.asarray(ROWS))))  # XLA rounds by row count
    reference = np.asarray(invariant(jnp.asarray(ROWS)))
    assert not _differs_somewhere(invariant, reference)
    weight = np.abs(np.asarray(LINEAR.weight.array)).reshape(Embed.size, Hidden.size)  # [embed, hidden]
    bound = summation_tolerance(np.abs(ROWS) @ weight, Embed.size)  # the 256 products in another order
    np.testing.assert_allclose(reference, np.asarray(plain(jnp.asarray(ROWS))), atol=bound, rtol=0)


def test_linear_gradients_inside_the_context_equal_the_plain_ones() -> None:
    def loss(layer: Linear, rows: jax.Array, invariant: bool) -> jax.Array:
        with batch_invariant() if invariant else contextlib.nullcontext():
            return jnp.sum(jnp.sin(layer(named(rows, ("batch", "embed"))).array))

    rows = jnp.asarray(ROWS[:70])
    plain = jax.grad(loss, argnums=(0, 1))(LINEAR, rows, False)
    invariant = jax.grad(loss, argnums=(0, 1))(LINEAR, rows, True)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(invariant), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("name", "plain", "invariant"),
    [
        ("sum", lambda x: jnp.sum(x, axis=-1), row_sum),
        ("log_softmax", lambda x: jax.nn.log_softmax(x, axis=-1), row_log_softmax),
        ("softmax", lambda x: jax.nn.softmax(x, axis=-1), row_softmax),
    ],
)
def test_row_reductions_are_bitwise_invariant_inside_the_context(name: str, plain, invariant) -> None:
    """Rows of 16 (a tiny vocabulary): XLA sums a row in another order when the whole array is small."""
    rows = np.random.default_rng(1).standard_normal((1024, 16)).astype(np.float32) * 3

    def under_context(x: jax.Array) -> jax.Array:
        with batch_invariant():
            return invariant(x)

    outside, inside = jax.jit(plain), jax.jit(under_context)
    full_outside, full_inside = np.asarray(outside(rows)), np.asarray(inside(rows))
    assert any(not np.array_equal(np.asarray(outside(rows[:n])), full_outside[:n]) for n in (1, 8, 32)), name
    for count in (1, 8, 32, 100):
        assert np.array_equal(np.asarray(inside(rows[:count])), full_inside[:count]), (name, count)
    size = rows.shape[-1]
    if name == "sum":  # the row's 16 addends in another order
        bound = summation_tolerance(np.abs(rows).sum(axis=-1), size)
        np.testing.assert_allclose(full_inside, full_outside, atol=bound, rtol=0)
    else:  # exp's argument (up to the row's spread), exp's own, the positive sum, the quotient or the log
        spread = float(np.max(rows.max(axis=-1, keepdims=True) - rows))
        bound = summation_tolerance(1.0 + spread + np.abs(full_outside).max(), size + 2 * FUNCTION_TERMS + 2)
        if name == "softmax":  # relative, entry by entry: nothing cancels
            np.testing.assert_allclose(full_inside, full_outside, rtol=bound, atol=0)
        else:
            np.testing.assert_allclose(full_inside, full_outside, atol=bound, rtol=0)


def test_rms_norm_rows_are_bitwise_invariant_inside_the_context() -> None:
    norm = RMSNorm.init((Axis("embed", 64),), dtype=jnp.float32)
    rows = np.random.default_rng(2).standard_normal((2048, 64)).astype(np.float32)

    def apply(x: jax.Array) -> jax.Array:
        with batch_invariant():
            return norm(named(x, ("batch", "embed"))).array

    invariant = jax.jit(apply)
    plain = jax.jit(lambda x: norm(named(x, ("batch", "embed"))).array)
    full, full_plain = np.asarray(invariant(rows)), np.asarray(plain(rows))
    assert any(not np.array_equal(np.asarray(plain(rows[:n])), full_plain[:n]) for n in (1, 8, 32))
    for count in (1, 8, 32, 300):
        assert np.array_equal(np.asarray(invariant(rows[:count])), full[:count]), count
    # relative, entry by entry: the mean of 64 squares, the rsqrt, the two products
    relative = summation_tolerance(1.0, 64 + FUNCTION_TERMS + 3)
    np.testing.assert_allclose(full, full_plain, rtol=relative, atol=0)


def test_the_context_is_scoped_and_checks_its_argument() -> None:
    assert invariant_rows() is None
    with batch_invariant():
        assert invariant_rows() == ROW_BLOCK
        with batch_invariant(8):
            assert invariant_rows() == 8
        assert invariant_rows() == ROW_BLOCK
    assert invariant_rows() is None
    with pytest.raises(ValueError, match="rows must be a positive int"), batch_invariant(0):
        pass


def test_unfuse_multiply_add_changes_the_environment_only_before_xla_starts() -> None:
    jnp.zeros(1).block_until_ready()  # this process's backend has started
    environ: dict[str, str] = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert unfuse_multiply_add(environ) is False and UNFUSED_FLAG not in environ["XLA_FLAGS"]
    assert unfuse_multiply_add({"XLA_FLAGS": f"--a {UNFUSED_FLAG}"}) is True  # set before XLA started
    assert unfuse_multiply_add({"XLA_FLAGS": "--xla_cpu_max_isa=AVX2"}) is False  # the user's choice stays


def test_unfuse_multiply_add_in_a_fresh_process_rounds_every_product_before_its_sum() -> None:
    code = """
import json, numpy as np
from halyard.named.nn import unfuse_multiply_add
unfused = unfuse_multiply_add()
import jax, jax.numpy as jnp
a, b, c = (np.random.default_rng(i).standard_normal(4096).astype(np.float32) for i in range(3))
fused = np.asarray(jax.jit(lambda a, b, c: a * b + c)(a, b, c))
print(json.dumps([unfused, bool(np.array_equal(fused, np.float32(a * b) + c))]))
"""
    environ = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [True, True]
