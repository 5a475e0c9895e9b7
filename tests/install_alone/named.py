"""Smoke use of halyard-named installed alone: a named contraction matches numpy."""

import jax
import numpy as np

import halyard.named as hn
from halyard.named import Axis

Batch, Embed, Vocab = Axis("batch", 2), Axis("embed", 3), Axis("vocab", 4)
x = hn.random.normal(jax.random.key(0), (Batch, Embed))
w = hn.random.normal(jax.random.key(1), (Vocab, Embed))  # the other axis order: matched by name
logits = jax.jit(lambda a, b: hn.dot(a, b, axis="embed"))(x, w)
assert logits.shape == {"batch": 2, "vocab": 4}, logits.shape
expected = np.asarray(x.array) @ np.asarray(w.array).T
# the 3 products' sum in another order (tests/support/float_tolerance's summation_tolerance, which this
# install lacks): 3 eps at the addends' size
bound = (
    Embed.size
    * np.finfo(np.float32).eps
    * (np.abs(np.asarray(x.array)) @ np.abs(np.asarray(w.array)).T).max()
)
np.testing.assert_allclose(np.asarray(logits.array), expected, atol=bound, rtol=0)
print("named ok", logits.shape)
