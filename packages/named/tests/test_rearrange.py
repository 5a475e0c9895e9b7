"""rearrange (split / merge / transpose by name), flatten_axes and unflatten_axis, against einops."""

import einops
import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from named_strategies import axis_pools, check_grads_jitted, seeds, subsets, values

import halyard.named as hn
from halyard.named import Axis


@given(
    data=st.data(),
    pool=axis_pools(min_axes=0),
    seed=seeds,
    parts=st.tuples(st.integers(1, 3), st.integers(1, 3)),
)
def test_rearrange_matches_einops(data, pool, seed, parts):
    fused = Axis("fused", parts[0] * parts[1])
    x = values(data.draw(st.permutations(pool + (fused,))), seed)
    letters = {a.name: f"a{i}" for i, a in enumerate(x.axes)} | {"left": "left", "right": "right"}

    # Left: every axis by name in a random order, the fused one split; some replaced by "...".
    elided_left = data.draw(subsets(tuple(a for a in x.axes if a != fused)))
    left_items = [a for a in data.draw(st.permutations(x.axes)) if a not in elided_left]
    left = ["(fused: left right)" if a == fused else a.name for a in left_items]
    if elided_left:
        left.insert(data.draw(st.integers(0, len(left))), "...")

    # Right: a random order of the expanded axes, some left to "...", two neighbours maybe merged.
    expanded = []
    for a in x.axes:
        expanded.extend(["left", "right"] if a == fused else [a.name])
    elided_right = data.draw(subsets(tuple(expanded)))
    named_right = [n for n in data.draw(st.permutations(expanded)) if n not in elided_right]
    merge_at = data.draw(st.none() | st.integers(0, max(len(named_right) - 2, 0)))
    right_tokens = [[n] for n in named_right]
    if merge_at is not None and len(named_right) >= 2:
        right_tokens[merge_at : merge_at + 2] = [right_tokens[merge_at] + right_tokens[merge_at + 1]]
    ellipsis_at = data.draw(st.integers(0, len(right_tokens))) if elided_right else None
    if ellipsis_at is not None:
        right_tokens.insert(ellipsis_at, ["..."])

    def halyard_token(token):
        return token[0] if len(token) == 1 else f"(merged: {' '.join(token)})"

    def einops_token(token):
        if token == ["..."]:
            return " ".join(letters[n] for n in expanded if n in elided_right)
        names = " ".join(letters[n] for n in token)
        return names if len(token) == 1 else f"({names})"

    spec = f"{' '.join(left)} -> {' '.join(halyard_token(t) for t in right_tokens)}"
    sizes = data.draw(
        st.sampled_from([{"left": parts[0]}, {"right": parts[1]}, {"left": parts[0], "right": parts[1]}])
    )
    out = hn.rearrange(x, spec, **sizes)

    einops_left = " ".join("(left right)" if a == fused else letters[a.name] for a in x.axes)
    einops_right = " ".join(einops_token(t) for t in right_tokens)
    expected = einops.rearrange(np.asarray(x.array), f"{einops_left} -> {einops_right}", left=parts[0])
    np.testing.assert_array_equal(out.array, expected)
    expected_names = []
    for token in right_tokens:
        if token == ["..."]:
            expected_names.extend(n for n in expanded if n in elided_right)
        else:
            expected_names.append(token[0] if len(token) == 1 else "merged")
    assert out.axis_names == tuple(expected_names)


def test_rearrange_round_trip_heads_and_method_form():
    Batch, Pos, Embed = Axis("batch", 2), Axis("pos", 3), Axis("embed", 12)
    x = values((Batch, Pos, Embed), 0)
    heads = x.rearrange("batch pos (embed: heads head_size) -> batch heads pos head_size", heads=4)
    assert heads.axes == (Batch, Axis("heads", 4), Pos, Axis("head_size", 3))
    back = hn.rearrange(heads, "... -> batch pos (embed: heads head_size)")
    np.testing.assert_array_equal(back.array, x.array)
    assert x.rearrange("embed", ...).axis_names == ("embed", "batch", "pos")


