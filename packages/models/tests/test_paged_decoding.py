"""`CausalLM.paged_step` (the inference engine's forward) against the full forward: a sequence fed in
chunks and then token by token through pages scattered over a pool gives the full forward's logits, for
every kind of family (GQA, sliding windows, learned positions, experts, muP)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import decoder_terms, summation_tolerance
from paged import paged_logits
from tiny import random_tokens, tiny

from halyard.models import init_model


@pytest.mark.parametrize("family", ["llama", "mistral", "gpt2", "mixtral", "mup"])
def test_paged_decoding_matches_the_full_forward(family: str) -> None:
    model = init_model(tiny(family), jax.random.key(1))
    tokens = random_tokens(2, 11)
    full = np.asarray(jax.jit(lambda m, t: m(t))(model, tokens).unwrap("batch", "pos", "vocab"))
    paged = paged_logits(model, tokens, [3, 7, 8, 9, 10, 11])
    # the same sums as the full forward, added in other orders (chunks, pages)
    terms = decoder_terms(model.model_config, tokens.axis_size("pos"))
    np.testing.assert_allclose(paged, full, atol=summation_tolerance(full, terms), rtol=0)


def test_padding_tokens_are_never_stored() -> None:
    model = init_model(tiny("llama"), jax.random.key(1))
    pages = model.init_pages(4, 4)
    new = jnp.ones((3, 2, 8)) * jnp.arange(1, 4)[:, None, None]
    # positions 0 and 1 go to page 2's first two slots; the third token is padding (slot -1)
    slots = jnp.asarray([8, 9, -1], jnp.int32)
    pool = pages.kernel.write(pages.pool, jnp.int32(1), new, new, slots)
    written = np.asarray(pool.keys.rearrange("layers", "page", "page_slot", "kv_heads", "head_size").array)
    assert written[1, 2, :2].min() > 0 and not written[1, 2, 2:].any()
    assert not written[1, [0, 1, 3]].any() and not written[0].any()  # the padding token went nowhere
