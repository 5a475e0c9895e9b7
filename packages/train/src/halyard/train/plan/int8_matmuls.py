"""The int8 matmuls of a lowered program: what ``model.quantization: int8`` made of the layers' projections.

`halyard.named.nn.int8_dot_general` runs three int8 x int8 -> int32 products per projection, told apart by
which operand dimensions they contract (its operand order): the forward product contracts the weight's
leading (input) dimensions; the input gradient contracts the weight's trailing (output) dimensions; the weight
gradient contracts the leading (token) dimensions of both its operands.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_DOT = re.compile(
    r"stablehlo\.dot_general .*contracting_dims = \[([\d, ]*)\] x \[([\d, ]*)\].*"
    r": \(tensor<[\dx]*xi8>, tensor<[\dx]*xi8>\) -> tensor<[\dx]*xi32>"
)


class Int8Matmuls(NamedTuple):
    """Counts of int8 x int8 -> int32 ``dot_general``s in a program, by the product they compute."""

    forward: int
    """``x · W``: the projections' forward products."""
    input_gradient: int
    """``dy · Wᵀ``."""
    weight_gradient: int
    """``xᵀ · dy``."""

    @property
    def total(self) -> int:
        return self.forward + self.input_gradient + self.weight_gradient


def int8_matmuls(stablehlo: str) -> Int8Matmuls:
    """Count the int8 products in ``stablehlo`` (``jax.jit(f).lower(...).as_text()``: global shapes, before
    XLA rewrites them), by the rule of the module docstring."""
    forward = input_gradient = weight_gradient = 0
    for match in _DOT.finditer(stablehlo):
        lhs = [int(d) for d in match[1].split(",")]
        rhs = [int(d) for d in match[2].split(",")]
        leading = list(range(len(lhs)))
        if lhs == leading and rhs == leading:
            weight_gradient += 1
        elif rhs == leading:
            forward += 1
        else:
            input_gradient += 1
    return Int8Matmuls(forward, input_gradient, weight_gradient)
