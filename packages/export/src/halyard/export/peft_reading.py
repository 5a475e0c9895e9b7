"""`read_peft_adapter`: a PEFT LoRA adapter folder (adapter_config.json and adapter_model.safetensors) as
Halyard adapters (``{"q_proj": LoraAdapter, ...}``) for a given base model, the reverse of
`halyard.export.peft_adapter.export_peft_adapter` (the same tensor names and layouts).

The targets are the tensors the file holds (whatever ``target_modules`` said: a list or a regular
expression); rsLoRA's scale ``alpha / sqrt(r)`` is kept (as an ``alpha`` of ``alpha * sqrt(r)``). What a
Halyard adapter cannot compute is refused in one line naming the key: DoRA, per-module ranks or alphas
(``rank_pattern``, ``alpha_pattern``), adapted biases, ``modules_to_save``, some layers only
(``layers_to_transform``), Conv1D's ``fan_in_fan_out``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jax
import numpy as np
from safetensors import safe_open

from halyard.export.errors import (
    MissingHfFileError,
    ShapeMismatchError,
    UnexpectedWeightError,
    UnsupportedModelError,
)
from halyard.export.importer import _block_reader
from halyard.export.peft_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_mappings
from halyard.export.plan import expected_tensors, leaf_plans, named_leaves
from halyard.export.sources import WeightSource
from halyard.models import CausalLM
from halyard.models.hf import UnsupportedModelError as _Unsupported
from halyard.models.lora import Adapters, LoraConfig, init_lora, lora_targets
from halyard.named import NamedArray

_REFUSED: dict[str, tuple[Any, str]] = {
    "use_dora": (
        False,
        "DoRA adapters are not LoRA: merge it with peft (merge_and_unload) and serve the merged folder",
    ),
    "rank_pattern": (
        {},
        "per-module ranks are not supported; merge it with peft and serve the merged folder",
    ),
    "alpha_pattern": (
        {},
        "per-module alphas are not supported; merge it with peft and serve the merged folder",
    ),
    "bias": ("none", "adapted biases are not supported; merge it with peft and serve the merged folder"),
    "modules_to_save": (
        None,
        "fully trained modules are not adapters; merge it with peft and serve the merged folder",
    ),
    "layers_to_transform": (None, "adapters on some layers only are not supported; merge it with peft"),
    "fan_in_fan_out": (False, "Conv1D (GPT-2) adapters are not supported; merge it with peft"),
}
"""adapter_config.json keys whose non-neutral values are refused: (the neutral value, the fix)."""


def read_peft_adapter(model: CausalLM, folder: str | Path) -> Adapters:
    """The adapters of the PEFT LoRA folder ``folder``, shaped for ``model`` (its base).

    Raises:
        MissingHfFileError: no adapter_config.json or adapter_model.safetensors.
        UnsupportedModelError: not a LoRA adapter, or a setting Halyard cannot compute (named).
        ShapeMismatchError: a tensor whose shape does not fit ``model`` at the adapter's rank.
        UnexpectedWeightError: a tensor that adapts no projection Halyard can adapt.
    """
    folder = Path(folder)
    config_path, weights_path = folder / ADAPTER_CONFIG, folder / ADAPTER_WEIGHTS
    for path in (config_path, weights_path):
        if not path.is_file():
            raise MissingHfFileError(
                f"{path} does not exist: a PEFT adapter folder holds {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} "
                "(what save_pretrained writes)"
            )
    config = json.loads(config_path.read_text())
    _check_config(config, config_path)
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    if config.get("use_rslora"):
        alpha *= math.sqrt(rank)  # rsLoRA scales by alpha / sqrt(r); a LoraAdapter by alpha / r
    source = _AdapterFile(weights_path)
    present = set(source.keys())
    targets = tuple(name for name in lora_targets(model) if _holds(model, name, rank, alpha, present))
    if not targets:
        raise UnexpectedWeightError(
            f"{weights_path} adapts none of the projections Halyard can adapt in a {model.model_config.family} "
            f"model ({', '.join(lora_targets(model))}); its tensors: {sorted(present)[:4]}"
        )
    shapes = jax.eval_shape(
        lambda: init_lora(model, LoraConfig(rank, alpha, 0.0, targets), key=jax.random.key(0))
    )
    plans = leaf_plans(shapes, adapter_mappings(model, shapes), int(model.model_config.vocab_size))
    expected = expected_tensors(plans)
    extra = sorted(present - set(expected))
    if extra:
        raise UnexpectedWeightError(
            f"{weights_path} holds {len(extra)} tensor(s) Halyard has no place for, e.g. {extra[0]!r}: "
            "only lora_A / lora_B of the decoder's projections are served; merge it with peft instead"
        )
    for key, shape in expected.items():
        if source.shape(key) != shape:
            raise ShapeMismatchError(
                f"{weights_path}: {key!r} has shape {source.shape(key)}, but a rank-{rank} adapter of the served "
                f"model needs {shape}: the adapter was trained on another base (or adapter_config.json's r is wrong)"
            )
    leaves, treedef = named_leaves(shapes)
    dtype = np.dtype(model.unembedding.dtype)
    arrays = [
        NamedArray(_block_reader(plan, source, dtype)(None), leaf.axes)
        for (_, leaf), plan in zip(leaves, plans, strict=True)
    ]
    adapters: Adapters = jax.tree_util.tree_unflatten(treedef, arrays)
    return jax.device_put(adapters)


def _check_config(config: dict[str, Any], where: Path) -> None:
    if config.get("peft_type") != "LORA":
        raise UnsupportedModelError(
            f"{where}: peft_type is {config.get('peft_type')!r}; only LORA adapters are served"
        )
    for key in ("r", "lora_alpha"):
        if not isinstance(config.get(key), int | float) or config[key] <= 0:
            raise UnsupportedModelError(
                f"{where}: {key} is {config.get(key)!r}; it must be a positive number"
            )
    for key, (neutral, fix) in _REFUSED.items():
        value = config.get(key, neutral)
        if value != neutral and not (neutral in ({}, None) and not value):
            raise UnsupportedModelError(f"{where}: {key} is {value!r}: {fix}")


def _holds(model: CausalLM, name: str, rank: int, alpha: float, present: set[str]) -> bool:
    """Whether the file holds any tensor of target ``name``'s adapter."""
    try:
        shapes = jax.eval_shape(
            lambda: init_lora(model, LoraConfig(rank, alpha, 0.0, (name,)), key=jax.random.key(0))
        )
        mappings = adapter_mappings(model, shapes)
    except _Unsupported:
        return False
    return any(
        key in present
        for key in expected_tensors(leaf_plans(shapes, mappings, int(model.model_config.vocab_size)))
    )


class _AdapterFile(WeightSource):
    """adapter_model.safetensors as a `WeightSource`."""

    def __init__(self, path: Path) -> None:
        self.description = str(path)
        self._file = safe_open(str(path), framework="np")

    def keys(self) -> list[str]:
        return list(self._file.keys())

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._file.get_slice(key).get_shape())

    def read(self, key: str, slices: tuple[slice, ...]) -> np.ndarray:
        return np.asarray(self._file.get_slice(key)[slices])

    def file_of(self, key: str) -> str:
        return self.description
