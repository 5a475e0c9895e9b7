"""Every weight of a transformer-shaped tree gets the expected spec under each ready-made layout."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from shard_tree import MIN_SHARD, SHAPES, flatten, init_tree

from halyard.named import Axis
from halyard.shard import Layout, MeshSpec, init_sharded, mesh_axis_sizes

REPLICATED = {path: P(*([None] * len(axes))) for path, axes in SHAPES.items()}

EXPECTED: dict[str, tuple[MeshSpec, dict[str, P], P]] = {
    # preset: (mesh, weight specs (others replicated), spec of an activation (batch, pos, embed))
    "data_parallel": (MeshSpec(data=8), {}, P("data", None, None)),
    "fsdp": (
        MeshSpec(data=1, fsdp=8),
        {
            "token_embedding": P(None, "fsdp"),
            "blocks.attn.q": P(None, "fsdp", None, None),
            "blocks.attn.k": P(None, "fsdp", None, None),
            "blocks.attn.o": P(None, None, None, "fsdp"),
            "blocks.mlp.w_in": P(None, "fsdp", None),
            "blocks.mlp.w_out": P(None, None, "fsdp"),
            "blocks.moe.w_in": P(None, None, "fsdp", None),
            "lm_head": P("fsdp", None),
        },
        P("fsdp", None, None),
    ),
    "tensor_parallel": (
        MeshSpec(data=2, tensor=4),
        {
            "token_embedding": P("tensor", None),
            "blocks.attn.q": P(None, None, "tensor", None),
            # kv_heads=2 does not divide over tensor=4: replicated (and reported)
            "blocks.attn.o": P(None, "tensor", None, None),
            "blocks.mlp.w_in": P(None, None, "tensor"),
            "blocks.mlp.w_out": P(None, "tensor", None),
            "blocks.moe.w_in": P(None, None, None, "tensor"),
            "lm_head": P(None, "tensor"),
        },
        P("data", None, None),
    ),
    "fsdp_tensor": (
        MeshSpec(data=1, fsdp=2, tensor=4),
        {
            "token_embedding": P("tensor", "fsdp"),
            "blocks.attn.q": P(None, "fsdp", "tensor", None),
            "blocks.attn.k": P(None, "fsdp", None, None),
            "blocks.attn.o": P(None, "tensor", None, "fsdp"),
            "blocks.mlp.w_in": P(None, "fsdp", "tensor"),
            "blocks.mlp.w_out": P(None, "tensor", "fsdp"),
            "blocks.moe.w_in": P(None, None, "fsdp", "tensor"),
            "lm_head": P("fsdp", "tensor"),
        },
        P("fsdp", None, None),  # embed stays whole: fsdp already splits the batch
    ),
    "expert_parallel": (
        MeshSpec(data=1, expert=4, tensor=2),
        {
            "token_embedding": P("tensor", None),
            "blocks.attn.q": P(None, None, "tensor", None),
            "blocks.attn.k": P(None, None, "tensor", None),
            "blocks.attn.o": P(None, "tensor", None, None),
            "blocks.mlp.w_in": P(None, None, "tensor"),
            "blocks.mlp.w_out": P(None, "tensor", None),
            "blocks.moe.w_in": P(None, "expert", None, "tensor"),
            "lm_head": P(None, "tensor"),
        },
        P("expert", None, None),
    ),
}


@pytest.mark.parametrize("preset", list(EXPECTED))
def test_every_weight_gets_its_expected_spec(devices8: list, preset: str) -> None:
    mesh_spec, weight_specs, _ = EXPECTED[preset]
    mesh = mesh_spec.build(devices8)
    layout = Layout.preset(preset, min_shard=MIN_SHARD, tolerance=1.0)
    shapes = jax.eval_shape(init_tree, jnp.float32(0.5))
    shardings = flatten(layout.shardings(shapes, mesh))
    expected = {**REPLICATED, **weight_specs}
    assert {path: s.array.spec for path, s in shardings.items()} == expected


@pytest.mark.parametrize("preset", list(EXPECTED))
def test_weights_are_created_in_place_with_those_slices(devices8: list, preset: str) -> None:
    mesh_spec, weight_specs, _ = EXPECTED[preset]
    mesh = mesh_spec.build(devices8)
    sizes = mesh_axis_sizes(mesh)
    layout = Layout.preset(preset, min_shard=MIN_SHARD, tolerance=1.0)
    params = flatten(init_sharded(init_tree, layout, mesh, jnp.float32(0.5)))
    reference = flatten(jax.jit(init_tree)(jnp.float32(0.5)))
    for path, spec in {**REPLICATED, **weight_specs}.items():
        array = params[path].array
        expected_shard = tuple(
            size // math.prod(sizes[a] for a in ((e,) if isinstance(e, str) else e or ()))
            for size, e in zip(array.shape, spec)
        )
        assert array.addressable_shards[0].data.shape == expected_shard, path
        # bitwise: element-wise values (a sine of the flat index, times a scale), no sums to reorder
        np.testing.assert_array_equal(np.asarray(array), np.asarray(reference[path].array))


@pytest.mark.parametrize("preset", list(EXPECTED))
def test_activation_spec(devices8: list, preset: str) -> None:
    mesh_spec, _, activation_spec = EXPECTED[preset]
    mesh = mesh_spec.build(devices8)
    layout = Layout.preset(preset)
    axes = (Axis("batch", 8), Axis("pos", 4), Axis("embed", 32))
    assert layout.partition_spec(axes, mesh) == activation_spec


def test_preset_names_and_did_you_mean() -> None:
    assert Layout.preset("fsdp") == Layout.fsdp()
    with pytest.raises(ValueError, match=r"Unknown layout 'fdsp'.*Did you mean 'fsdp'"):
        Layout.preset("fdsp")
