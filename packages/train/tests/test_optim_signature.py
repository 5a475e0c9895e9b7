"""Each optimizer's hyperparameters are written once: its config's fields are the YAML keys, the keywords of
its function and of the direction it configures, with the defaults in the config alone; and the optimizers
import without the config library."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from halyard.train.optim import optimizers
from halyard.train.optim.config import AdamWConfig, LionConfig, MuonConfig, OptimizerConfig, SophiaHConfig
from halyard.train.optim.muon import scale_by_muon_or_adam
from halyard.train.optim.sophia import scale_by_sophia_h

FUNCTIONS = {AdamWConfig: optimizers.adamw, LionConfig: optimizers.lion, SophiaHConfig: optimizers.sophia_h}
FUNCTIONS[MuonConfig] = optimizers.muon
DIRECTIONS = {SophiaHConfig: scale_by_sophia_h, MuonConfig: scale_by_muon_or_adam}


def own_fields(config: type[OptimizerConfig]) -> set[str]:
    shared = {f.name for f in dataclasses.fields(OptimizerConfig)}
    return {f.name for f in dataclasses.fields(config)} - shared


@pytest.mark.parametrize("config", list(DIRECTIONS))
def test_a_direction_takes_the_config_fields_by_name_without_defaults_of_its_own(config: type) -> None:
    parameters = inspect.signature(DIRECTIONS[config]).parameters
    hyperparameters = {name: p for name, p in parameters.items() if name != "labels"}
    assert set(hyperparameters) == own_fields(config)
    assert all(p.default is inspect.Parameter.empty for p in hyperparameters.values())


@pytest.mark.parametrize("config", list(FUNCTIONS))
def test_a_function_repeats_no_hyperparameter_and_equals_its_config(config: type) -> None:
    function = FUNCTIONS[config]
    named = set(inspect.signature(function).parameters)
    assert named == {"learning_rate", "lr_multipliers", "decay_mask", "settings"}
    settings = {"weight_decay": 0.3, "max_grad_norm": 0.5}
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    grads = {"w": jnp.full((2, 3), 0.25), "b": jnp.full(3, -0.5)}
    loss_fn = lambda p: jnp.sum(p["w"] ** 2) + jnp.sum(p["b"] ** 2)
    updates = []
    for optimizer in (function(0.01, **settings), config(**settings).transformation(0.01)):
        state = optimizer.init(params)
        update, _ = optimizer.update(grads, state, params, loss_fn=loss_fn)
        updates.append(update)
    for name in params:
        np.testing.assert_array_equal(updates[0][name], updates[1][name])
    assert float(optax.tree.norm(updates[0])) > 0
    with pytest.raises(TypeError, match="unexpected keyword"):
        function(0.01, b1=0.9)  # the old spelling is refused, not ignored


def test_the_optimizers_import_and_build_without_the_config_library() -> None:
    code = (
        "import sys; sys.modules['draccus'] = None\n"
        "from halyard.train.optim.optimizers import adamw\n"
        "from halyard.train.optim.config import AdamWConfig\n"
        "AdamWConfig().build(total_steps=10); adamw(1e-3)\n"
        "assert 'halyard.train.trainer.trainer' not in sys.modules\n"
        "print('ok')"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert completed.returncode == 0 and completed.stdout.strip() == "ok", completed.stderr[-2000:]
