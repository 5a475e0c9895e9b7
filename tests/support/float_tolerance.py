"""Tolerances of float comparisons derived from the arithmetic, so that they hold on any x86-64 CPU.

XLA's CPU backend picks its kernels per instruction set (FMA or not, 256- or 512-bit vectors, oneDNN or
Eigen), and with them the order in which it adds the terms of a sum: two programs that compute the same
value, or one program on two CPUs, differ by rounding. A tolerance that one CPU happens to meet is not a
bound; these are:

- `summation_tolerance(values, terms, dtype)`: how far two evaluations of ``values`` may differ when the
  sums that produce them are added up in another order;
- `decoder_terms(shape, length)`: the ``terms`` of a decoder's forward pass, reduction by reduction;
- `FUNCTION_TERMS`: the ``terms`` one elementwise function (exp, log, tanh, sin, a square root) adds.
- `INVERSE_FREQUENCY_TERMS`: a rotary inverse frequency's relative error in eps; `rotary_tolerance` for
  rotated values (the angle's error times the position).

Comparisons that are the same computation by construction (the same program, the same inputs) stay exact
instead: these bound reordering, not bugs.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from numpy.typing import ArrayLike, DTypeLike

# XLA's CPU kernels for exp, log, tanh, sin, cos, rsqrt and the logistic are within 3.2 eps (relative) of the
# exact value on 10^6 float32 arguments, with this CPU's best instruction set and with --xla_cpu_max_isa=SSE4_2
# (tanh is the worst; numpy's are within 1): one such function in a chain adds at most this many terms.
FUNCTION_TERMS = 4


# A rotary inverse frequency's relative error, float32 against float32 in another implementation (or the
# exact value): the base's power (an exp and a log; a dynamic scaling's base is another power, at most ~1.2
# times its own base's error), the reciprocal, and a scaling's quotient and blend (llama3's smooth factor or
# yarn's ramp err by a few eps of the frequency itself): 4 functions' and 4 roundings' worth.
INVERSE_FREQUENCY_TERMS = 4 * FUNCTION_TERMS + 4


def summation_tolerance(values: ArrayLike, terms: int, dtype: DTypeLike = np.float32) -> float:
    """The absolute difference two evaluation orders of ``values``' sums can make, at first order.

    Recursive summation of ``n`` addends is within ``(n - 1) * u * sum(|addends|)`` of the exact sum
    (``u = eps / 2``, Higham, *Accuracy and Stability of Numerical Algorithms*, 4.2), so two orders are
    within ``(n - 1) * eps * sum(|addends|)`` of each other. Along a chain of reductions (a forward pass:
    dot products, a softmax's sum, a norm's mean) the relative errors of the steps add up, so ``n`` is the
    sum of the chain's reduction lengths. ``sum(|addends|)`` is taken as the largest ``|value|``: the bound
    holds for computations without cancellation beyond the values' own magnitude (a well-conditioned step:
    a norm, a softmax, a product with random weights), not for a difference of two large numbers.

    Args:
        values: the reference values the comparison checks (their largest magnitude scales the bound).
        terms: how many addends the sums producing one value have in all, along the chain of reductions
            whose order may differ (`decoder_terms` for a decoder's forward pass).
        dtype: the floating type the sums are computed in (its machine epsilon).

    Returns:
        The bound, to pass as ``atol`` (with ``rtol=0``: it already scales with the values).
    """
    if terms < 1:
        raise ValueError(f"terms must be at least 1, got {terms}")
    magnitude = float(np.max(np.abs(np.asarray(values, np.float64)), initial=0.0))
    # ml_dtypes' finfo: numpy's refuses bfloat16 where ml_dtypes has not registered it (the TPU machine)
    return terms * float(ml_dtypes.finfo(dtype).eps) * magnitude


def decoder_terms(config: Any, length: int) -> int:
    """The reduction lengths along a decoder's forward pass, from the embeddings to one logit.

    Per layer: each of its norms (a mean over the width; q/k norms over a head or all heads), the q/k/v
    projections (the width), the attention scores (a head's size), the softmax's sum and the weighted values
    (``length`` keys each), the output projection (every query head's values), the MLP's input (the width)
    and output (its hidden size); then the final norm and the vocabulary projection (the width each).

    Args:
        config: the model's `halyard.models.DecoderConfig` (its ``shape`` and ``layout()``).
        length: the most keys one query attends to.
    """
    shape, layout = config.shape, config.layout()
    qk_norm = {"head": shape.head_size, "projection": shape.heads * shape.head_size}.get(layout.qk_norm, 0)
    per_layer = (
        layout.norms_per_layer * shape.embed
        + qk_norm
        + shape.embed
        + shape.head_size
        + 2 * length
        + shape.heads * shape.head_size
        + shape.embed
        + shape.mlp
    )
    return shape.layers * per_layer + 2 * shape.embed


def attention_terms(head_size: int, keys: int, key_blocks: int = 1, queries_per_key: int = 0) -> int:
    """The ``terms`` of attention's output: a score's dot product (``head_size``), its soft-cap's tanh and
    the softmax's exp, the softmax's sum and the weighted sum of the values (``keys`` each); a blocked
    (online) softmax rescales its sums once per key block (an exp and a product).

    Args:
        head_size: the size of one head.
        keys: the most keys one query sees.
        key_blocks: the key blocks a blocked implementation walks (1 for one softmax over all keys).
        queries_per_key: for the gradients, the queries times query heads that read one key (the key and
            value gradients sum over them; the backward pass goes through the forward's sums again); 0 for
            the output alone.
    """
    forward = head_size + 2 * keys + 2 * FUNCTION_TERMS + key_blocks * (FUNCTION_TERMS + 1)
    return forward if queries_per_key == 0 else 2 * forward + queries_per_key


def training_terms(config: Any, rows: int, length: int) -> int:
    """The ``terms`` of a training step's loss and gradients: the forward pass (`decoder_terms`), the
    backward pass through the same reductions, and the sums over the batch's ``rows * length`` tokens (the
    mean loss, every weight's gradient)."""
    return 2 * decoder_terms(config, length) + rows * length


def assert_loss_and_grads_close(
    got: tuple[float, list[np.ndarray]], want: tuple[float, list[np.ndarray]], terms: int
) -> None:
    """Equal losses and gradient leaves ``(loss, [leaf, ...])`` to the summation order of ``terms`` addends
    (`training_terms`).

    Every leaf is held to the bound of the largest gradient of all leaves: a gradient is a sum of products of
    the same upstream gradients, whose sizes that one shows, and a leaf may be near 0 by cancellation alone
    (a bias behind a norm), where its own magnitude would bound nothing.
    """
    np.testing.assert_allclose(
        got[0], want[0], atol=summation_tolerance(want[0], terms), rtol=0, err_msg="loss"
    )
    assert len(got[1]) == len(want[1]), f"{len(got[1])} gradient leaves, {len(want[1])} expected"
    scale = max(float(np.max(np.abs(leaf), initial=0.0)) for leaf in want[1])
    tolerance = summation_tolerance(scale, terms)
    for index, (a, b) in enumerate(zip(got[1], want[1])):
        np.testing.assert_allclose(a, b, atol=tolerance, rtol=0, err_msg=f"gradient leaf {index}")


def rotary_tolerance(values: ArrayLike, positions: ArrayLike, rotated: ArrayLike) -> float:
    """How far two evaluations of a rotary embedding of ``values`` at ``positions`` (giving ``rotated``) may
    differ, at first order.

    An angle is a position times an inverse frequency (at most 1): a power of the base (an exp and a log; a
    dynamic scaling's base is another power), a quotient and a scaling's blend (a product and a sum), so the
    angle's relative error is within `INVERSE_FREQUENCY_TERMS` eps, and a rotated value moves by ``|value|``
    times the angle's error; cos or sin and the rotation's two products and sum add their own.
    """
    angle = float(np.max(np.abs(np.asarray(positions, np.float64)), initial=0.0))
    magnitude = float(np.max(np.abs(np.asarray(values, np.float64)), initial=0.0))
    return summation_tolerance(magnitude * angle, INVERSE_FREQUENCY_TERMS) + summation_tolerance(
        rotated, FUNCTION_TERMS + 3
    )


# A learning rate from halyard.train.optim.schedules, in float32, at the peak's size: the decay's progress (a
# quotient), pi times it (with pi's own rounding: about 4 roundings of an argument up to pi, which the cosine's
# slope of at most 1 passes on) and the cosine's or square root's own error, the blend 0.5 * (1 + shape),
# final + (peak - final) * shape, and the warmup's quotient and product.
SCHEDULE_TERMS = 4 * 4 + FUNCTION_TERMS + 6


def referee_terms(config: Any, length: int) -> int:
    """The ``terms`` of a decoder's logits computed by two implementations (Halyard's JAX against transformers'
    torch, or lm-eval's model on it): `decoder_terms`, and what each computes on its own: every layer's MLP
    activation (one function), the rotary angles ``position * inverse frequency`` (an angle up to ``length``
    with `rotary_tolerance`'s relative error, `INVERSE_FREQUENCY_TERMS` eps, moves q and k by their size
    times the angle's error, in every layer; learned positions have none, the bound counts them anyway) and
    a final soft-cap's tanh.

    Args:
        config: the model's `halyard.models.DecoderConfig`.
        length: the most positions one sequence has (the largest position, the most keys of a query).
    """
    rotary = 2 * (length * INVERSE_FREQUENCY_TERMS + FUNCTION_TERMS + 3)
    return decoder_terms(config, length) + config.shape.layers * (FUNCTION_TERMS + rotary) + FUNCTION_TERMS
