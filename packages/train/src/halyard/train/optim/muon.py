"""Muon for matrices: momentum orthogonalised by Newton-Schulz (optax.contrib), with AdamW for the rest.

Which dimensions form the matrix: a `halyard.named.nn.Linear` weight contracts its `In` axes and
produces its `Out` axes, so those are the matrix's rows and columns exactly, and the stacking axes
(`layers`, `experts`) are batch dimensions orthogonalised independently. Any other NamedArray uses its
first own axis as rows and the remaining own axes as columns; a plain array its last two dimensions
(leading ones are batch). Embedding tables, vectors and scalars go to AdamW (`muon_labels`).

After orthogonalisation each update is scaled by `rms_scale * sqrt(max(rows, cols))` (Liu et al. 2025,
"Muon is Scalable for LLM Training"), which gives it the RMS of a typical AdamW update, so one learning
rate and one weight decay serve both groups.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import optax
from optax.contrib import MuonDimensionNumbers

from halyard.named import NamedArray
from halyard.named.nn import Linear
from halyard.train.optim.paths import (
    BATCH_AXIS_NAMES,
    is_embedding,
    is_parameter_node,
    map_parameters,
    own_ndim,
)

MUON_LABEL = "muon"
ADAM_LABEL = "adam"


def muon_labels(params: Any) -> Any:
    """Label each parameter `"muon"` (a matrix: 2+ own dimensions, not an embedding) or `"adam"`.

    Args:
        params: the parameter pytree.
    """
    return map_parameters(
        lambda name, parameter: (
            MUON_LABEL if own_ndim(parameter) >= 2 and not is_embedding(name, parameter) else ADAM_LABEL
        ),
        params,
    )


def _named_dimension_numbers(parameter: NamedArray, input_names: set[str] | None) -> MuonDimensionNumbers:
    names = [axis.name for axis in parameter.axes]
    own = [index for index, name in enumerate(names) if name not in BATCH_AXIS_NAMES]
    if input_names:
        rows = tuple(index for index in own if names[index] in input_names)
    else:
        rows = tuple(own[:1])
    columns = tuple(index for index in own if index not in rows)
    return MuonDimensionNumbers(reduction_axis=rows, output_axis=columns)


def matrix_dimension_numbers(updates: Any) -> Any:
    """For each parameter, which dimensions are the rows / columns of its matrix (see the module doc).

    Args:
        updates: parameters or updates (entries masked by optax are passed through).

    Returns:
        A tree with `updates`' structure holding `optax.contrib.MuonDimensionNumbers` in place of arrays.
    """

    def visit(node: Any, input_names: set[str] | None = None) -> Any:
        if isinstance(node, Linear):
            names = {axis.name for axis in node.In}
            return jax.tree.map(lambda child: visit(child, names), node, is_leaf=is_parameter_node)
        if isinstance(node, optax.MaskedNode):
            return node
        if isinstance(node, NamedArray):
            if isinstance(node.array, optax.MaskedNode):
                return node
            return NamedArray.tree_unflatten(node.axes, (_named_dimension_numbers(node, input_names),))
        return MuonDimensionNumbers(reduction_axis=node.ndim - 2, output_axis=node.ndim - 1)

    return jax.tree.map(visit, updates, is_leaf=_is_node)


def _is_node(node: Any) -> bool:
    return isinstance(node, Linear | NamedArray | optax.MaskedNode)


class MatrixShapeScaleState(NamedTuple):
    """No state: the scale depends only on shapes."""


def scale_by_matrix_shape(rms_scale: float = 0.2) -> optax.GradientTransformation:
    """Multiply each orthogonalised update by `rms_scale * sqrt(max(rows, cols))` of its matrix.

    Args:
        rms_scale: target RMS of the update relative to an orthogonal matrix's (0.2 matches AdamW's).
    """

    def init(params: Any) -> MatrixShapeScaleState:
        del params
        return MatrixShapeScaleState()

    def update(updates: Any, state: MatrixShapeScaleState, params: Any = None) -> tuple[Any, Any]:
        del params

        def scale(update: jax.Array, numbers: MuonDimensionNumbers) -> jax.Array:
            rows = math.prod(update.shape[axis] for axis in _as_tuple(numbers.reduction_axis))
            columns = math.prod(update.shape[axis] for axis in _as_tuple(numbers.output_axis))
            return update * (rms_scale * math.sqrt(max(rows, columns)))

        numbers = matrix_dimension_numbers(updates)
        scaled = jax.tree.map(scale, updates, numbers, is_leaf=lambda x: isinstance(x, MuonDimensionNumbers))
        return scaled, state

    return optax.GradientTransformation(init, update)


def _as_tuple(axes: int | tuple[int, ...] | Any) -> tuple[int, ...]:
    return (axes,) if isinstance(axes, int) else tuple(axes)


def scale_by_muon_or_adam(
    *,
    beta: float,
    ns_steps: int,
    nesterov: bool,
    rms_scale: float,
    adam_beta1: float,
    adam_beta2: float,
    adam_epsilon: float,
    labels: Any = muon_labels,
) -> optax.GradientTransformationExtraArgs:
    """Muon's direction for matrices and Adam's for everything else (learning rate chained on later); the
    settings are `MuonConfig`'s fields, where their defaults live.

    Args:
        beta: Muon momentum decay.
        ns_steps: Newton-Schulz iterations.
        nesterov: use Nesterov momentum for Muon.
        rms_scale: see `scale_by_matrix_shape`.
        adam_beta1, adam_beta2, adam_epsilon: Adam's settings for the non-matrix parameters.
        labels: a function `params -> tree of "muon" | "adam"` (default `muon_labels`), or such a tree.
    """
    matrices = optax.chain(
        optax.contrib.scale_by_muon(
            ns_steps=ns_steps, beta=beta, nesterov=nesterov, weight_dimension_numbers=matrix_dimension_numbers
        ),
        scale_by_matrix_shape(rms_scale),
    )
    others = optax.scale_by_adam(b1=adam_beta1, b2=adam_beta2, eps=adam_epsilon)
    return optax.multi_transform({MUON_LABEL: matrices, ADAM_LABEL: others}, labels)
