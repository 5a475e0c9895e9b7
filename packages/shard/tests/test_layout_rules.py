"""Layout rules: grammar, fallbacks, rule order, min_shard, tolerance, shardings/place/describe."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from halyard.named import Axis, named
from halyard.shard import Layout, MeshSpec, normalize_rules


def _axes(**sizes: int) -> tuple[Axis, ...]:
    return tuple(Axis(name, size) for name, size in sizes.items())


def test_rule_grammar_normalizes() -> None:
    rules = normalize_rules(
        {"embed": "fsdp", "mlp": ("tensor", "fsdp"), "batch": (("data", "fsdp"), "data"), "vocab": None}
    )
    assert rules == (
        ("embed", (("fsdp",),)),
        ("mlp", (("tensor",), ("fsdp",))),
        ("batch", (("data", "fsdp"), ("data",))),
        ("vocab", ((),)),
    )


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([("embed", "fsdp"), ("embed", "tensor")], r"name the logical axis 'embed' twice"),
        ({"embed": (3,)}, r"Layout rule 'embed': candidate 3 must be a mesh axis name"),
        ({"embed": (("fsdp", "fsdp"),)}, r"repeats a mesh axis"),
        ([("embed",)], r"expected a \(logical axis name, mesh axes\) pair"),
    ],
)
def test_malformed_rules_are_named(rules: object, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        Layout(rules)  # type: ignore[arg-type]


def test_unknown_mesh_axis_is_an_error(devices8: list) -> None:
    mesh = MeshSpec().build(devices8)
    with pytest.raises(ValueError, match=r"rule 'embed' names mesh axis 'model'.*its axes: \('replica'"):
        Layout({"embed": "model"}).partition_spec(_axes(embed=8), mesh)


def test_first_dividing_candidate_wins_and_size_one_axes_are_skipped(devices8: list) -> None:
    mesh = MeshSpec(data=1, fsdp=4, tensor=2).build(devices8)
    layout = Layout({"mlp": (("fsdp", "tensor"), "fsdp", "tensor"), "embed": ("sequence", "fsdp")})
    assert layout.partition_spec(_axes(mlp=16), mesh) == P(("fsdp", "tensor"))
    assert layout.partition_spec(_axes(mlp=4), mesh) == P("fsdp")  # 4 does not divide over 8
    assert layout.partition_spec(_axes(mlp=6), mesh) == P("tensor")
    assert layout.partition_spec(_axes(mlp=3), mesh) == P(None)
    # sequence has size 1 here, so embed falls through to fsdp
    assert layout.partition_spec(_axes(embed=8), mesh) == P("fsdp")


def test_explicit_replicate_candidate_stops_the_search(devices8: list) -> None:
    mesh = MeshSpec(data=1, fsdp=8).build(devices8)
    layout = Layout({"embed": ((), "fsdp")})
    assert layout.partition_spec(_axes(embed=8), mesh) == P(None)


def test_earlier_rules_claim_mesh_axes_first(devices8: list) -> None:
    mesh = MeshSpec(data=1, fsdp=8).build(devices8)
    embed_first = Layout([("embed", "fsdp"), ("mlp", "fsdp")])
    mlp_first = Layout([("mlp", "fsdp"), ("embed", "fsdp")])
    axes = _axes(embed=16, mlp=32)
    assert embed_first.partition_spec(axes, mesh) == P("fsdp", None)
    assert mlp_first.partition_spec(axes, mesh) == P(None, "fsdp")
    # a mesh axis is used once per array: the batch takes fsdp, so the activation's embed stays whole
    fsdp = Layout.fsdp()
    assert fsdp.partition_spec(_axes(batch=8, embed=16), mesh) == P("fsdp", None)
    assert fsdp.partition_spec(_axes(embed=16, mlp=32), mesh) == P("fsdp", None)


def test_fsdp_falls_back_to_the_next_axis_that_divides(devices8: list) -> None:
    mesh = MeshSpec(data=1, fsdp=8).build(devices8)
    assert Layout.fsdp().partition_spec(_axes(embed=12, mlp=48), mesh) == P(None, "fsdp")


def test_min_shard_keeps_small_weights_replicated(devices8: list) -> None:
    mesh = MeshSpec(data=1, fsdp=8).build(devices8)
    layout = Layout.fsdp(min_shard=64, tolerance=1.0)
    small = named(jnp.zeros((8, 7)), ("embed", "mlp"))  # 56 elements < 64
    exact = named(jnp.zeros((8, 8)), ("embed", "mlp"))  # 64 elements: sharded
    assert layout.partition_spec(small, mesh, weight=True) == P(None, None)
    assert layout.partition_spec(small, mesh) == P("fsdp", None)  # activations ignore min_shard
    shardings = layout.shardings({"small": small, "exact": exact}, mesh)
    assert shardings["small"].array.spec == P(None, None)
    assert shardings["exact"].array.spec == P("fsdp", None)


def _tree_with_one_odd_weight() -> dict:
    return {
        "big_odd": named(jnp.zeros((10, 30)), ("embed", "mlp")),  # 300 elements, neither divides by 8
        "good": named(jnp.zeros((16, 64)), ("embed", "mlp")),  # 1024 elements
        "norm": named(jnp.zeros((16,)), ("embed",)),
        "no_rule": named(jnp.zeros((50, 50)), ("foo", "bar")),  # not shardable: no rule names its axes
    }


def test_tolerance_refuses_and_lists_the_largest_replicated_weights(devices8: list) -> None:
    mesh = MeshSpec(data=1, fsdp=8).build(devices8)
    tree = _tree_with_one_odd_weight()
    layout = Layout.fsdp(min_shard=32, tolerance=0.2)
    with pytest.raises(ValueError) as error:
        layout.shardings(tree, mesh)
    message = str(error.value)
    # (300 + 16) of (300 + 1024 + 16) shardable elements = 23.6%
    assert "leaves 23.6% of the shardable weight elements replicated (316 of 1340)" in message
    assert "the tolerance is 20.0%" in message
    lines = message.splitlines()
    assert lines[1].startswith("  big_odd (embed=10, mlp=30): 300 elements;")
    assert (
        "embed=10 does not divide over fsdp=8" in lines[1]
        and "mlp=30 does not divide over fsdp=8" in lines[1]
    )
    assert lines[2] == "  norm (embed=16): 16 elements; 16 elements < min_shard=32"
    assert "no_rule" not in message
    assert "pad_for" in message
    # within tolerance: accepted
    accepted = Layout.fsdp(min_shard=32, tolerance=0.25).shardings(tree, mesh)
    assert accepted["good"].array.spec == P("fsdp", None)


def test_tolerance_ignores_what_the_mesh_cannot_split(devices8: list) -> None:
    tree = _tree_with_one_odd_weight()
    strict = Layout.fsdp(min_shard=10**9, tolerance=0.0)
    # fsdp=1: nothing is shardable on this mesh, so nothing is refused
    strict.shardings(tree, MeshSpec(data=8).build(devices8))
    strict.shardings(tree, MeshSpec(data=1).build(devices8[:1]))
    # data parallel never shards weights
    Layout.data_parallel(tolerance=0.0).shardings(tree, MeshSpec(data=1, fsdp=8).build(devices8))


def test_shardings_drive_jit_out_shardings_and_place(devices8: list) -> None:
    mesh = MeshSpec(data=2, fsdp=4).build(devices8)
    layout = Layout.fsdp(min_shard=0)

    def init() -> dict:
        return {
            "w": named(jnp.arange(32.0).reshape(8, 4), ("embed", "mlp")),
            "count": jnp.zeros((), jnp.int32),
        }

    shapes = jax.eval_shape(init)
    shardings = layout.shardings(shapes, mesh)
    params = jax.jit(init, out_shardings=shardings)()
    assert params["w"].axes == (Axis("embed", 8), Axis("mlp", 4))
    assert params["w"].array.sharding == NamedSharding(mesh, P("fsdp", None))
    assert params["count"].sharding == NamedSharding(mesh, P())
    np.testing.assert_array_equal(np.asarray(params["w"].array), np.arange(32.0).reshape(8, 4))

    placed = layout.place(init(), mesh)
    assert placed["w"].array.sharding.spec == P("fsdp", None)
    assert placed["w"].array.addressable_shards[0].data.shape == (2, 4)


def test_plain_leaves_keep_an_existing_sharding_on_the_same_mesh(devices8: list) -> None:
    mesh = MeshSpec(data=8).build(devices8)
    annotated = jax.device_put(jnp.zeros((8, 2)), NamedSharding(mesh, P("data")))
    shardings = Layout.fsdp().shardings({"a": annotated, "b": jnp.zeros((8, 2))}, mesh)
    assert shardings["a"].spec == P("data")
    assert shardings["b"].spec == P()


def test_describe_lists_every_leaf_with_bytes_per_device(devices8: list) -> None:
    mesh = MeshSpec(data=1, fsdp=8).build(devices8)
    tree = _tree_with_one_odd_weight() | {"step": jnp.zeros((), jnp.int32)}
    table = Layout.fsdp(min_shard=32, tolerance=0.0).describe(tree, mesh)  # never raises
    lines = table.splitlines()
    assert lines[0].split() == ["path", "axes", "spec", "dtype", "bytes/device", "note"]
    rows = {line.split()[0]: line for line in lines[1:-1]}
    assert set(rows) == {"big_odd", "good", "norm", "no_rule", "step"}
    assert "(embed=16, mlp=64)" in rows["good"] and "(fsdp, -)" in rows["good"] and "512 B" in rows["good"]
    assert "1.2 KiB" in rows["big_odd"] and "does not divide" in rows["big_odd"]
    assert "plain array" in rows["step"]
    # 1200 + 4096 + 64 + 10000 + 4 bytes in all; per device 1200 + 512 + 64 + 10000 + 4
    assert lines[-1] == (
        "layout fsdp, mesh (fsdp=8): 15.0 KiB in all, 11.5 KiB per device, 23.6% of shardable weights replicated"
    )
