"""The invariant step's parts: the pairwise tree against a numpy reference of the same order, a step of a
plain-JAX model that gives the same bits on 1, 2, 4 and 8 devices data-parallel and sharded, and the line a
resume on another mesh prints."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from float_tolerance import FUNCTION_TERMS, summation_tolerance
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec

from halyard.named import Axis, NamedArray
from halyard.shard import Layout, MeshSpec
from halyard.train.invariant.norms import NORM_CHUNK, canonical_norm
from halyard.train.invariant.slices import CanonicalSlices
from halyard.train.invariant.trees import scan_tree_sum, tree_sum, tree_sum_in_one_pass
from halyard.train.run.mesh_record import METADATA_KEY, resume_note
from halyard.train.step import init_state, make_train_step


def flushed(value: np.float32) -> np.float32:
    """``value`` as XLA's CPU runtime reads and writes it: subnormal floats are zero (flush to zero, denormals
    are zero), with their sign."""
    return np.float32(np.copysign(0.0, value)) if 0 < abs(value) < np.finfo(np.float32).tiny else value


def pairwise_reference(values: np.ndarray) -> np.ndarray:
    """Adjacent pairs, level by level, an odd last element carried up unchanged (numpy float32, each addition
    as XLA's CPU runtime computes it: subnormal operands and results are zero)."""
    level = list(values)
    while len(level) > 1:
        pairs = [
            flushed(np.float32(flushed(level[i]) + flushed(level[i + 1])))
            for i in range(0, len(level) - 1, 2)
        ]
        level = pairs + ([level[-1]] if len(level) % 2 else [])
    return np.asarray(level[0])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=33))
@example([0.0, 2.802596928649634e-45])  # a subnormal term: flushed to zero by XLA's CPU runtime
@example([1.1754944e-38, -1.1754942e-38, 0.0])  # a subnormal partial sum, carried up beside a zero
def test_tree_sum_adds_in_the_documented_order(values: list[float]) -> None:
    array = np.asarray(values, np.float32)
    assert np.asarray(tree_sum(jnp.asarray(array))).tobytes() == pairwise_reference(array).tobytes()
    one_pass = jax.jit(tree_sum_in_one_pass)(jnp.asarray(array))
    assert np.asarray(one_pass).tobytes() == pairwise_reference(array).tobytes()


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 5), st.integers(0, 2**31 - 1))
def test_the_scanned_tree_adds_like_the_tree(log_count: int, seed: int) -> None:
    terms = np.random.default_rng(seed).normal(scale=1e3, size=(2**log_count, 3)).astype(np.float32)
    scanned = scan_tree_sum(lambda index, row: row * 1.0, 2**log_count, jnp.asarray(terms))
    assert np.asarray(scanned).tobytes() == np.asarray(tree_sum(jnp.asarray(terms))).tobytes()


def pairwise_norm_tolerance(leaves: list[np.ndarray], expected: float) -> float:
    """How far the canonical norm of ``leaves`` (float32) may be from the float64 norm: each square's rounding,
    a leaf's pairwise tree over its chunks' trees (its depth in roundings, each relative to the positive
    sum), the leaves' sums in order, then half that through the square root and the root's own."""
    depth = max(
        math.ceil(math.log2(min(leaf.size, NORM_CHUNK)))
        + math.ceil(math.log2(math.ceil(leaf.size / NORM_CHUNK)))
        for leaf in leaves
    )
    return summation_tolerance(expected, math.ceil((1 + depth + len(leaves)) / 2) + FUNCTION_TERMS)


def test_the_canonical_norm_is_the_norm_with_the_same_bits_on_any_sharding() -> None:
    rng = np.random.default_rng(0)
    # Leaves of one element, of fewer and more elements than a chunk, not multiples of the device count.
    tree = {
        "scalar": np.float32(3.0),
        "odd": rng.normal(size=(3, 5)).astype(np.float32),
        "matrix": rng.normal(size=(40, 96)).astype(np.float32),
        "wide": rng.normal(scale=1e3, size=(2, 8, 520)).astype(np.float32),
    }
    expected = np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in tree.values()))
    norms = []
    for spec, axis in ((MeshSpec(data=1), None), (MeshSpec(data=2), None), (MeshSpec(data=1, fsdp=8), 1)):
        mesh = spec.build(jax.devices()[: spec.data * spec.fsdp])

        def placed(x: np.ndarray, mesh: jax.sharding.Mesh = mesh, axis: int | None = axis) -> jax.Array:
            if axis is None or np.ndim(x) <= axis or np.shape(x)[axis] % 8:
                return jax.device_put(x, NamedSharding(mesh, PartitionSpec()))
            return jax.device_put(x, NamedSharding(mesh, PartitionSpec(*[None] * axis, "fsdp")))

        split = CanonicalSlices(mesh, 8)
        norms.append(jax.jit(lambda t, split=split: canonical_norm(t, split))(jax.tree.map(placed, tree)))
    bound = pairwise_norm_tolerance([np.asarray(leaf) for leaf in tree.values()], expected)
    assert np.asarray(norms[0]) == pytest.approx(expected, rel=0, abs=bound)
    assert [np.asarray(norm).tobytes() for norm in norms[1:]] == [np.asarray(norms[0]).tobytes()] * 2