def test_rearrange_rename_with_a_one_part_group_and_under_jit():
    x = values((Axis("batch", 2), Axis("pos", 3)), 0)
    out = jax.jit(lambda v: hn.rearrange(v, "batch pos -> (key_pos: pos) batch"))(x)
    assert out.axis_names == ("key_pos", "batch")
    np.testing.assert_array_equal(out.array, np.asarray(x.array).T)


@pytest.mark.parametrize(
    "spec, sizes, error, match",
    [
        ("batch pos -> batch", {}, ValueError, r"right side leaves out \['pos'\]"),
        ("batch -> batch pos", {}, ValueError, r"left side leaves out \['pos'\]"),
        ("batch pos embed -> ...", {}, KeyError, "'embed', which is not an axis of the input"),
        ("batch batch pos -> ...", {}, ValueError, "'batch' appears twice on the left"),
        ("... -> pos pos batch", {}, ValueError, "'pos' appears twice on the right"),
        ("... -> vocab ...", {}, ValueError, "right side names 'vocab'"),
        ("batch pos", {}, ValueError, "exactly one '->'"),
        ("(pos: a b) batch -> ...", {}, ValueError, "needs the sizes of all but one"),
        ("(pos: a b) batch -> ...", {"a": 4}, ValueError, "does not divide"),
        ("(pos: a b) batch -> ...", {"a": 2, "b": 2}, ValueError, "multiply to 4"),
        ("... -> ...", {"heads": 2}, ValueError, r"sizes \['heads'\] are given but no split"),
        ("(pos a b) batch -> ...", {}, ValueError, "unexpected '\\('"),
        ("... -> ... ...", {}, ValueError, "at most one '...'"),
        ("(pos: ) batch -> ...", {}, ValueError, "needs one or more axis names"),
    ],
)
def test_rearrange_errors_name_the_problem(spec, sizes, error, match):
    x = values((Axis("batch", 2), Axis("pos", 6)), 0)
    with pytest.raises(error, match=match):
        hn.rearrange(x, spec, **sizes)


@given(data=st.data(), pool=axis_pools(min_axes=2, max_axes=4), seed=seeds)
def test_flatten_then_unflatten_matches_einops(data, pool, seed):
    x = values(data.draw(st.permutations(pool)), seed)
    merged = data.draw(subsets(x.axes, min_size=1))
    flat = hn.flatten_axes(x, [a.name for a in merged], "flat")
    first = min(x.axes.index(a) for a in merged)
    kept_before = [a for a in x.axes[:first] if a not in merged]
    kept_after = [a for a in x.axes[first:] if a not in merged]
    assert flat.axes == (*kept_before, Axis("flat", int(np.prod([a.size for a in merged]))), *kept_after)
    letters = {a.name: f"a{i}" for i, a in enumerate(x.axes)}
    group = "(" + " ".join(letters[a.name] for a in merged) + ")"
    pattern = (
        " ".join(letters[a.name] for a in x.axes)
        + " -> "
        + " ".join([letters[a.name] for a in kept_before] + [group] + [letters[a.name] for a in kept_after])
    )
    np.testing.assert_array_equal(flat.array, einops.rearrange(np.asarray(x.array), pattern))
    restored = hn.unflatten_axis(flat, "flat", merged)
    np.testing.assert_array_equal(restored.rearrange(*x.axis_names).array, x.array)


def test_flatten_unflatten_errors():
    x = values((Axis("batch", 2), Axis("pos", 3)), 0)
    with pytest.raises(ValueError, match="gives size 6, not 5"):
        hn.flatten_axes(x, ["batch", "pos"], Axis("flat", 5))
    with pytest.raises(ValueError, match="multiply to 4"):
        hn.unflatten_axis(x, "pos", [Axis("a", 2), Axis("b", 2)])
    with pytest.raises(KeyError, match="'embed' is not among"):
        hn.flatten_axes(x, ["embed"], "flat")


def test_rearrange_gradients():
    axes = (Axis("batch", 2), Axis("embed", 6))
    x = values(axes, 0)

    def f(raw):
        out = hn.rearrange(
            hn.named(raw, axes), "batch (embed: heads head_size) -> head_size (both: batch heads)", heads=3
        )
        return hn.tanh(out).array * np.arange(6.0)[None, :]

    check_grads_jitted(f, (x.array,), order=1, modes=("fwd", "rev"))
