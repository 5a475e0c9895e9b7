"""`use_layout` / `constrain`: no-op without a layout, constraints under jit, nesting, threads."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from halyard.named import named
from halyard.shard import Layout, MeshSpec, active_layout, constrain, use_layout


def _activation() -> object:
    return named(jnp.arange(8 * 4 * 16, dtype=jnp.float32).reshape(8, 4, 16), ("batch", "pos", "mlp"))


def test_without_a_layout_constrain_returns_its_argument() -> None:
    x = _activation()
    assert active_layout() is None
    assert constrain(x) is x
    jaxpr = jax.make_jaxpr(lambda a: constrain(a).array)(x)
    assert "sharding_constraint" not in str(jaxpr)


def test_active_layout_constrains_inside_jit(devices8: list) -> None:
    mesh = MeshSpec(data=2, tensor=4).build(devices8)
    x = _activation()
    with use_layout(Layout.tensor_parallel(), mesh):
        jaxpr = jax.make_jaxpr(lambda a: constrain(a).array)(x)
        result = jax.jit(lambda a: constrain(a * 2.0))(x)
    assert "sharding_constraint" in str(jaxpr)
    assert result.array.sharding == NamedSharding(mesh, P("data", None, "tensor"))
    assert result.axes == x.axes
    np.testing.assert_array_equal(np.asarray(result.array), 2.0 * np.asarray(x.array))


def test_nesting_restores_the_outer_layout_also_on_errors(devices8: list) -> None:
    dp_mesh = MeshSpec(data=8).build(devices8)
    tp_mesh = MeshSpec(data=2, tensor=4).build(devices8)
    dp, tp = Layout.data_parallel(), Layout.tensor_parallel()
    with use_layout(dp, dp_mesh) as outer:
        assert active_layout() == outer
        with use_layout(tp, tp_mesh):
            assert active_layout().layout is tp
        assert active_layout() is outer
        with pytest.raises(RuntimeError), use_layout(tp, tp_mesh):
            raise RuntimeError("boom")
        assert active_layout() is outer
    assert active_layout() is None


def test_a_jitted_function_is_traced_again_under_another_layout(devices8: list) -> None:
    mesh = MeshSpec(data=2, tensor=4).build(devices8)
    x = _activation()
    traces = []

    @jax.jit
    def double(a: object) -> object:
        traces.append(True)
        return constrain(a * 2.0)

    with use_layout(Layout.tensor_parallel(), mesh):
        tp_result = double(x)
        double(x)
    with use_layout(Layout.data_parallel(), mesh):
        dp_result = double(x)  # the active layout is part of jit's cache key
    no_layout = double(x)
    assert len(traces) == 3
    assert tp_result.array.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None, "tensor")), 3)
    assert dp_result.array.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None, None)), 3)
    np.testing.assert_array_equal(np.asarray(no_layout.array), np.asarray(tp_result.array))


def test_the_active_layout_is_private_to_a_thread(devices8: list) -> None:
    mesh = MeshSpec(data=8).build(devices8)
    seen: list = []
    with use_layout(Layout.data_parallel(), mesh):
        thread = threading.Thread(target=lambda: seen.append(active_layout()))
        thread.start()
        thread.join()
    assert seen == [None]


def test_bad_arguments_are_named(devices8: list) -> None:
    mesh = MeshSpec(data=8).build(devices8)
    with pytest.raises(TypeError, match="constrain takes a NamedArray"), use_layout(Layout.fsdp(), mesh):
        constrain(jnp.zeros(3))
    with (
        pytest.raises(TypeError, match=r"use_layout needs a jax.sharding.Mesh"),
        use_layout(Layout.fsdp(), "mesh"),
    ):  # type: ignore[arg-type]
        pass


def test_constrain_inside_scan_over_layers(devices8: list) -> None:
    mesh = MeshSpec(data=2, tensor=4).build(devices8)
    x = named(jnp.ones((8, 16)), ("batch", "mlp"))
    scales = jnp.arange(1.0, 4.0)

    def body(carry, scale):
        return constrain(carry * scale), None

    with use_layout(Layout.tensor_parallel(), mesh):
        jaxpr = str(jax.make_jaxpr(lambda a: jax.lax.scan(body, a, scales)[0])(x))
        result = jax.jit(lambda a: jax.lax.scan(body, a, scales)[0])(x)
    assert "sharding_constraint" in jaxpr
    np.testing.assert_array_equal(np.asarray(result.array), np.full((8, 16), 6.0))
