"""A Halyard model with the weights of a `transformers` model, through its family's Hugging Face spec.

For the parity tests of every family with an ``hf.py`` (`halyard.models.hf.HfFamily`)::

    from hf_weights import halyard_config, halyard_from_torch

    hf_model = transformers.LlamaForCausalLM(hf_config).eval()
    model = halyard_from_torch(hf_model)                      # the config read from hf_model.config
    model = halyard_from_torch(hf_model, scan_layers=False)   # Halyard config fields set on top
    model = halyard_from_torch(hf_model, config=config)       # or a config of your own (same shapes)
    config = halyard_config(hf_model.config)                  # the config alone

- The config is the spec's reader on ``hf_config.to_dict()`` (`HfFamily.config`: the reader
  `halyard.export` runs, without its key rule), so a test of the model also tests the reader.
- The weights are the tensors ``save_pretrained`` would write (transformers 5 keeps some fused in memory,
  e.g. Mixtral's experts; its own ``revert_weight_conversion`` splits them back), copied through the spec's
  `TensorMapping`s. Every parameter must find its tensor and every tensor its parameter (apart from the
  spec's buffers and a tied ``lm_head.weight`` equal to the embedding): a mapping that misses a tensor
  fails here, with the tensor's name, before any logits are compared.
- `halyard_from_state(state, config)` does the same from checkpoint-named tensors (numpy or torch).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from halyard.models import CausalLM, ModelConfig
from halyard.models.hf import HfFamily, TensorMapping, hf_families, hf_family
from halyard.named import NamedArray, is_named


def _spec_of(model_type: str) -> HfFamily:
    specs = {spec.model_type: spec for spec in hf_families().values()}
    if model_type not in specs:
        raise ValueError(f"no Halyard family has model_type {model_type!r}; registered: {sorted(specs)}")
    return specs[model_type]


def halyard_config(hf_config: Any, **overrides: Any) -> ModelConfig:
    """The Halyard config of a `transformers` config (``PretrainedConfig``), by its family's reader.

    Args:
        hf_config: e.g. ``transformers.LlamaConfig(...)`` or ``hf_model.config``.
        overrides: Halyard config fields set on top (``scan_layers=False``, ``full_attention_layers=0``...).
    """
    return _spec_of(hf_config.model_type).config(hf_config.to_dict(), **overrides)


def checkpoint_tensors(hf_model: Any) -> dict[str, np.ndarray]:
    """The float32 tensors of a `transformers` model under the names ``save_pretrained`` writes."""
    from transformers.core_model_loading import revert_weight_conversion

    state = revert_weight_conversion(hf_model, hf_model.state_dict())
    return {key: value.detach().cpu().float().numpy() for key, value in state.items()}


def halyard_from_torch(hf_model: Any, *, config: ModelConfig | None = None, **overrides: Any) -> CausalLM:
    """A Halyard model with ``hf_model``'s weights (see the module docstring).

    Args:
        hf_model: a `transformers` ``*ForCausalLM`` of a family with a Hugging Face spec.
        config: the Halyard config to build; default `halyard_config` of ``hf_model.config``.
        overrides: Halyard config fields set on top of either.
    """
    config = config if config is not None else halyard_config(hf_model.config)
    return halyard_from_state(
        checkpoint_tensors(hf_model), config.replace(**overrides) if overrides else config
    )


def _dotted(path: Any) -> str:
    parts = [getattr(entry, "name", getattr(entry, "key", getattr(entry, "idx", entry))) for entry in path]
    return ".".join(str(part) for part in parts)


def _slicer(tensor: np.ndarray) -> Callable[[tuple[slice, ...]], np.ndarray]:
    return lambda slices: tensor[slices]


def _read(
    mapping: TensorMapping, leaf: NamedArray, state: Mapping[str, np.ndarray], used: set[str]
) -> np.ndarray:
    sizes = {axis.name: axis.size for axis in leaf.axes}
    whole = [slice(None)] * len(mapping.target)
    stacked = [range(sizes[name]) for name in mapping.stacked]
    blocks = []
    for indices in itertools.product(*stacked):
        key = mapping.key(dict(zip(mapping.stacked, indices)))
        if key not in state:
            raise KeyError(f"the state has no tensor {key!r} (for Halyard parameter {mapping.path!r})")
        tensor = state[key]
        if tuple(tensor.shape) != mapping.hf_shape(sizes):
            raise ValueError(
                f"{key!r} has shape {tuple(tensor.shape)}; {mapping.path!r} implies {mapping.hf_shape(sizes)}"
            )
        used.add(key)
        blocks.append(mapping.read(_slicer(tensor), sizes, whole))
    return np.stack(blocks).reshape(leaf.array.shape) if mapping.stacked else blocks[0]


def halyard_from_state(state: Mapping[str, Any], config: ModelConfig) -> CausalLM:
    """A Halyard model of ``config`` whose parameters are ``state``'s tensors, through the family's spec.

    Args:
        state: checkpoint tensor name -> numpy array or torch tensor (as ``save_pretrained`` names them).
        config: the Halyard config (its shapes must be the state's).

    Raises:
        KeyError: a tensor a parameter needs is missing. ValueError: a tensor of another shape, or tensors
        no parameter takes (named).
    """
    arrays = {
        k: v if isinstance(v, np.ndarray) else v.detach().cpu().float().numpy() for k, v in state.items()
    }
    spec = hf_family(config)
    mappings = spec.checkpoint_mappings(config, arrays)
    by_path = {mapping.path: mapping for mapping in mappings}
    abstract = eqx.filter_eval_shape(config.init, jax.random.key(0))
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(abstract, is_leaf=is_named)
    used: set[str] = set()
    leaves = []
    for path, leaf in with_paths:
        name = _dotted(path)
        if not is_named(leaf) or name not in by_path:
            raise ValueError(f"Halyard parameter {name!r} has no mapping in the {spec.family} spec")
        array = _read(by_path.pop(name), leaf, arrays, used)
        leaves.append(NamedArray(jnp.asarray(array, leaf.array.dtype), leaf.axes))
    if by_path:
        raise ValueError(f"the {spec.family} spec maps parameters the model does not have: {sorted(by_path)}")
    embedding = next(m for m in mappings if m.path == "embed.weight").hf_key
    tied_head = spec.head_key in arrays and spec.head_key not in used
    if tied_head and np.array_equal(arrays[spec.head_key], arrays[embedding]):
        used.add(spec.head_key)
    unused = sorted(key for key in arrays if key not in used and not spec.is_buffer(key))
    if unused:
        raise ValueError(f"no Halyard parameter of {type(config).__name__} takes the tensor(s) {unused}")
    return jax.tree_util.tree_unflatten(treedef, leaves)
