"""The invariant step with FSDP-sharded weights: a Llama whose scanned layer stack gathers one layer's weights at
a time (bfloat16 compute, float32 weights) gives the same bits on 1 device, data 2, fsdp 2 and 8, and data 2 x
fsdp 4, and holds a layer's gathered weights, not the stack's."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

from halyard.models import model_config
from halyard.shard import Layout, MeshSpec, global_batch_from_local, use_layout
from halyard.train.invariant.slices import CanonicalSlices
from halyard.train.objectives.lm_loss import lm_loss_fn
from halyard.train.optim.config import AdamWConfig
from halyard.train.optim.schedule_config import ConstantScheduleConfig
from halyard.train.step import init_state, make_train_step

pytestmark = pytest.mark.slow

ROWS, SEQ_LEN, VOCAB = 16, 32, 256
FSDP = Layout.fsdp(min_shard=1)


def tiny_llama(num_layers: int = 2, hidden: int = 64, remat: str = "save_dots") -> Any:
    return model_config(
        "llama",
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        max_position=SEQ_LEN,
        compute_dtype="bfloat16",
        remat=remat,
    )


def adamw() -> Any:
    """Clipped-by-the-step AdamW at a constant learning rate (the invariant step clips, not optax)."""
    return AdamWConfig(schedule=ConstantScheduleConfig(warmup=0.0), max_grad_norm=None).build(total_steps=100)


def initial_state(config: Any) -> Any:
    """The step-0 state of ``config`` on one device, fetched to the host: each split starts from these bits.

    Initialised once per model config: each mesh then gets it by `jax.device_put` onto its shardings, instead
    of compiling its own sharded initialisation (a third of the file's compile time)."""
    key = repr(config)
    if key not in _INITIAL_STATES:
        init = jax.jit(lambda k: init_state(config.init(k), adamw(), k))
        _INITIAL_STATES[key] = jax.device_get(init(jax.random.PRNGKey(0)))
    return _INITIAL_STATES[key]


_INITIAL_STATES: dict[str, Any] = {}


def compiled_step(
    spec: MeshSpec, layout: Layout, config: Any, *, initialised: bool = True
) -> tuple[Any, Any, Any]:
    """``(compiled invariant step, state, batch)`` of ``config`` on ``spec``'s mesh, clipped AdamW.

    ``initialised``: the state is `initial_state` on the mesh; otherwise only its shapes and shardings (for a step
    that is compiled, not run)."""
    mesh = spec.build(jax.devices()[: spec.data * spec.fsdp])
    optimizer = adamw()
    abstract = jax.eval_shape(lambda k: init_state(config.init(k), optimizer, k), jax.random.PRNGKey(0))
    shardings = layout.shardings(abstract, mesh)
    if initialised:
        state = jax.device_put(initial_state(config), shardings)
    else:
        state = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
            abstract,
            shardings,
        )
    tokens = np.random.default_rng(0).integers(0, VOCAB, (ROWS, SEQ_LEN + 1)).astype(np.int32)
    batch = global_batch_from_local({"tokens": tokens}, mesh, layout=layout)
    split = CanonicalSlices(mesh, ROWS, max_grad_norm=0.5, layout=layout)
    step = jax.jit(
        make_train_step(lm_loss_fn(), optimizer, invariant=split),
        donate_argnums=0,
        out_shardings=(shardings, None),
    )
    with use_layout(layout, mesh):
        return step.lower(state, batch).compile(), state, batch


def run(
    spec: MeshSpec, layout: Layout, remat: str, steps: int = 3
) -> tuple[list[tuple[float, ...]], list[bytes]]:
    """The logged (loss, gradient, parameter and update norms) of ``steps`` steps, and the final parameters."""
    step, state, batch = compiled_step(spec, layout, tiny_llama(remat=remat))
    logged = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        logged.append(
            tuple(float(metrics[name]) for name in ("loss", "grad_norm", "param_norm", "update_norm"))
        )
    return logged, [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(jax.device_get(state.params))]


SPLITS = {
    "data 2": (MeshSpec(data=2), Layout.data_parallel()),
    "fsdp 2": (MeshSpec(data=1, fsdp=2), FSDP),
    "fsdp 8": (MeshSpec(data=1, fsdp=8), FSDP),
    "data 2 x fsdp 4": (MeshSpec(data=2, fsdp=4), FSDP),
}


@pytest.mark.parametrize(
    ("remat", "splits"),
    [("save_dots", list(SPLITS)), ("none", ["fsdp 8"])],
    ids=["save_dots", "none"],  # remat none: the backward pass gathers each layer again all the same
)
def test_fsdp_with_per_layer_gathers_gives_the_same_bits_on_every_split(
    remat: str, splits: list[str]
) -> None:
    reference, params = run(MeshSpec(data=1), Layout.data_parallel(), remat)
    assert all(row[1] > 0.5 for row in reference)  # clipping acts
    for spec, layout in (SPLITS[name] for name in splits):
        logged, other = run(spec, layout, remat)
        assert logged == reference, (spec, remat)
        assert other == params, (spec, remat)


def test_a_deeper_stack_adds_less_than_a_layer_of_gathered_weights() -> None:
    # With the stack gathered whole every layer adds its gathered weights, its whole gradient and the partial
    # sums of it to a device's temporaries (13.2 MB a layer here, 5.6 layers' weights); gathered layer by
    # layer it adds its shards' gradient and its activations (1.4 MB).
    spec = MeshSpec(data=1, fsdp=8)
    temps = {
        layers: compiled_step(spec, FSDP, tiny_llama(layers, hidden=256), initialised=False)[0]
        .memory_analysis()
        .temp_size_in_bytes
        for layers in (2, 6)
    }
    layer_bytes = 4 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512)  # float32 attention and MLP weights
    assert (temps[6] - temps[2]) / 4 < layer_bytes, temps
