"""`HfFamily`: everything Halyard knows about one family's Hugging Face checkpoints, kept in the family's
folder (``families/<name>/hf.py``) and registered with `register_hf`. `halyard.export` is a generic engine
over these specs: it never names a family.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Collection, Mapping
from typing import Any

from halyard.models.config import ModelConfig, config_class
from halyard.models.hf.errors import UnsupportedModelError
from halyard.models.hf.key_rule import KeyRule
from halyard.models.hf.tensor_mapping import TensorMapping

Reader = Callable[[Mapping[str, Any], set[str]], dict[str, Any]]
"""``(config.json with defaults filled in, used keys) -> Halyard config fields``; adds the keys it read to ``used``."""


@dataclasses.dataclass(frozen=True)
class HfFamily:
    """One family's Hugging Face counterpart.

    Attributes:
        family: the Halyard family name (`halyard.models.registered_models`).
        model_type, architecture: transformers' ``model_type`` and causal-LM class name.
        rule: which ``config.json`` keys are implemented, fixed or without effect (`KeyRule`).
        required: keys that fix the weights' shapes (a config.json without them is refused).
        defaults: transformers' values for keys a config.json may omit.
        read: the reader (see `Reader`); it may raise `UnsupportedModelError` for a value it cannot express.
        write: Halyard config -> the architecture's config.json keys (without the ids and dtype, which the
            engine adds); raises `UnsupportedModelError` for an option the architecture cannot express.
        mappings: Halyard config -> every parameter's `TensorMapping`.
        legacy_mappings: config -> other complete mapping lists that older checkpoints use (GPT-2's keys
            without the ``transformer.`` prefix), tried in order when a tensor of ``mappings`` is missing.
        buffers: tensor-name endings (after a dot) of constants that checkpoints may store next to the
            parameters (rotary ``inv_freq``, GPT-2's causal-mask ``attn.bias``); skipped on import.
        head_key: the output projection's tensor; when the mappings do not read it (tied embeddings), a
            stored copy is accepted only if it equals the tensor of ``embed.weight``.
    """

    family: str
    model_type: str
    architecture: str
    rule: KeyRule
    required: tuple[str, ...]
    defaults: Mapping[str, Any]
    read: Reader
    write: Callable[[Any], dict[str, Any]]
    mappings: Callable[[Any], list[TensorMapping]]
    legacy_mappings: Callable[[Any], list[list[TensorMapping]]] | None = None
    buffers: tuple[str, ...] = ("rotary_emb.inv_freq",)
    head_key: str = "lm_head.weight"

    def config(self, hf: Mapping[str, Any], *, used: set[str] | None = None, **overrides: Any) -> ModelConfig:
        """The Halyard config a ``config.json`` describes, by `read` (keys it omits mean `defaults`).

        No key is checked against `rule` here (`halyard.export` does that); this is the reader alone,
        e.g. for a `transformers` config's ``to_dict()`` in a parity test.

        Args:
            hf: the ``config.json`` keys (transformers' canonical spellings, not ``attribute_map`` aliases).
            used: collects the keys the reader read.
            overrides: Halyard config fields set on top (``scan_layers``, ``param_dtype``...).

        Raises:
            UnsupportedModelError: a value the reader cannot express.
            TypeError, ValueError: the config class rejects the fields (or an unknown override).
        """
        fields = self.read({**self.defaults, **hf}, used if used is not None else set())
        config = config_class(self.family)(**fields)
        return config.replace(**overrides) if overrides else config

    def checkpoint_mappings(self, config: Any, keys: Collection[str]) -> list[TensorMapping]:
        """The tensor layout of a checkpoint: the first of `mappings` and `legacy_mappings` whose tensors
        (at index 0 of each stacked axis) are all among ``keys``, else `mappings` (whose missing tensors the
        caller names).

        Args:
            config: the Halyard config.
            keys: the checkpoint's tensor names.
        """
        main = self.mappings(config)
        legacy = self.legacy_mappings(config) if self.legacy_mappings is not None else []
        for candidate in (main, *legacy):
            if all(mapping.key(dict.fromkeys(mapping.stacked, 0)) in keys for mapping in candidate):
                return candidate
        return main

    def is_buffer(self, key: str) -> bool:
        """Whether tensor ``key`` is one of `buffers` (a constant, not a parameter)."""
        return any(key == name or key.endswith("." + name) for name in self.buffers)


_SPECS: dict[str, HfFamily] = {}


def register_hf(spec: HfFamily) -> HfFamily:
    """Register ``spec`` under its family name (called at the end of each family's ``hf.py``).

    Raises:
        ValueError: the family already has another spec.
    """
    existing = _SPECS.get(spec.family)
    if existing is not None and existing is not spec:
        raise ValueError(f"Family {spec.family!r} already has a Hugging Face spec")
    _SPECS[spec.family] = spec
    return spec


def hf_families() -> dict[str, HfFamily]:
    """Every registered spec by Halyard family name."""
    return dict(_SPECS)


def hf_family(config_or_family: ModelConfig | str) -> HfFamily:
    """The spec of a family (by name or from a config).

    Raises:
        UnsupportedModelError: the family has no Hugging Face counterpart (e.g. ``mup``), naming the supported ones.
    """
    name = config_or_family if isinstance(config_or_family, str) else config_or_family.family
    if name not in _SPECS:
        close = difflib.get_close_matches(name, list(_SPECS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnsupportedModelError(
            f"Halyard family {name!r} has no Hugging Face architecture to convert to or from{hint}; "
            f"supported: {', '.join(sorted(_SPECS))}"
        )
    return _SPECS[name]
