"""Hypothesis strategies for named arrays: random axes, sizes, axis orders and values."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from halyard.named import Axis, NamedArray, named

NAMES = ("batch", "pos", "embed", "heads", "mlp", "vocab")


@st.composite
def axis_pools(draw: st.DrawFn, min_axes: int = 1, max_axes: int = 3, max_size: int = 3) -> tuple[Axis, ...]:
    """Distinct axes with consistent sizes, from which operands pick their axes."""
    names = draw(st.lists(st.sampled_from(NAMES), min_size=min_axes, max_size=max_axes, unique=True))
    return tuple(Axis(n, draw(st.integers(1, max_size))) for n in names)


@st.composite
def subsets(draw: st.DrawFn, pool: tuple[Axis, ...], min_size: int = 0) -> tuple[Axis, ...]:
    """Some of ``pool``'s axes in a random order."""
    chosen = (
        draw(st.lists(st.sampled_from(pool), min_size=min_size, max_size=len(pool), unique=True))
        if pool
        else []
    )
    return tuple(chosen)


def values(axes: tuple[Axis, ...], seed: int, dtype: str = "float32") -> NamedArray:
    """A NamedArray with ``axes`` and values from a seeded generator (fast; hypothesis draws the seed)."""
    rng = np.random.default_rng(seed)
    shape = tuple(a.size for a in axes)
    if dtype == "bool":
        data = rng.random(shape) < 0.6
    elif dtype.startswith("int"):
        data = rng.integers(-5, 6, shape).astype(dtype)
    else:
        data = rng.standard_normal(shape).astype(dtype)
    return named(jnp.asarray(data), axes)


seeds = st.integers(0, 2**31 - 1)


def numpy_aligned(x: NamedArray, order: tuple[Axis, ...]) -> np.ndarray:
    """``x`` as numpy, transposed to the order of ``order`` with size-1 dims where it lacks an axis."""
    raw = np.asarray(x.array)
    names = [a.name for a in x.axes]
    present = [a.name for a in order if a.name in names]
    raw = np.transpose(raw, [names.index(n) for n in present])
    return raw.reshape([a.size if a.name in names else 1 for a in order])


def check_grads_jitted(fn, args, order: int = 1, modes=("rev",)) -> None:
    """``jax.test_util.check_grads`` on a jitted ``fn`` (eager dispatch of every op is slow on 2 cores)."""
    import jax
    from jax.test_util import check_grads

    check_grads(jax.jit(fn), tuple(args), order=order, modes=list(modes), eps=1e-2, atol=2e-2, rtol=2e-2)
