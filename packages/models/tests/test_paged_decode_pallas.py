"""The token-by-token decode kernel (`halyard.models.attention.paged_decode_pallas`) through
`PallasPagedKernel.attend`, in Pallas's TPU interpreter on CPU: the kernel tests' ragged step (a prefill chunk,
a decode row sharing a prefix page, a fresh prompt, padding) against the dense reference, with the online
softmax over several chunks, a sliding window, a soft cap and padded rows; steps with empty sequences; which
programs get it. On a TPU: test_ragged_paged_pallas.py's chip check runs it compiled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ragged_case import SEQS, STEP_LAYER, TOKENS, dense_reference, ragged_step
from test_ragged_paged_pallas import (
    EMPTY_SEQUENCE_STEPS,
    SETTINGS,
    UNWAITED,
    empty_sequences_step,
    run_kernel,
    tolerance,
)

from halyard.models.attention import paged_decode_pallas
from halyard.models.attention.ragged_paged_pallas import PallasPagedKernel

CHUNK_KEYS = {"float32": 16, "bfloat16": None}
"""16 keys: two pages of 8 a chunk, so the 20-key row runs the online softmax over two chunks; None: one."""


@pytest.mark.parametrize("dtype_name", sorted(SETTINGS))
def test_the_token_kernel_matches_the_dense_reference(dtype_name) -> None:
    query_heads, kv_heads, window, cap = SETTINGS[dtype_name]
    step = ragged_step(jnp.dtype(dtype_name), query_heads, kv_heads)
    kernel = PallasPagedKernel(interpret=True, by_token="always", decode_chunk_keys=CHUNK_KEYS[dtype_name])
    output = run_kernel(kernel, step, jnp.dtype(dtype_name), sliding_window=window, logit_softcap=cap)
    reference = dense_reference(step, STEP_LAYER, sliding_window=window, logit_softcap=cap)
    np.testing.assert_allclose(output, reference, atol=tolerance(reference, dtype_name), rtol=0)
    real = int(step.cu_q_lens[int(step.num_seqs)])
    assert not output[real:].any(), "padding tokens' outputs must be 0"


@pytest.mark.parametrize("name", sorted(EMPTY_SEQUENCE_STEPS))
def test_steps_with_empty_sequences_wait_for_every_copy_they_start(name, capfd) -> None:
    """The steps that halted the chip with JAX's kernel (the engine's warm-up among them)."""
    step = empty_sequences_step(name)
    kernel = PallasPagedKernel(interpret=True, by_token="always")
    output = run_kernel(kernel, step, np.float32, sliding_window=None, logit_softcap=None)
    assert UNWAITED not in capfd.readouterr().out
    reference = dense_reference(step, STEP_LAYER, sliding_window=None, logit_softcap=None)
    np.testing.assert_allclose(output, reference, atol=tolerance(reference, "float32"), rtol=0)


def kernels_called(kernel: PallasPagedKernel, tokens: int, seqs: int) -> set[str]:
    """The Pallas kernels' names in ``attend``'s program for ``tokens`` tokens over ``seqs`` sequence slots."""
    pool = kernel.init_pool(1, 8, 8, 2, 64, jnp.float32)
    batch = (
        jnp.zeros((seqs, 2), jnp.int32),
        jnp.zeros((seqs + 1,), jnp.int32),
        jnp.zeros((seqs,), jnp.int32),
    )

    def attend(query: jax.Array, pool: object) -> jax.Array:
        step = kernel.prepare(pool, *batch, jnp.int32(0), tokens=tokens)
        return kernel.attend(
            query, pool, jnp.int32(0), step, scale=1.0, sliding_window=None, logit_softcap=None
        )

    program = jax.make_jaxpr(attend)(jnp.zeros((tokens, 4, 64), jnp.float32), pool)
    text = str(program)
    return {name for name in ("paged_decode_attention", "ragged_paged_attention_kernel") if name in text}


def test_decode_programs_get_the_token_kernel_and_others_jaxs() -> None:
    assert kernels_called(PallasPagedKernel(interpret=True), SEQS, SEQS) == {"paged_decode_attention"}
    assert kernels_called(PallasPagedKernel(interpret=True), TOKENS, SEQS) == {
        "ragged_paged_attention_kernel"
    }
    never = PallasPagedKernel(interpret=True, by_token="never")
    assert kernels_called(never, SEQS, SEQS) == {"ragged_paged_attention_kernel"}


def test_a_chunk_is_whole_pages_up_to_the_page_table() -> None:
    assert paged_decode_pallas.chunk_pages(1024, 256, 8) == 4
    assert paged_decode_pallas.chunk_pages(1024, 256, 3) == 3  # a shorter table: one chunk holds it
    assert paged_decode_pallas.chunk_pages(100, 256, 8) == 1  # at least a page


def test_unknown_choices_get_one_line_errors() -> None:
    with pytest.raises(ValueError, match="by_token must be one of"):
        PallasPagedKernel(by_token="sometimes")
    with pytest.raises(ValueError, match="decode_chunk_keys"):
        PallasPagedKernel(decode_chunk_keys=0)
