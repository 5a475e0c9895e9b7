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
    pages = pages.for_rows(jnp.asarray([[2, 3]], jnp.int32), jnp.asarray([[0, 1, 99]], jnp.int32))
    new = jnp.ones((2, 1, 3, 2, 8)) * jnp.arange(1, 4)[None, None, :, None, None]
    from halyard.named import named

    keys = named(new, ("layers", "batch", "key_pos", "kv_heads", "head_size"))
    stored = pages.written(keys, keys)
    written = np.asarray(
        stored.key_pages.rearrange("layers", "page", "page_slot", "kv_heads", "head_size").array
    )
    assert written[:, 2, :2].min() > 0 and not written[:, 2, 2:].any()  # positions 0 and 1 in page 2
    assert not written[:, [0, 1, 3]].any()  # the padding token (position 99) went nowhere
