"""`TensorMapping` against numpy: any block read through it equals the same block of the whole array,
and writing a block back gives the Hugging Face tensor it came from."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from halyard.models.hf.tensor_mapping import TensorMapping

SIZES = {"embed": 6, "heads": 3, "head_size": 4}
MAPPINGS = [
    TensorMapping("q", "q", "(heads head_size) embed -> embed heads head_size"),
    TensorMapping("o", "o", "embed (heads head_size) -> heads head_size embed"),
    TensorMapping("k", "c_attn", "embed (qkv heads head_size) -> embed heads head_size", ("qkv", 1, 3)),
    TensorMapping("b", "c_attn.bias", "(qkv heads head_size) -> heads head_size", ("qkv", 2, 3)),
]


def _hf_tensor(mapping: TensorMapping, seed: int) -> np.ndarray:
    shape = mapping.hf_shape(SIZES)
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _reference(mapping: TensorMapping, tensor: np.ndarray) -> np.ndarray:
    """The Halyard array by plain numpy: reshape to the left axes, pick the part, transpose."""
    full = mapping.sizes_with_part(SIZES)
    view = tensor.reshape([full[name] for name in mapping.view_names])
    names = mapping.view_names
    if mapping.part is not None:
        view = np.take(view, mapping.part[1], axis=names.index(mapping.part[0]))
        names = [name for name in names if name != mapping.part[0]]
    return view.transpose([names.index(name) for name in mapping.target])


@st.composite
def _blocks(draw: st.DrawFn) -> tuple[TensorMapping, list[slice]]:
    mapping = draw(st.sampled_from(MAPPINGS))
    slices = []
    for name in mapping.target:
        start = draw(st.integers(0, SIZES[name] - 1))
        stop = draw(st.integers(start + 1, SIZES[name]))
        slices.append(slice(start, stop))
    return mapping, slices


@settings(max_examples=200, deadline=None)
@given(_blocks(), st.integers(0, 10))
def test_any_block_equals_the_block_of_the_whole_array(
    block: tuple[TensorMapping, list[slice]], seed: int
) -> None:
    mapping, slices = block
    tensor = _hf_tensor(mapping, seed)
    expected = _reference(mapping, tensor)[tuple(slices)]
    reads: list[tuple[slice, ...]] = []

    def reader(hf_slices: tuple[slice, ...]) -> np.ndarray:
        reads.append(hf_slices)
        return tensor[hf_slices]

    np.testing.assert_array_equal(mapping.read(reader, SIZES, slices), expected)
    assert len(reads) == 1  # one contiguous range per Hugging Face dimension


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(MAPPINGS), st.integers(0, 10))
def test_place_inverts_read(mapping: TensorMapping, seed: int) -> None:
    tensor = _hf_tensor(mapping, seed)
    full = mapping.sizes_with_part(SIZES)
    view = np.zeros([full[name] for name in mapping.view_names], np.float32)
    mapping.place(view, _reference(mapping, tensor))
    restored = view.reshape(tensor.shape)
    if mapping.part is None:
        np.testing.assert_array_equal(restored, tensor)
    else:  # only this parameter's part is written
        np.testing.assert_array_equal(_reference(mapping, restored), _reference(mapping, tensor))
