"""MeshSpec: sizes, -1, errors with the arithmetic, device order, and the multi-slice plumbing."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from halyard.shard import BATCH_AXES, MESH_AXES, MeshSpec, mesh_axis_sizes


def test_default_spec_puts_every_device_on_data(devices8: list) -> None:
    mesh = MeshSpec().build(devices8)
    assert mesh.axis_names == MESH_AXES
    assert mesh_axis_sizes(mesh) == {**dict.fromkeys(MESH_AXES, 1), "data": 8}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (MeshSpec(fsdp=4), {"data": 2, "fsdp": 4}),
        (MeshSpec(data=1, fsdp=-1), {"data": 1, "fsdp": 8}),
        (MeshSpec(data=2, fsdp=2, tensor=2), {"data": 2, "fsdp": 2, "tensor": 2}),
        (MeshSpec(replica=2, tensor=2), {"replica": 2, "data": 2, "tensor": 2}),
        (MeshSpec(data=1, expert=4, tensor=-1), {"data": 1, "expert": 4, "tensor": 2}),
    ],
)
def test_sizes_and_leftover(devices8: list, spec: MeshSpec, expected: dict) -> None:
    sizes = mesh_axis_sizes(spec.build(devices8))
    assert sizes == {**dict.fromkeys(MESH_AXES, 1), **expected}
    assert int(np.prod(list(sizes.values()))) == 8


def test_batch_axes_vary_slowest_and_devices_are_in_order(devices8: list) -> None:
    mesh = MeshSpec(data=2, fsdp=2, tensor=2).build(devices8)
    assert MeshSpec().batch_axes == BATCH_AXES == MESH_AXES[: len(BATCH_AXES)]
    # Device order is preserved: the batch axes (leading) select contiguous blocks of devices.
    assert [d.id for d in mesh.devices.flat] == sorted(d.id for d in devices8)
    rows = mesh.devices.reshape(4, 2)  # (data*fsdp, tensor)
    assert [[d.id for d in row] for row in rows] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_sizes_that_do_not_divide_spell_out_the_arithmetic(devices8: list) -> None:
    with pytest.raises(ValueError, match=r"fsdp=3 = 3 does not divide 8"):
        MeshSpec(fsdp=3).build(devices8)
    with pytest.raises(ValueError, match=r"needs data=2 \* fsdp=2 = 4 devices, but 8 are available"):
        MeshSpec(data=2, fsdp=2).build(devices8)


def test_two_leftover_axes_and_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"data and fsdp are all -1.*data=1"):
        MeshSpec(fsdp=-1)
    with pytest.raises(ValueError, match=r"MeshSpec.tensor must be a positive int or -1"):
        MeshSpec(tensor=0)
    with pytest.raises(ValueError, match=r"dcn_data must be a positive int"):
        MeshSpec(dcn_data=0)


def test_dcn_size_must_divide_its_axis(devices8: list) -> None:
    with pytest.raises(ValueError, match=r"data=8 cannot span dcn_data=3 slices"):
        MeshSpec(dcn_data=3).build(devices8)


def _fake_devices(num_slices: int, per_slice: int) -> list:
    return [
        SimpleNamespace(
            id=s * per_slice + i, process_index=s, slice_index=s, platform="cpu", device_kind="cpu"
        )
        for s in range(num_slices)
        for i in range(per_slice)
    ]


def test_multi_slice_grid_puts_dcn_axes_across_slices() -> None:
    devices = _fake_devices(num_slices=2, per_slice=4)
    grid = MeshSpec(data=2, fsdp=4, dcn_data=2).device_grid(devices)
    assert grid.shape == (1, 2, 4, 1, 1, 1, 1)
    slices = np.vectorize(lambda d: d.slice_index)(grid).reshape(2, 4)
    assert slices.tolist() == [[0] * 4, [1] * 4]  # data splits across slices, fsdp inside each

    grid = MeshSpec(data=1, replica=2, fsdp=4, dcn_replica=2).device_grid(devices)
    assert np.vectorize(lambda d: d.slice_index)(grid).reshape(2, 4).tolist() == [[0] * 4, [1] * 4]


def test_multi_slice_grid_plumbs_ici_and_dcn_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    from halyard.shard import mesh as mesh_module

    calls = {}

    def fake_hybrid(ici_shape, dcn_shape, devices, *, process_is_granule):
        calls.update(ici=ici_shape, dcn=dcn_shape, granule=process_is_granule)
        return np.array(devices, dtype=object).reshape(np.multiply(ici_shape, dcn_shape))

    monkeypatch.setattr(mesh_module.mesh_utils, "create_hybrid_device_mesh", fake_hybrid)
    devices = [SimpleNamespace(id=i, process_index=i // 4) for i in range(16)]  # no slice_index: CPU/GPU
    MeshSpec(data=2, fsdp=4, replica=2, dcn_replica=2, dcn_fsdp=2).device_grid(devices)
    assert calls == {"ici": (1, 2, 2, 1, 1, 1, 1), "dcn": (2, 1, 2, 1, 1, 1, 1), "granule": True}
