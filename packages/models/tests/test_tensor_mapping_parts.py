"""`TensorMapping` parts given by their sizes, here unequal (Phi-3's ``qkv_proj`` with grouped-query heads: q, k and v rows
concatenated, q longer than k and v) against numpy slicing of the fused tensor: any block read equals the
block of the split array, it is read as one contiguous range per dimension, and writing every part back
rebuilds the fused tensor."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halyard.models.hf import TensorMapping

SIZES = {"embed": 5, "heads": 4, "kv_heads": 2, "head_size": 3}
ROWS = (SIZES["heads"], SIZES["kv_heads"], SIZES["kv_heads"])  # q, k, v: heads of head_size rows each
QKV = [
    TensorMapping(
        f"{name}.weight", "qkv_proj.weight", f"(qkv {heads} head_size) embed -> embed {heads} head_size",
        ("qkv", index, ROWS),
    )
    for index, (name, heads) in enumerate((("q", "heads"), ("k", "kv_heads"), ("v", "kv_heads")))
] + [
    TensorMapping("k.bias", "qkv_proj.bias", "(qkv kv_heads head_size) -> kv_heads head_size", ("qkv", 1, ROWS)),
]  # fmt: skip


def _fused(mapping: TensorMapping, seed: int) -> np.ndarray:
    shape = mapping.hf_shape(SIZES)
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _reference(mapping: TensorMapping, tensor: np.ndarray) -> np.ndarray:
    """The Halyard array by plain numpy: the part's rows, split into heads, transposed."""
    assert mapping.part is not None
    index = mapping.part[1]
    bounds = np.cumsum([0, *ROWS]) * SIZES["head_size"]
    rows = tensor[bounds[index] : bounds[index + 1]]
    heads = rows.reshape(ROWS[index], SIZES["head_size"], *rows.shape[1:])
    return np.moveaxis(heads, (0, 1), (-2, -1))


def test_the_fused_shape_holds_every_part() -> None:
    assert QKV[0].hf_shape(SIZES) == ((4 + 2 + 2) * 3, 5)
    assert QKV[3].hf_shape(SIZES) == (24,)


@st.composite
def _blocks(draw: st.DrawFn) -> tuple[TensorMapping, list[slice]]:
    mapping = draw(st.sampled_from(QKV))
    slices = []
    for name in mapping.target:
        start = draw(st.integers(0, SIZES[name] - 1))
        slices.append(slice(start, draw(st.integers(start + 1, SIZES[name]))))
    return mapping, slices


@settings(max_examples=150, deadline=None)
@given(_blocks(), st.integers(0, 10))
def test_any_block_equals_the_split_array_block(block: tuple[TensorMapping, list[slice]], seed: int) -> None:
    mapping, slices = block
    tensor = _fused(mapping, seed)
    reads: list[tuple[slice, ...]] = []

    def reader(hf_slices: tuple[slice, ...]) -> np.ndarray:
        reads.append(hf_slices)
        return tensor[hf_slices]

    got = mapping.read(reader, SIZES, slices)
    np.testing.assert_array_equal(got, _reference(mapping, tensor)[tuple(slices)])
    assert len(reads) == 1  # one contiguous range per Hugging Face dimension


@pytest.mark.parametrize("seed", [0, 1])
def test_placing_every_part_rebuilds_the_fused_tensor(seed: int) -> None:
    tensor = _fused(QKV[0], seed)
    full = QKV[0].sizes_with_part(SIZES)
    view = np.zeros([full[name] for name in QKV[0].view_names], np.float32)  # as the exporter builds it
    for mapping in QKV[:3]:
        assert mapping.view_names == QKV[0].view_names
        mapping.place(view, _reference(mapping, tensor))
    np.testing.assert_array_equal(view.reshape(tensor.shape), tensor)


@settings(max_examples=50, deadline=None)
@given(_blocks(), st.integers(0, 10))
def test_a_placed_block_lands_where_it_was_read(block: tuple[TensorMapping, list[slice]], seed: int) -> None:
    mapping, slices = block
    tensor = _fused(mapping, seed)
    full = mapping.sizes_with_part(SIZES)
    view = np.zeros([full[name] for name in mapping.view_names], np.float32)
    mapping.place(view, _reference(mapping, tensor)[tuple(slices)], slices)
    restored = _reference(mapping, view.reshape(tensor.shape))
    expected = np.zeros_like(restored)
    expected[tuple(slices)] = _reference(mapping, tensor)[tuple(slices)]
    np.testing.assert_array_equal(restored, expected)


def test_sizes_that_disagree_with_the_parts_are_refused() -> None:
    with pytest.raises(ValueError, match="holds 2 entries of 'kv_heads'"):
        QKV[1].hf_shape({**SIZES, "kv_heads": 3})


def test_bad_parts_are_refused() -> None:
    with pytest.raises(ValueError, match="part index 3 is not one of 3 parts"):
        TensorMapping("v", "qkv", "(qkv kv_heads head_size) -> kv_heads head_size", ("qkv", 3, ROWS))
    with pytest.raises(ValueError, match="need 'qkv' to lead a group"):
        TensorMapping("k", "qkv", "(kv_heads qkv head_size) -> kv_heads head_size", ("qkv", 1, ROWS))
