"""`pad_for` rounds sizes up to divide their mesh axes; `check_divisible` fails before compiling."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from halyard.named import named
from halyard.shard import Layout, MeshSpec, check_divisible, init_sharded, pad_for


@pytest.mark.parametrize(
    ("spec", "layout", "size", "padded"),
    [
        (MeshSpec(data=1, tensor=8), Layout.tensor_parallel(), 50257, 50264),
        (MeshSpec(data=2, tensor=4), Layout.tensor_parallel(), 50257, 50260),
        (MeshSpec(data=1, fsdp=2, tensor=4), Layout.fsdp_tensor(), 64, 64),
        (MeshSpec(data=8), Layout.data_parallel(), 50257, 50257),  # vocab is not split: nothing to pad
        (MeshSpec(data=1, fsdp=8), Layout.fsdp(), 50257, 50264),  # fsdp's vocab rule
    ],
)
def test_pad_for_rounds_up_to_a_multiple(
    devices8: list, spec: MeshSpec, layout: Layout, size: int, padded: int
) -> None:
    mesh = spec.build(devices8)
    assert pad_for(size, "vocab", mesh, layout) == padded
    check_divisible(padded, "vocab", mesh, layout)


def test_check_divisible_names_axis_size_mesh_axes_and_pad_for(devices8: list) -> None:
    mesh = MeshSpec(data=1, tensor=8).build(devices8)
    with pytest.raises(ValueError) as error:
        check_divisible(50257, "vocab", mesh, Layout.tensor_parallel())
    assert str(error.value) == (
        "Axis 'vocab' has size 50257, which does not divide over mesh axes ('tensor',) of 8 devices (tensor=8) "
        "under layout 'tensor_parallel'. Use pad_for(50257, 'vocab', mesh, layout) = 50264 as the size "
        "(padding the extra entries), or choose a mesh whose tensor size divides 50257"
    )


def test_check_divisible_runs_before_anything_compiles(devices8: list) -> None:
    mesh = MeshSpec(data=1, fsdp=2, tensor=4).build(devices8)
    layout = Layout.fsdp_tensor(min_shard=0)
    traced = []

    def init() -> dict:
        traced.append(True)
        return {"lm_head": named(jnp.zeros((8, 50257)), ("embed", "vocab"))}

    def build() -> dict:
        check_divisible(50257, "vocab", mesh, layout)  # what a model's init does with its config
        return init_sharded(init, layout, mesh)

    with pytest.raises(ValueError, match=r"pad_for\(50257, 'vocab', mesh, layout\) = 50260"):
        build()
    assert traced == []
    padded = pad_for(50257, "vocab", mesh, layout)
    assert padded == 50260
    params = init_sharded(
        lambda: {"lm_head": named(jnp.zeros((8, padded)), ("embed", "vocab"))}, layout, mesh
    )
    assert params["lm_head"].array.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")


def test_pad_for_rejects_negative_sizes(devices8: list) -> None:
    with pytest.raises(ValueError, match="size of 'vocab' must be non-negative"):
        pad_for(-1, "vocab", MeshSpec().build(devices8), Layout.fsdp())
