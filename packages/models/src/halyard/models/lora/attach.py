"""Adding, reading, removing and merging the adapters of a whole model.

A model's adapters are a dict ``{target name: LoraAdapter}`` (``{"q_proj": ..., "v_proj": ...}``), one
adapter per target holding every layer's (stacked on ``layers``, as the block's weights are). A LoRA
model is the base model with each targeted `Linear` replaced by a `LoraLinear`; training keeps the base
and the adapters apart (only the adapters are differentiated and saved) and joins them with `with_lora`.

    adapters = init_lora(model, LoraConfig(rank=8, target_modules=("q_proj", "v_proj")), key=key)
    lora_model = with_lora(model, adapters)      # or add_lora(model, config, key=key)
    merged = merge_lora(lora_model)              # a plain model computing the same function
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax

from halyard.models.lora.adapter import LoraAdapter
from halyard.models.lora.config import TARGET_MODULES, LoraConfig
from halyard.models.lora.linear import LoraLinear
from halyard.named.nn import Linear

BLOCK_PATH = "layers.stacked"
"""Where the stacked decoder block sits in a `Decoder` (`TARGET_MODULES` are paths inside it)."""

Adapters = dict[str, LoraAdapter]
"""A model's adapters by target name (``"q_proj"``)."""


def module_path(name: str) -> str:
    """The dotted path of target ``name`` in a `Decoder` (``"layers.stacked.attention.q_proj"``)."""
    return f"{BLOCK_PATH}.{TARGET_MODULES[name]}"


def _get(tree: Any, path: str) -> Any:
    for part in path.split("."):
        tree = getattr(tree, part, None)
    return tree


def _set(tree: Any, path: str, value: Any) -> Any:
    def where(node: Any) -> Any:
        return _get(node, path)

    return eqx.tree_at(where, tree, value)


def lora_targets(model: Any) -> tuple[str, ...]:
    """The target names (`TARGET_MODULES` order) that are linear layers in ``model``'s block."""
    return tuple(name for name in TARGET_MODULES if isinstance(_get(model, module_path(name)), Linear))


def check_targets(model: Any, names: tuple[str, ...]) -> None:
    """Raise ValueError naming the first of ``names`` that is no linear layer of ``model``, listing the valid ones."""
    valid = lora_targets(model)
    for name in names:
        if name not in valid:
            family = getattr(getattr(model, "model_config", None), "family", type(model).__name__)
            raise ValueError(
                f"lora.target_modules: {name!r} is not a linear layer of a {family} model; valid: "
                f"{', '.join(valid)}"
            )


def init_lora(model: Any, config: LoraConfig, *, key: jax.Array) -> Adapters:
    """Fresh adapters (A random, B zero) for the ``config.target_modules`` of ``model``.

    Args:
        model: a `Decoder` (concrete or abstract: only shapes and dtypes are read).
        config: rank, alpha, dropout and targets.
        key: PRNG key; each target draws from ``fold_in(key, its index in TARGET_MODULES)``, so the
            order of ``target_modules`` does not matter.

    Raises:
        ValueError: LoRA is off (``rank`` 0), or a target is not a linear layer of this model.
    """
    if not config.enabled:
        raise ValueError("lora.rank is 0: set a positive rank to add adapters")
    check_targets(model, config.target_modules)
    names = list(TARGET_MODULES)
    return {
        name: LoraAdapter.init(
            _get(model, module_path(name)),
            rank=config.rank,
            alpha=config.alpha,
            dropout=config.dropout,
            key=jax.random.fold_in(key, names.index(name)),
        )
        for name in config.target_modules
    }


def with_lora(model: Any, adapters: Mapping[str, LoraAdapter]) -> Any:
    """``model`` with each target of ``adapters`` a `LoraLinear` holding its adapter (the base untouched).

    Raises:
        ValueError: a target is not a linear layer of ``model``.
    """
    check_targets(model, tuple(adapters))
    for name, adapter in adapters.items():
        path = module_path(name)
        linear = _get(model, path)
        base = linear.base() if isinstance(linear, LoraLinear) else linear
        model = _set(model, path, LoraLinear.wrap(base, adapter))
    return model


def add_lora(model: Any, config: LoraConfig, *, key: jax.Array) -> Any:
    """``with_lora(model, init_lora(model, config, key=key))``: the model with fresh adapters."""
    return with_lora(model, init_lora(model, config, key=key))


def lora_params(model: Any) -> Adapters:
    """The adapters of a LoRA model by target name (empty for a model without any)."""
    found: Adapters = {}
    for name in TARGET_MODULES:
        module = _get(model, module_path(name))
        if isinstance(module, LoraLinear) and module.adapter is not None:
            found[name] = module.adapter
    return found


def _replace_lora_linears(model: Any, replace: Any) -> Any:
    for name in TARGET_MODULES:
        path = module_path(name)
        module = _get(model, path)
        if isinstance(module, LoraLinear):
            model = _set(model, path, replace(module))
    return model


def without_lora(model: Any) -> Any:
    """The base model: every `LoraLinear` back to its plain `Linear` (the adapters dropped)."""
    return _replace_lora_linears(model, LoraLinear.base)


def merge_lora(model: Any) -> Any:
    """A plain model computing what the LoRA model computes (without dropout): each adapted weight becomes
    ``W + A · B * alpha / rank``. Works on sharded models (the product is computed where W lives)."""
    return _replace_lora_linears(model, LoraLinear.merged)


def with_dropout_keys(adapters: Mapping[str, LoraAdapter], key: jax.Array) -> Adapters:
    """``adapters`` with dropout keys drawn from ``key`` (one per target and stacked layer); adapters without
    dropout are returned as they are. The same key gives the same masks."""
    names = list(TARGET_MODULES)
    return {
        name: adapter.with_dropout_key(jax.random.fold_in(key, names.index(name)))
        for name, adapter in adapters.items()
    }