def test_the_canonical_norm_of_fsdp_shards_has_the_same_bits_on_any_mesh() -> None:
    rng = np.random.default_rng(1)

    def named(*axes: tuple[str, int]) -> NamedArray:
        return NamedArray(
            rng.normal(size=[size for _, size in axes]).astype(np.float32), [Axis(*a) for a in axes]
        )

    # Shards whose rows hold whole chunks (no exchange), shards exchanged into runs (an all-to-all), a leaf
    # gathered whole (3 rows over 8 devices), one the layout leaves whole.
    tree = {
        "stack": named(("layers", 4), ("embed", 64), ("mlp", 128)),
        "rows": named(("embed", 64), ("mlp", 128)),
        "columns": named(("vocab", 128), ("embed", 64)),
        "odd": named(("layers", 3), ("embed", 64)),
        "whole": named(("heads", 3), ("head_size", 5)),
    }
    expected = np.sqrt(sum(np.sum(np.square(np.asarray(x.array, np.float64))) for x in tree.values()))
    norms = []
    for spec, layout in (
        (MeshSpec(data=1), Layout.data_parallel()),
        (MeshSpec(data=2), Layout.data_parallel()),
        (MeshSpec(data=1, fsdp=8), Layout.fsdp(min_shard=1)),
        (MeshSpec(data=2, fsdp=4), Layout.fsdp(min_shard=1)),
    ):
        mesh = spec.build(jax.devices()[: spec.data * spec.fsdp])
        split = CanonicalSlices(mesh, 8, layout=layout)
        placed = jax.device_put(tree, layout.shardings(tree, mesh))
        norms.append(jax.jit(lambda t, split=split: canonical_norm(t, split))(placed))
    bound = pairwise_norm_tolerance([np.asarray(leaf.array) for leaf in tree.values()], expected)
    assert np.asarray(norms[0]) == pytest.approx(expected, rel=0, abs=bound)
    assert [np.asarray(norm).tobytes() for norm in norms[1:]] == [np.asarray(norms[0]).tobytes()] * 3


def loss_fn(
    params: Any, batch: dict[str, jax.Array], key: jax.Array
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """A two-layer tanh regression on ``x [rows, 16] -> y [rows, 4]``: a loss sum and its token count."""
    hidden = jnp.tanh(batch["x"] @ params["w1"])
    error = hidden @ params["w2"] - batch["y"]
    return jnp.sum(error**2), {"num_tokens": jnp.asarray(error.shape[0], jnp.int32)}


def run(
    devices: int, fsdp: bool, steps: int = 3, accumulation: int = 1
) -> tuple[list[dict[str, float]], Any]:
    """``steps`` invariant steps of `loss_fn` with clipped AdamW on a mesh of ``devices``, 16 rows a step in
    ``accumulation`` microbatches of 8 slices."""
    spec = MeshSpec(data=1, fsdp=devices) if fsdp else MeshSpec(data=devices)
    mesh = spec.build(jax.devices()[:devices])
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.normal(size=(16, 32)).astype(np.float32),
        "w2": rng.normal(size=(32, 4)).astype(np.float32),
    }
    batch = {
        "x": rng.normal(size=(16, 16)).astype(np.float32),
        "y": rng.normal(size=(16, 4)).astype(np.float32),
    }
    slices = CanonicalSlices(mesh, 16 // accumulation, max_grad_norm=0.5)
    weights = NamedSharding(mesh, PartitionSpec("fsdp") if fsdp else PartitionSpec())
    rows = NamedSharding(mesh, PartitionSpec(("replica", "data", "fsdp", "expert")))
    optimizer = optax.adamw(1e-2)
    state = init_state(jax.device_put(params, weights), optimizer, jax.random.PRNGKey(0))
    step = jax.jit(make_train_step(loss_fn, optimizer, accumulation=accumulation, invariant=slices))
    logged = []
    for _ in range(steps):
        state, metrics = step(state, jax.device_put(batch, rows))
        logged.append(
            {name: float(metrics[name]) for name in ("loss", "grad_norm", "update_norm", "param_norm")}
        )
    return logged, jax.device_get(state.params)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_the_invariant_step_gives_the_same_bits_on_every_split(accumulation: int) -> None:
    reference, params = run(1, fsdp=False, accumulation=accumulation)
    assert all(row["grad_norm"] > 0.5 for row in reference)  # clipping acts
    for devices, fsdp in ((2, False), (8, False), (4, True), (8, True)):
        logged, other = run(devices, fsdp, accumulation=accumulation)
        assert logged == reference, (devices, fsdp)
        for name in params:
            assert np.asarray(other[name]).tobytes() == np.asarray(params[name]).tobytes(), (
                devices,
                fsdp,
                name,
            )


def record(axes: dict[str, int], processes: int = 1, slices: int = 8) -> dict[str, Any]:
    return {METADATA_KEY: {"axes": axes, "processes": processes, "invariant_slices": slices}}


@pytest.mark.parametrize(
    ("saved", "current", "expected"),
    [
        (record({"fsdp": 8}), record({"data": 2}), "trainer.invariant keeps every step bitwise equal"),
        (record({"data": 8}), record({"data": 4}, processes=2), "on data=4, 2 processes (the checkpoint was"),
        (record({"data": 8}), record({"data": 4, "tensor": 2}), "not bitwise equal to the old mesh's steps"),
        (record({"data": 8}), record({"data": 2}, slices=0), "steps will differ in the last bits"),
        (
            record({"data": 8}, slices=8),
            record({"data": 2}, slices=4),
            "with trainer.invariant_slices=8, this run",
        ),
        (record({"data": 8}), record({"data": 8}), None),
        ({}, record({"data": 8}), None),
    ],
    ids=["covered", "processes", "tensor", "off", "slices", "same_mesh", "no_record"],
)
def test_a_resume_on_another_mesh_says_in_one_line_whether_it_stays_bitwise(
    saved: dict[str, Any], current: dict[str, Any], expected: str | None
) -> None:
    note = resume_note(saved, current)
    if expected is None:
        assert note is None
    else:
        assert note is not None and expected in note and "\n" not in note, note
