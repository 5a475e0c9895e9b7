"""`NamedArray`: a JAX array whose dimensions carry names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from halyard.named.axis import Axis, AxisSelector, axis_name, check_unique, format_axes


@jax.tree_util.register_pytree_with_keys_class
class NamedArray:
    """An array plus one `Axis` per dimension.

    A pytree (the array is the leaf, the axes are static), so it passes through ``jit``, ``grad``,
    ``vmap``, ``scan`` and ``remat`` unchanged. Operators broadcast by name (see `halyard.named.broadcast`).

    Args:
        array: a ``jax.Array`` (or anything ``jnp.asarray`` accepts) whose shape matches ``axes``.
        axes: one `Axis` per dimension, in the array's order; names are unique.

    Raises:
        ValueError: when the shape does not match the axes, or a name repeats.
    """

    __slots__ = ("array", "axes")
    __array_priority__ = 1000  # numpy scalars defer to our operators

    array: jax.Array
    axes: tuple[Axis, ...]

    def __init__(self, array: Any, axes: Sequence[Axis]):
        axes = tuple(axes)
        for axis in axes:
            if not isinstance(axis, Axis):
                raise TypeError(f"NamedArray axes must be Axis objects, got {axis!r} in {axes!r}")
        check_unique(axes)
        if not hasattr(array, "shape"):
            array = jnp.asarray(array)
        shape = tuple(array.shape)
        if shape != tuple(a.size for a in axes):
            raise ValueError(
                f"Array of shape {shape} does not match axes {format_axes(axes)}: "
                f"the sizes must agree dimension by dimension"
            )
        object.__setattr__(self, "array", array)
        object.__setattr__(self, "axes", axes)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("NamedArray is immutable; use .at[...] or halyard.named functions")

    # -- pytree --------------------------------------------------------------------------------
    def tree_flatten(self) -> tuple[tuple[Any], tuple[Axis, ...]]:
        """The array is the only leaf; the axes are static metadata."""
        return (self.array,), self.axes

    def tree_flatten_with_keys(self) -> tuple[tuple[tuple[Any, Any]], tuple[Axis, ...]]:
        """Like `tree_flatten`, naming the leaf ``.array`` so key paths read ``params.embed.weight.array``."""
        return ((jax.tree_util.GetAttrKey("array"), self.array),), self.axes

    @classmethod
    def tree_unflatten(cls, axes: tuple[Axis, ...], children: tuple[Any]) -> NamedArray:
        """Rebuild from the leaf and the axes (see `tree_flatten`)."""
        # JAX rebuilds trees with placeholder leaves (None, object(), batched tracers): no checks.
        obj = object.__new__(cls)
        object.__setattr__(obj, "array", children[0])
        object.__setattr__(obj, "axes", axes)
        return obj

    # -- shape information ---------------------------------------------------------------------
    @property
    def shape(self) -> dict[str, int]:
        """``{name: size}`` in the array's order."""
        return {a.name: a.size for a in self.axes}

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The names of the axes, in order."""
        return tuple(a.name for a in self.axes)

    @property
    def dtype(self) -> Any:
        """The array's dtype."""
        return self.array.dtype

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.axes)

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(np.prod([a.size for a in self.axes], dtype=np.int64))

    def has_axis(self, axis: AxisSelector) -> bool:
        """Whether an axis of that name is present (sizes are not compared)."""
        return self._find(axis) is not None

    def axis_index(self, axis: AxisSelector) -> int:
        """Position of ``axis`` in this array; KeyError naming the axes when absent."""
        index = self._find(axis)
        if index is None:
            raise KeyError(f"Axis {axis_name(axis)!r} is not among {format_axes(self.axes)}")
        if isinstance(axis, Axis) and self.axes[index].size != axis.size:
            raise ValueError(
                f"Axis {axis.name!r} has size {self.axes[index].size} in {format_axes(self.axes)}, "
                f"but size {axis.size} was asked for"
            )
        return index

    def axis(self, name: AxisSelector) -> Axis:
        """The `Axis` called ``name``."""
        return self.axes[self.axis_index(name)]

    def axis_size(self, name: AxisSelector) -> int:
        """The size of the axis called ``name``; KeyError naming the axes when absent."""
        return self.axis(name).size

    def _find(self, axis: AxisSelector) -> int | None:
        name = axis_name(axis)
        for i, a in enumerate(self.axes):
            if a.name == name:
                return i
        return None

    # -- conversions ---------------------------------------------------------------------------
    def astype(self, dtype: Any) -> NamedArray:
        """The same axes with values converted to ``dtype``."""
        return NamedArray(self.array.astype(dtype), self.axes)

    def item(self) -> Any:
        """The single value of a one-element array as a Python scalar."""
        return self.array.item()

    # -- the named ops as methods -----------------------------------------------------------------
    # halyard.named.methods binds these to the op modules' functions. Those modules build NamedArrays, so
    # the class sits below them and is handed its methods from above (no import goes back up).
    if TYPE_CHECKING:

        def rename(self, renames: Mapping[AxisSelector, str | Axis]) -> NamedArray:
            """Rename axes: ``x.rename({"pos": "key_pos"})``. Sizes stay; an unknown name is a KeyError."""

        def rearrange(self, *axes: AxisSelector | Any, **sizes: int) -> NamedArray:
            """Transpose to the given axis order (``...`` stands for the remaining axes in their order), or,
            given one string with ``->``, split/merge/transpose as `halyard.named.rearrange` does:
            ``x.rearrange("... (embed: heads head_size) -> ... heads head_size", heads=8)``."""

        def broadcast_axis(self, axes: Axis | Sequence[Axis]) -> NamedArray:
            """Add the given axes (in front) unless present."""

        def unwrap(self, *axes: AxisSelector) -> jax.Array:
            """The plain array with dimensions in the order of ``axes`` (all of them must be named)."""

        def __getitem__(self, index: Any) -> NamedArray:
            """``x["pos", 3:7]``, ``x["batch", 0, "pos", 1:]``, ``x[{"batch": 0}]``; see `named.indexing`."""

        @property
        def at(self) -> Any:
            """Functional updates by name: ``x.at["pos", 3].set(v)``, ``.add``, ``.multiply``, ``.get``."""

        def sum(self, axis: Any = None, *, where: Any = None) -> NamedArray:
            """Sum over ``axis`` (names; all when None); see `halyard.named.sum`."""

        def mean(self, axis: Any = None, *, where: Any = None) -> NamedArray:
            """Mean over ``axis``; see `halyard.named.mean`."""

        def max(self, axis: Any = None, *, where: Any = None) -> NamedArray:
            """Maximum over ``axis``; see `halyard.named.max`."""

        def min(self, axis: Any = None, *, where: Any = None) -> NamedArray:
            """Minimum over ``axis``; see `halyard.named.min`."""

        def _binary(self, other: Any, op: Any, reverse: bool = False) -> NamedArray:
            """``op(self, other)`` (``op(other, self)`` when ``reverse``), broadcast by name."""

    # -- operators (broadcast by name) ---------------------------------------------------------
    def __add__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.add)

    def __radd__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.add, True)

    def __sub__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.subtract)

    def __rsub__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.subtract, True)

    def __mul__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.multiply)

    def __rmul__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.multiply, True)

    def __truediv__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.true_divide)

    def __rtruediv__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.true_divide, True)

    def __floordiv__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.floor_divide)

    def __rfloordiv__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.floor_divide, True)

    def __mod__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.mod)

    def __rmod__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.mod, True)

    def __pow__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.power)

    def __rpow__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.power, True)

    def __and__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.logical_and if self.dtype == bool else jnp.bitwise_and)

    def __rand__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.logical_and if self.dtype == bool else jnp.bitwise_and, True)

    def __or__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.logical_or if self.dtype == bool else jnp.bitwise_or)

    def __ror__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.logical_or if self.dtype == bool else jnp.bitwise_or, True)

    def __xor__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.logical_xor if self.dtype == bool else jnp.bitwise_xor)

    def __lt__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.less)

    def __le__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.less_equal)

    def __gt__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.greater)

    def __ge__(self, o: Any) -> NamedArray:
        return self._binary(o, jnp.greater_equal)

    def __eq__(self, o: Any) -> NamedArray:  # type: ignore[override]
        return self._binary(o, jnp.equal)

    def __ne__(self, o: Any) -> NamedArray:  # type: ignore[override]
        return self._binary(o, jnp.not_equal)

    __hash__ = None  # type: ignore[assignment]

    def __neg__(self) -> NamedArray:
        return NamedArray(-self.array, self.axes)

    def __pos__(self) -> NamedArray:
        return self

    def __abs__(self) -> NamedArray:
        return NamedArray(jnp.abs(self.array), self.axes)

    def __invert__(self) -> NamedArray:
        return NamedArray(~self.array, self.axes)

    def __iter__(self) -> Any:
        # Without this, Python would iterate through __getitem__ with positional ints.
        raise TypeError(
            f"A NamedArray {format_axes(self.axes)} is not iterable by position; use "
            f"halyard.named.unstack(x, axis) or index by name, x[axis, i]"
        )

    def __bool__(self) -> bool:
        return bool(self.array)

    def __float__(self) -> float:
        return float(self.array)

    def __int__(self) -> int:
        return int(self.array)

    def __repr__(self) -> str:
        return f"NamedArray({format_axes(self.axes)}, dtype={getattr(self.array, 'dtype', '?')})"


def named(array: Any, axes: AxisSelector | Sequence[AxisSelector]) -> NamedArray:
    """Wrap a plain array: ``named(x, ("batch", "embed"))`` takes sizes from ``x.shape``.

    Args:
        array: anything ``jnp.asarray`` accepts.
        axes: one name or `Axis` per dimension; an `Axis` size is checked against the shape.
    """
    if not hasattr(array, "shape"):
        array = jnp.asarray(array)
    if isinstance(axes, Axis | str):
        axes = (axes,)
    axes = tuple(axes)
    if len(axes) != array.ndim:
        raise ValueError(
            f"Array of shape {tuple(array.shape)} has {array.ndim} dimensions, "
            f"but axes {axes!r} name {len(axes)}"
        )
    resolved = tuple(a if isinstance(a, Axis) else Axis(a, int(s)) for a, s in zip(axes, array.shape))
    return NamedArray(array, resolved)


wrap = named  # the inverse of `unwrap`, for symmetry: wrap(x, ("batch", "embed"))


def is_named(x: Any) -> bool:
    """True when ``x`` is a NamedArray (handy as ``is_leaf`` in tree utilities)."""
    return isinstance(x, NamedArray)
