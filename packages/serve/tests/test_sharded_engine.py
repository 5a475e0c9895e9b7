"""The engine on a mesh: tensor parallel over 2 and 4 devices (heads, kv heads, MLP and vocabulary split;
the page pool split on kv heads) continues prompts with the single-device engine's tokens and log-probs."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from tiny_models import logprob_tolerance, tiny_model

from halyard.models import CausalLM
from halyard.serve import Engine, EngineConfig, Replicas, SamplingParams
from halyard.shard import Layout, MeshSpec

CONFIG = EngineConfig(
    page_size=8, num_pages=32, max_context=96, max_running=4, chunk_size=16, max_prefill_rows=2, min_rows=36
)
"""Every step in a program of the most tokens a step holds (4 + 2 x 16): one program per page bucket for
each engine and placement (and no row checks in deterministic mode), not one per token bucket too."""


@functools.cache
def _model() -> CausalLM:
    """The tests' model, built at the first call (not when a test worker collects the file)."""
    return tiny_model(
        "llama", hidden_size=64, num_heads=8, num_kv_heads=4, intermediate_size=128, vocab_size=64
    )


PROMPTS = [[5, 9, 2, 7, 1, 33, 60, 12], [3], list(range(1, 30))]
PARAMS = SamplingParams(max_tokens=8, temperature=0.8, seed=5, logprobs=True)


@pytest.mark.parametrize("tensor", [4])
def test_tensor_parallel_engine_equals_one_device(tensor: int) -> None:
    model = _model()
    alone = Engine(model, CONFIG).generate(PROMPTS, PARAMS)
    mesh = MeshSpec(data=1, tensor=tensor).build(jax.devices()[:tensor])
    layout = Layout.tensor_parallel(min_shard=1)
    placed = jax.device_put(model, layout.shardings(model, mesh))
    engine = Engine(placed, CONFIG, mesh=mesh, layout=layout)
    assert engine.runner.paged_kv.pool.keys.array.sharding.spec[2] == "tensor"  # kv heads split
    sharded = engine.generate(PROMPTS, PARAMS)
    assert engine.stats.steps_pipelined > 0  # step k+1 took step k's tokens on the devices
    for prompt, one, many in zip(PROMPTS, alone, sharded, strict=True):
        assert one.samples[0].token_ids == many.samples[0].token_ids
        # the sums split over the devices add their parts in another order
        atol = logprob_tolerance(model, [prompt + one.samples[0].token_ids])
        np.testing.assert_allclose(one.samples[0].logprobs, many.samples[0].logprobs, atol=atol, rtol=0)
    assert engine.pages.in_use == 0


def test_data_parallel_replicas_spread_requests_and_draw_what_one_engine_draws() -> None:
    model = _model()
    config = dataclasses.replace(CONFIG, deterministic=True)
    alone = Engine(model, config).generate(PROMPTS * 2, PARAMS)
    replicas = Replicas(model, 2, config, devices_per_replica=2)
    try:
        together = replicas.generate(PROMPTS * 2, PARAMS)
        assert all(engine.stats.requests_added == 3 for engine in replicas.engines)  # spread evenly
        for prompt, one, many in zip(PROMPTS * 2, alone, together, strict=True):
            assert one.samples[0].token_ids == many.samples[0].token_ids
            # each replica's 2 devices split the sums: the same terms added in another order
            atol = logprob_tolerance(model, [prompt + one.samples[0].token_ids])
            np.testing.assert_allclose(one.samples[0].logprobs, many.samples[0].logprobs, atol=atol, rtol=0)
        stats = replicas.stats
        assert stats.requests_finished == 6 and stats.pages_in_use == 0 and stats.pages_total == 64
        assert not replicas.has_work
    finally:
        replicas.close()
