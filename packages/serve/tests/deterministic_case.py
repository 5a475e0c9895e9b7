"""The request and the model of the deterministic-mode tests (test_deterministic.py and the script it runs in
a process of its own, training_forward_check.py)."""

from __future__ import annotations

import functools

import jax
import numpy as np
from tiny_models import tiny_model

from halyard.models import CausalLM
from halyard.named import named
from halyard.named.nn import batch_invariant, row_log_softmax
from halyard.serve import EngineConfig, SampleOutput, SamplingParams

VOCAB = 1024


@functools.cache
def model() -> CausalLM:
    """The tests' model (built at the first call, not when a test worker collects the file), wide enough that
    XLA's CPU matmuls round a row differently at different row counts (at width 64 they do not, and no test
    could fail): `test_fast_mode_agrees_to_rounding_but_not_bitwise` checks that."""
    return tiny_model(
        "llama", hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512, vocab_size=VOCAB
    )


TARGET_PROMPT = [int(t) for t in np.random.default_rng(0).integers(0, VOCAB, 100)]
TARGET = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, seed=1234, logprobs=True)


def config(
    chunk_size: int,
    num_pages: int = 160,
    decode_rows: int = 32,
    training_arithmetic: bool = False,
    prefill_rows: int = 4,
    min_rows: int = 1,
) -> EngineConfig:
    """A deterministic engine of pages of 64 (the training kernel's block) for `model`: ``chunk_size``,
    ``num_pages``, ``decode_rows``, ``training_arithmetic``, ``prefill_rows`` and ``min_rows`` are
    `EngineConfig`'s ``chunk_size``, ``num_pages``, ``deterministic_rows``, ``training_arithmetic``,
    ``max_prefill_rows`` and ``min_rows``."""
    return EngineConfig(
        page_size=64, num_pages=num_pages, max_context=256, max_running=64, chunk_size=chunk_size,
        max_prefill_rows=prefill_rows, min_rows=min_rows, deterministic=True, deterministic_rows=decode_rows,
        training_arithmetic=training_arithmetic,
    )  # fmt: skip


def others_ending_with_the_target(seed: int) -> list[tuple[list[int], SamplingParams]]:
    """20 other requests for the target at position 7 of an engine that prefills one chunk of 64 a step: prompts
    of one chunk (the target's takes two), so request i draws its first token at step i (i + 2 after the
    target) and, here, its last with the target's last, at step 31. Every step then runs a program of 128
    tokens (a chunk and the decoding rows), or of 32 after the last chunk (all 21 decoding): few programs to
    compile, where a crowd of other lengths makes one for every count of rows as its requests end."""
    rng = np.random.default_rng(seed)
    return [
        (
            [int(t) for t in rng.integers(0, VOCAB, 64)],
            SamplingParams(
                max_tokens=32 - (i if i < 7 else i + 2),
                temperature=float(rng.uniform(0, 1.5)),
                top_k=int(rng.integers(0, 50)),
            ),
        )
        for i in range(20)
    ]


@jax.jit
def _invariant_logprobs(tokens: jax.Array) -> jax.Array:
    with batch_invariant():
        logits = model()(named(tokens, ("batch", "pos"))).unwrap("batch", "pos", "vocab")
        return row_log_softmax(logits)


def invariant_forward_difference(sample: SampleOutput) -> float:
    """The largest |``sample``'s log-probs - the training forward pass's inside `batch_invariant`| over
    `TARGET_PROMPT` followed by ``sample``'s tokens."""
    sequence = TARGET_PROMPT + sample.token_ids
    padded = np.asarray([sequence + [0] * (192 - len(sequence))], np.int32)  # whole 64-token blocks
    table = np.asarray(_invariant_logprobs(padded))[0]
    training = [table[len(TARGET_PROMPT) - 1 + i, token] for i, token in enumerate(sample.token_ids)]
    return float(np.abs(np.float32(training) - np.float32(sample.logprobs)).max())
