"""The decoder's layer stack pipelined over the ``stage`` mesh axis: the loss and every parameter's
gradient equal the unpipelined model's (float32, to 1e-6), for 2 and 4 stages, repeats 1 and 2, with
FSDP, tensor and context parallelism inside the stages, a local/global layer pattern (Gemma 2) and MoE
layers whose router losses sum over microbatches and stages (Mixtral); the compiled
step passes activations between stages with collective permutes."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import assert_loss_and_grads_close, training_terms

from halyard.models import config_class
from halyard.models.batch import LmBatch
from halyard.models.decoder.pipeline import PipelineSchedule, layer_pattern_period
from halyard.shard import Layout, MeshSpec, use_layout

SHAPES = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2, max_position=64
)
FAMILIES = {
    "llama": dict(type="llama", num_layers=4),
    "llama8": dict(type="llama", num_layers=8),
    "gemma2": dict(type="gemma2", num_layers=4, head_dim=8, sliding_window=8, attn_logit_softcapping=5.0),
    "mixtral": dict(
        type="mixtral", num_layers=4, num_experts=4, num_experts_per_token=2, router_z_loss_coef=0.01
    ),
}


def model_config(family: str, **pipeline: int) -> Any:
    options = dict(FAMILIES[family])
    return config_class(options.pop("type"))(**SHAPES, **options, remat="none", **pipeline)


def batch() -> LmBatch:
    tokens = jax.random.randint(jax.random.PRNGKey(1), (8, 33), 0, 128)
    # packed documents whose boundaries differ per row: a microbatch must carry its own rows' segments
    segments = (jnp.arange(33)[None, :] >= jnp.arange(8)[:, None] * 3 + 5).astype(jnp.int32)
    return LmBatch.from_tokens(tokens, segments, None)


def loss_and_grads(config: Any) -> Any:
    model = config.init(jax.random.PRNGKey(0))
    return jax.jit(jax.value_and_grad(lambda m, b: m.loss(b)[0])), model


@functools.cache
def reference(family: str) -> Any:
    """The unpipelined model's loss and gradients for ``family``: computed once, for the families a worker's
    tests ask for (not all four for each worker that runs one of them)."""
    step, model = loss_and_grads(model_config(family))
    return step(model, batch())


@pytest.mark.parametrize(
    "family, mesh, layout, repeats, microbatches",
    [
        ("llama", dict(stage=2, data=4), "data_parallel", 1, 2),
        ("llama", dict(stage=4, data=2), "data_parallel", 1, 4),
        ("llama", dict(stage=2, data=1, fsdp=4), "fsdp", 2, 2),
        ("llama", dict(stage=2, data=1, fsdp=2, tensor=2), "fsdp_tensor", 1, 2),
        ("gemma2", dict(stage=2, data=4), "data_parallel", 1, 2),
        ("llama", dict(stage=2, sequence=2, data=2), "data_parallel", 1, 2),
        ("mixtral", dict(stage=2, data=4), "data_parallel", 2, 2),
        ("llama8", dict(stage=4, data=2), "data_parallel", 2, 4),
    ],
    ids=[
        "stage2",
        "stage4",
        "stage2_repeats2_fsdp4",
        "stage2_fsdp2_tensor2",
        "gemma2_pattern_stage2",
        "stage2_sequence2_context_parallel",
        "mixtral_router_losses_stage2_repeats2",
        "stage4_repeats2",
    ],
)
def test_pipelined_loss_and_gradients_equal_the_unpipelined(
    family: str, mesh: dict, layout: str, repeats: int, microbatches: int
) -> None:
    config = model_config(family, pipeline_repeats=repeats, pipeline_microbatches=microbatches)
    step, model = loss_and_grads(config)
    devices = MeshSpec(**mesh).build(jax.devices())
    with use_layout(Layout.preset(layout, min_shard=1), devices):
        compiled = step.lower(model, batch()).compile()  # one compile: the program inspected is the one run
        loss, grads = compiled(model, batch())
    assert "collective-permute" in compiled.as_text()
    reference_loss, reference_grads = reference(family)
    # microbatches and stages add the same terms in another order
    tokens = batch().tokens
    terms = training_terms(config, tokens.axis_size("batch"), tokens.axis_size("pos"))
    assert_loss_and_grads_close(
        (float(loss), [np.asarray(leaf) for leaf in jax.tree.leaves(grads)]),
        (float(reference_loss), [np.asarray(leaf) for leaf in jax.tree.leaves(reference_grads)]),
        terms,
    )


def test_a_microbatch_that_does_not_split_over_the_batch_devices_is_refused() -> None:
    step, model = loss_and_grads(model_config("llama", pipeline_microbatches=4))
    with (
        use_layout(
            Layout.preset("fsdp", min_shard=1), MeshSpec(stage=2, data=1, fsdp=4).build(jax.devices())
        ),
        pytest.raises(ValueError, match="a microbatch of 2 rows does not split over the 4 devices"),
    ):
        step(model, batch())


def test_the_schedule_says_what_cannot_run() -> None:
    schedule = PipelineSchedule(stages=4, repeats=2, microbatches=8)
    assert schedule.iterations == 2 * 8 + 3 and schedule.bubble == pytest.approx(3 / 19)
    assert schedule.problem(layers=16, batch=16) is None
    assert "do not cut into 4 stages x 2 repeats" in str(schedule.problem(layers=12, batch=16))
    assert "whole periods of the 4-layer pattern" in str(schedule.problem(layers=16, batch=16, period=4))
    assert "fewer than the 4 stages" in str(PipelineSchedule(4, 1, 2).problem(layers=8, batch=8))
    assert "does not cut into 8 microbatches" in str(schedule.problem(layers=16, batch=12))
    assert layer_pattern_period(None) == 1
    assert layer_pattern_period(["local", "global"] * 3) == 2
    assert layer_pattern_period(["a", "a", "b"]) == 3
