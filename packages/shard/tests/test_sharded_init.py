"""`init_sharded`: traced array arguments, constant configuration, errors before compiling."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from halyard.named import named
from halyard.shard import Layout, MeshSpec, init_sharded


@dataclass(frozen=True)
class Config:
    embed: int
    mlp: int


def init(config: Config, key: jax.Array, *, scale: float = 1.0) -> dict:
    weights = jax.random.normal(key, (config.embed, config.mlp)) * scale
    return {"w": named(weights, ("embed", "mlp")), "step": jnp.zeros((), jnp.int32)}


def test_config_is_a_constant_and_the_key_is_traced(devices8: list) -> None:
    mesh = MeshSpec(data=1, fsdp=8).build(devices8)
    key = jax.random.key(3)
    params = init_sharded(init, Layout.fsdp(min_shard=0), mesh, Config(16, 8), key, scale=2.0)
    expected = init(Config(16, 8), key, scale=2.0)
    assert params["w"].array.sharding.spec == P("fsdp", None)
    assert params["step"].sharding.spec == P()
    # bitwise: random bits that do not depend on the partitioning (jax's threefry_partitionable, the
    # default), times a constant, element by element
    np.testing.assert_array_equal(np.asarray(params["w"].array), np.asarray(expected["w"].array))


def test_a_refused_layout_fails_before_compiling(devices8: list, monkeypatch: pytest.MonkeyPatch) -> None:
    mesh = MeshSpec(data=1, fsdp=8).build(devices8)
    jitted: list = []
    original_jit = jax.jit
    monkeypatch.setattr(
        jax, "jit", lambda *args, **kwargs: jitted.append(args) or original_jit(*args, **kwargs)
    )
    with pytest.raises(ValueError, match=r"leaves 100.0% of the shardable weight elements replicated"):
        # embed=12 and mlp=6 do not divide over fsdp=8
        init_sharded(init, Layout.fsdp(min_shard=0, tolerance=0.0), mesh, Config(12, 6), jax.random.key(0))
    assert jitted == []
    init_sharded(init, Layout.fsdp(min_shard=0, tolerance=1.0), mesh, Config(12, 6), jax.random.key(0))
    assert len(jitted) == 1  # the spy sees the jit of an accepted layout
